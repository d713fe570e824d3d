package owners

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/placement"
)

// ownership counts the samples and bytes placement gives each alive member.
// It is recomputed in the background when the view or the catalog changes.
// The files and bytes in each placement bucket are counted once per
// catalog snapshot; a new table then costs a pass over the buckets and
// the keys demand assigned, not a hash of every file.
type ownership struct {
	counted atomic.Pointer[counted] // the last counts; nil before the first

	snap    *catalog.Snapshot // the snapshot buckets counts (the watcher's only)
	buckets [][2]int64        // files and bytes per placement bucket
	moved   [2]int64          // the watcher's: samples that changed owner at the last table change, and in all
	keys    *catalog.Snapshot // the snapshot the last table's demand keys were indexed from; nil: not known
}

// counted is one computation of the counts. It never changes once stored.
type counted struct {
	counts map[string][2]int64 // member -> {samples, bytes}
	plan   PlacementStats
}

// PlacementStats tells how placement follows the jobs' plans.
type PlacementStats struct {
	Mode string `json:"mode"` // "demand" or "hash"
	// Table is the placement table's fingerprint: nodes that show the
	// same one give every sample the same owner.
	Table   string `json:"table,omitempty"`
	Members int    `json:"members"` // alive members of this dataset it places on
	// MovedSamples is how many samples changed owner when the table last
	// changed (a member joined or left, or the jobs moved them), and
	// MovedTotal over the node's life.
	MovedSamples int64 `json:"moved_samples"`
	MovedTotal   int64 `json:"moved_total"`
	// PlannedSamples is how many samples the gossiped jobs read over the
	// placement window; PlannedReads their reads, and LocalReads the
	// share of those a node makes of a sample it owns.
	PlannedSamples int     `json:"planned_samples"`
	PlannedReads   int64   `json:"planned_reads"`
	LocalReads     float64 `json:"local_reads"`
}

func (o *ownership) placementStats() PlacementStats {
	if c := o.counted.Load(); c != nil {
		return c.plan
	}
	return PlacementStats{}
}

// planStats measures t against the planned reads d: Assign counted them
// as it placed them, and a table by hash places them here.
func planStats(mode string, t *placement.Table, d []placement.Sample) PlacementStats {
	ps := PlacementStats{Mode: mode, PlannedSamples: len(d)}
	local := int64(0)
	if ps.PlannedReads, local = t.Planned(); ps.PlannedReads == 0 {
		for _, s := range d {
			o := t.Owner(s.Key)
			for m, r := range s.Reads {
				ps.PlannedReads += int64(r)
				if m == o {
					local += int64(r)
				}
			}
		}
	}
	if ps.PlannedReads > 0 {
		ps.LocalReads = float64(local) / float64(ps.PlannedReads)
	}
	return ps
}

