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

// compute places every regular file of snap over the alive members.
func (o *ownership) compute(snap *catalog.Snapshot, alive []cluster.Member) {
	ms := make([]placement.Member, 0, len(alive))
	for _, m := range alive {
		ms = append(ms, placement.Member{Name: m.Name, Capacity: max(m.Meta.RAM+m.Meta.SSD, 1)})
	}
	counts := map[string][2]int64{}
	if t, err := placement.New(ms); err == nil {
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

// watchOwnership recomputes ownership on every change of the view until
// stop closes. It is owned by the Node, which closes stop in Close.
func (n *Node) watchOwnership(changes <-chan struct{}, stop <-chan struct{}) {
	defer n.wg.Done()
	for {
		n.tableMu.Lock()
		n.tableDirty = true // the owner table follows the view
		n.tableMu.Unlock()
		n.own.compute(n.cat.Snapshot(), n.cl.Alive())
		select {
		case <-stop:
			return
		case <-changes:
		case <-n.refreshed:
		}
	}
}
