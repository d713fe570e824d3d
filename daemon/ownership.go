package daemon

import (
	"sync"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/placement"
)

// ownership counts the samples and bytes placement gives each alive member.
// It is recomputed in the background when the view or the catalog changes,
// since it hashes every file once per member.
type ownership struct {
	mu     sync.Mutex
	counts map[string][2]int64 // mu guards counts: member -> {samples, bytes}
}

func (o *ownership) get(name string) (samples, bytes int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.counts[name]
	return c[0], c[1]
}

// placeAlive returns the placement table of the alive members.
// placement orders its members by name, as cluster.Alive does, so the
// table's member i is alive[i].
func placeAlive(alive []cluster.Member) (*placement.Table, error) {
	ms := make([]placement.Member, len(alive))
	for i, m := range alive {
		ms[i] = placement.Member{Name: m.Name, Capacity: max(m.Meta.RAM+m.Meta.SSD, 1)}
	}
	return placement.New(ms)
}

// compute places every regular file of snap with t.
func (o *ownership) compute(snap *catalog.Snapshot, t *placement.Table) {
	counts := map[string][2]int64{}
	if t != nil {
		snap.Walk(func(e *catalog.Entry) {
			if e.IsRegular() {
				name := t.Members()[t.Owner(e.Path)].Name
				c := counts[name]
				counts[name] = [2]int64{c[0] + 1, c[1] + e.Size}
			}
		})
	}
	o.mu.Lock()
	o.counts = counts
	o.mu.Unlock()
}

// watchOwnership rebuilds the placement table and the ownership counts on
// every change of the view or the catalog, until stop closes. It is owned
// by the Node, which closes stop in Close.
func (n *Node) watchOwnership(changes <-chan struct{}, stop <-chan struct{}) {
	defer n.wg.Done()
	for {
		alive := n.cl.Alive()
		t, err := placeAlive(alive)
		if err != nil {
			t, alive = nil, nil // no alive member yet: every read goes to the PFS
		}
		n.tableMu.Lock()
		n.placement, n.placed = t, alive
		n.tableMu.Unlock()
		n.own.compute(n.cat.Snapshot(), t)
		select {
		case <-stop:
			return
		case <-changes:
		case <-n.refreshed:
		}
	}
}