func (o *ownership) get(name string) (samples, bytes int64) {
	if c := o.counted.Load(); c != nil {
		n := c.counts[name]
		return n[0], n[1]
	}
	return 0, 0
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

// compute places every regular file of snap with t; prev, if not nil, is
// the table t replaces. keys is the snapshot t's demand samples were
// indexed from (nil: not known): when it is snap, every key t assigns is
// a regular file of snap, of the size t keeps, and is counted without a
// catalog lookup.
func (o *ownership) compute(snap *catalog.Snapshot, t, prev *placement.Table, keys *catalog.Snapshot, plan PlacementStats) {
	counts := map[string][2]int64{}
	if t != nil {
		if o.snap != snap {
			o.snap, o.buckets = snap, make([][2]int64, placement.Buckets)
			snap.Walk(func(e *catalog.Entry) {
				if e.IsRegular() {
					c := &o.buckets[placement.Bucket(e.Path())]
					c[0]++
					c[1] = catalog.AddSize(c[1], e.Size)
				}
			})
		}
		ms := t.Members()
		per := make([][2]int64, len(ms))
		for b, c := range o.buckets {
			m := &per[t.BucketOwner(b)]
			m[0] += c[0]
			m[1] = catalog.AddSize(m[1], c[1])
		}
		t.Assigned(func(key string, a placement.Assignment) {
			size, ok := a.Size, keys == snap
			if !ok {
				if e := snap.Lookup(key); e != nil && e.IsRegular() {
					size, ok = e.Size, true
				}
			}
			if ok {
				from := &per[t.BucketOwner(a.Bucket)]
				from[0]--
				from[1] -= size
				per[a.Owner][0]++
				per[a.Owner][1] = catalog.AddSize(per[a.Owner][1], size)
			}
		})
		for i, m := range ms {
			counts[m.Name] = per[i]
		}
		if prev != nil {
			o.moved[0] = o.movedFrom(snap, prev, t, o.keys, keys)
			o.moved[1] += o.moved[0]
		}
	}
	o.keys = keys
	plan.MovedSamples, plan.MovedTotal = o.moved[0], o.moved[1]
	o.counted.Store(&counted{counts, plan})
}

// movedFrom counts the regular files of snap whose owner differs between
// tables a and b: bucket by bucket, then the keys either assigns by
// demand, which do not follow their bucket. Owners are compared by name:
// the tables number their members each in its own way. aKeys and bKeys
// are the snapshots the tables' demand keys were indexed from: a key of
// a table indexed from snap is one of its regular files, and needs no
// lookup; the others are looked up. It allocates nothing per key.
func (o *ownership) movedFrom(snap *catalog.Snapshot, a, b *placement.Table, aKeys, bKeys *catalog.Snapshot) int64 {
	// asB[i] is a's member i as b numbers it, or -1.
	am, bm := a.Members(), b.Members()
	asB := make([]int, len(am))
	for i, m := range am {
		asB[i] = -1
		if j, ok := slices.BinarySearchFunc(bm, m.Name, func(x placement.Member, name string) int { return strings.Compare(x.Name, name) }); ok {
			asB[i] = j // both sorted by name
		}
	}
	bucketMoved := func(k int) bool { return asB[a.BucketOwner(k)] != b.BucketOwner(k) }
	var moved int64
	for k, c := range o.buckets {
		if bucketMoved(k) {
			moved += c[0]
		}
	}
	placement.AssignedDiff(a, b, func(key string, bucket, aOwner, bOwner int, inA, inB bool) {
		if !(inA && aKeys == snap || inB && bKeys == snap) {
			if e := snap.Lookup(key); e == nil || !e.IsRegular() {
				return
			}
		}
		if bucketMoved(bucket) {
			moved-- // counted with its bucket above
		}
		if asB[aOwner] != bOwner {
			moved++
		}
	})
	return moved
}

// sameDataset splits members into those that gossip this node's dataset
// identity, which placement may give shares, and the names of the others:
// their blocks would fail every tag check, so asking them is wasted.
func sameDataset(dataset string, members []cluster.Member) (same []cluster.Member, foreign []string) {
	for _, m := range members {
		if m.Meta.Dataset == dataset && m.Meta.Placement == placement.HashVersion {
			same = append(same, m)
		} else {
			foreign = append(foreign, m.Name)
		}
	}
	return same, foreign
}

// watch rebuilds the placement table and the ownership counts on every
// change of the view or the catalog, until Close.
func (o *Owners) watch(changes <-chan struct{}) {
	defer o.wg.Done()
	others := -1 // members of another dataset, last logged
	for {
		o.rebuild(&others)
		select {
		case <-o.stop:
			return
		case <-changes:
		case <-o.refreshed:
		}
	}
}

// rebuild makes the view of the membership and catalog of the moment and
// stores it, then the ownership counts: one table change. others is the
// count of members of another dataset last logged. Only the watcher calls
// it.
func (o *Owners) rebuild(others *int) {
	alive, foreign := sameDataset(o.cfg.Dataset, o.d.Cluster.Alive())
	if len(foreign) != *others {
		*others = len(foreign)
		if *others > 0 {
			o.log.Warn("cluster: members serve another dataset; they get no share of this one", "members", foreign, "dataset", o.cfg.Dataset)
		}
	}
	t, err := placeAlive(alive)
	if err != nil {
		t, alive = nil, nil // no alive member yet: every read goes to the PFS
	}
	mode, plan := "hash", PlacementStats{Mode: "hash"}
	if !o.cfg.HashPlacement {
		mode = "demand"
	}
	// The snapshot the demand is indexed from, if the catalog does not
	// change meanwhile: the ownership counts then trust its keys.
	keys := o.d.Snapshot()
	if t != nil {
		d := o.demand(alive)
		if o.stopping() {
			return // Close waits for the watcher: the node leaves the cluster after it
		}
		if mode == "demand" && len(d) > 0 {
			t = t.Assign(d)
		}
		plan = planStats(mode, t, d)
		plan.Table, plan.Members = fmt.Sprintf("%016x", t.Fingerprint()), len(alive)
	}
	// Where a sample was before this node took it: the table over the
	// others, by hash (a node that joins takes exactly what hashing
	// gives it from them).
	var rest []cluster.Member
	for _, m := range alive {
		if m.Name != o.cfg.NodeName {
			rest = append(rest, m)
		}
	}
	tOthers, err := placeAlive(rest)
	if err != nil {
		tOthers, rest = nil, nil
	}
	// Only this goroutine stores views: the one loaded is the last.
	cur := o.view.Load()
	v := &View{table: t, members: alive, prev: cur.prev, prevMembers: cur.prevMembers, others: tOthers, othersMembers: rest}
	var replaced *placement.Table
	if cur.table != nil && !cur.table.Equal(t) {
		v.prev, v.prevMembers = cur.table, cur.members
		replaced = cur.table
	}
	o.view.Store(v)
	// balance= plans not yet pinned follow the new layout (which also
	// takes the ranks from the members' gossiped job lines).
	o.d.Jobs.Relayout()
	snap := o.d.Snapshot()
	if snap != keys {
		keys = nil // changed under the demand: its keys are looked up (CatalogChanged rebuilds again)
	}
	o.own.compute(snap, t, replaced, keys, plan) // places every bucket: after the plans
}

// stopping reports whether Close has begun.
func (o *Owners) stopping() bool {
	select {
	case <-o.stop:
		return true
	default:
		return false
	}
}

// Placement tells how placement follows the jobs' plans.
func (o *Owners) Placement() PlacementStats { return o.own.placementStats() }

// Owned returns the samples and bytes placement gives the member called
// name (0 for a member it does not place on).
func (o *Owners) Owned(name string) (samples, bytes int64) { return o.own.get(name) }

// View is the placement of a moment: the table over the alive members of
// this dataset, the table before its last change, the table over the
// other members, and the balance= layouts computed from them. Its tables
// never change once it is stored; its layouts only fill. Safe for
// concurrent use.
type View struct {
	table   *placement.Table // nil before the first table
	members []cluster.Member // the table's member i is members[i]
	// The table before the last change, and its members: a sample's
	// previous owner may still cache it.
	prev        *placement.Table
	prevMembers []cluster.Member
	// Placement over the other alive members, by hash: who owned what
	// this node owns before it joined.
	others        *placement.Table
	othersMembers []cluster.Member
	// layouts are the balance= layouts computed from table, by job name
	// (one per name: a replaced job is let go). A new map replaces the
	// old one on each addition.
	layouts atomic.Pointer[map[string]jobLayout]
}

// View returns the placement of the moment. It never returns nil.
func (o *Owners) View() *View { return o.view.Load() }

// Table is the placement table; nil before the first.
func (v *View) Table() *placement.Table { return v.table }

// Members are the table's members: its member i is Members()[i].
func (v *View) Members() []cluster.Member { return v.members }

// Others is the table over the other members, by hash; nil when there
// is no other.
func (v *View) Others() *placement.Table { return v.others }

// OwnerName names the member the table gives path to; "" without a
// table.
func (v *View) OwnerName(path string) string {
	if v.table == nil {
		return ""
	}
	return v.members[v.table.Owner(path)].Name
}
