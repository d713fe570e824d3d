package owners

import (
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"slices"
	"sort"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
	"github.com/dlfs/dlfs/jobs"
	"github.com/dlfs/dlfs/placement"
)

// Demand placement (NoPFS): every node gossips the jobs it runs ranks of,
// each as a job line whose epoch is the first one this node announced.
// From the alive members' lines every node computes the same demand: how
// often each member's ranks read each sample over PlacementEpochs epochs
// from the job's first epoch, and placement puts each sample on its most
// frequent reader (placement.Table.Assign).
//
// The window starts at a job's first epoch and does not move with it:
// moving it would move samples between nodes every epoch, and every
// move is a sample read from the PFS again.

// advertiseJobs gossips this node's jobs whenever they change, until
// Close.
func (o *Owners) advertiseJobs(changes <-chan struct{}) {
	defer o.wg.Done()
	first := map[string]int{} // job identity -> first epoch announced
	var last []string
	for {
		lines := jobLines(o.d.Jobs.All(), first)
		if !slices.Equal(lines, last) {
			m := o.meta
			m.Jobs = lines
			for len(m.Jobs) > 0 {
				if _, err := m.Encode(); err == nil {
					break
				}
				m.Jobs = m.Jobs[:len(m.Jobs)-1] // too many for gossip metadata: keep the first, by name
			}
			if len(m.Jobs) < len(lines) {
				o.log.Warn("cluster: too many jobs to gossip; placement ignores the rest", "gossiped", len(m.Jobs), "jobs", len(lines))
			}
			if err := o.d.Cluster.SetMeta(m); err != nil {
				o.log.Warn("cluster: gossiping jobs failed", "err", err)
			}
			last = lines
		}
		select {
		case <-o.stop:
			return
		case <-changes:
		}
	}
}

// jobLines returns the gossip lines of jobs: each job's spec with the
// first epoch it was announced at, which first remembers across calls
// (and forgets for jobs that ended).
func jobLines(all []*jobs.Job, first map[string]int) []string {
	var lines []string
	seen := map[string]bool{}
	for _, j := range all {
		id := j.Spec.Identity()
		seen[id] = true
		epoch := j.Spec.Epoch
		for _, e := range j.RankEpoch {
			epoch = min(epoch, e)
		}
		if e, ok := first[id]; !ok || epoch < e {
			first[id] = epoch
		}
		spec := j.Spec
		spec.Epoch = first[id]
		lines = append(lines, spec.Line())
	}
	for id := range first {
		if !seen[id] {
			delete(first, id) // ended: a new run of it starts a new window
		}
	}
	return lines
}

// demand returns the planned reads of every sample any alive member's job
// reads, by member index (alive order, which is placement's). Lines that
// do not parse (cluster.Meta.Specs leaves them out) or whose dataset this
// node cannot index are skipped: they come from a peer whose view
// differs, and hashing still places those samples.
func (o *Owners) demand(alive []cluster.Member) []placement.Sample {
	type group struct {
		spec  control.Job
		ranks []int // rank -> member index; -1: no alive member runs it
	}
	groups := map[string]*group{}
	for mi, m := range alive {
		for _, spec := range m.Meta.Specs { // parsed and checked on arrival
			id := spec.Identity()
			g := groups[id]
			if g == nil {
				g = &group{spec: spec, ranks: make([]int, spec.World)}
				for r := range g.ranks {
					g.ranks[r] = -1
				}
				groups[id] = g
			}
			g.spec.Epoch = min(g.spec.Epoch, spec.Epoch)
			for _, r := range spec.Ranks {
				if r < len(g.ranks) && g.ranks[r] < 0 { // alive is sorted: the first name wins a rank two claim
					g.ranks[r] = mi
				}
			}
		}
	}
	ids := make([]string, 0, len(groups))
	for id := range groups {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	// The cost is per sample and per read, millions of each: a job's
	// reads are counted by sample index, in one array, then given to its
	// samples; a sample is found by its entry's inode number, and its
	// path made once.
	snap := o.d.Snapshot()
	o.paths.of(snap)
	defer o.rankReads.sweep()
	// The last change's arrays are used again: nothing keeps a demand
	// past the table change that made it.
	out := o.lastDemand.samples[:0]
	firstReads := o.lastDemand.reads
	var at sampleIndex
	stride := len(alive)
	for _, id := range ids {
		g := groups[id]
		samples, err := o.d.Jobs.Index(g.spec)
		if err != nil {
			o.log.Debug("placement: cannot index a gossiped job", "job", g.spec.Name, "err", err)
			continue
		}
		if p := jobs.Positions(g.spec, len(samples), true) / int64(g.spec.Lookahead) * int64(o.cfg.PlacementEpochs); p > o.d.Jobs.MaxPositions() {
			o.log.Debug("placement: a gossiped job reads too many positions to count", "job", g.spec.Name, "positions", p)
			continue
		}
		var reads []uint32 // sample i's reads by member: reads[i*stride:][:stride]
		if len(out) == 0 && cap(firstReads) >= len(samples)*stride {
			reads = firstReads[:len(samples)*stride]
			clear(reads)
		} else {
			reads = make([]uint32, len(samples)*stride)
		}
		if len(out) == 0 {
			firstReads = reads
		}
		if rr := o.rankReads.get(g.spec, len(samples), o.cfg.PlacementEpochs); rr != nil {
			for i := range samples {
				for _, rank := range rr.ranks[rr.start[i]:rr.start[i+1]] {
					if int(rank) < len(g.ranks) {
						if mi := g.ranks[rank]; mi >= 0 {
							reads[i*stride+mi]++
						}
					}
				}
			}
		} else {
			jobs.Reads(g.spec, len(samples), g.spec.Epoch, o.cfg.PlacementEpochs, func(rank, i int) {
				if rank < len(g.ranks) {
					if mi := g.ranks[rank]; mi >= 0 {
						reads[i*stride+mi]++
					}
				}
			})
		}
		// The first job's counts become its samples' (no copy); a later
		// job's new samples copy theirs out of its array, which then goes.
		first := len(out) == 0
		if first {
			out = slices.Grow(out, len(samples))
		}
		at.fit(samples)
		var fresh []uint32 // a later job's new samples' counts, cut from one array
		for i, s := range samples {
			if s.Entry == nil {
				continue // a symlink to nothing in the dataset: nothing to place
			}
			row := reads[i*stride : (i+1)*stride : (i+1)*stride]
			if k, ok := at.get(s.Entry); ok {
				for m, r := range row {
					out[k].Reads[m] += r
				}
				continue
			}
			if !first {
				if len(fresh) < stride {
					fresh = make([]uint32, stride*min(len(samples)-i, 1<<16))
				}
				copy(fresh, row)
				row, fresh = fresh[:stride:stride], fresh[stride:]
			}
			at.set(s.Entry, len(out))
			out = append(out, placement.Sample{Key: o.paths.path(s.Entry), Size: s.Entry.Size, Reads: row})
		}
	}
	o.lastDemand.samples, o.lastDemand.reads = out, firstReads
	return out
}

// pathCache keeps the paths of one snapshot's files by inode number,
// each made once (an Entry holds no path: Path builds one): a table
// change at a million files makes none, and the tables made from one
// snapshot share their keys' bytes, so that comparing two keys of them
// compares two pointers. The watcher's only.
type pathCache struct {
	snap  *catalog.Snapshot
	byIno []string // by inode number; "": not made yet
	limit uint64   // entries with inode numbers from limit on are not kept
}

// of empties the cache if the snapshot is another.
func (c *pathCache) of(snap *catalog.Snapshot) {
	if c.snap == snap {
		return
	}
	// The catalog numbers entries densely: up to a few times their count.
	c.snap, c.byIno, c.limit = snap, nil, 4*uint64(snap.Files+snap.Dirs)+1<<20
}

// path is e's path.
func (c *pathCache) path(e *catalog.Entry) string {
	if e.Ino >= c.limit {
		return e.Path()
	}
	if e.Ino >= uint64(len(c.byIno)) {
		c.byIno = slices.Grow(c.byIno, int(e.Ino)+1-len(c.byIno))[:e.Ino+1]
	}
	p := c.byIno[e.Ino]
	if p == "" {
		p = e.Path()
		c.byIno[e.Ino] = p
	}
	return p
}

// sampleIndex finds a demand sample by its entry's inode number (unique
// in a snapshot, which every index of one demand comes from): in an
// array while the numbers are dense, as the catalog gives them, else in
// a map.
type sampleIndex struct {
	dense []int32 // inode number -> index+1; 0: none
	m     map[uint64]int
}

// fit makes room for samples' entries.
func (x *sampleIndex) fit(samples []folder.Sample) {
	if x.m != nil {
		return
	}
	var top uint64
	for _, s := range samples {
		if s.Entry != nil {
			top = max(top, s.Entry.Ino)
		}
	}
	switch {
	case top < uint64(len(x.dense)):
	case top < 4*uint64(len(samples))+1<<20 && top < math.MaxInt32:
		x.dense = append(x.dense, make([]int32, int(top)+1-len(x.dense))...)
	default:
		x.m = make(map[uint64]int, len(samples))
		for ino, k := range x.dense {
			if k > 0 {
				x.m[uint64(ino)] = int(k - 1)
			}
		}
		x.dense = nil
	}
}

func (x *sampleIndex) get(e *catalog.Entry) (int, bool) {
	if x.m != nil {
		k, ok := x.m[e.Ino]
		return k, ok
	}
	k := x.dense[e.Ino]
	return int(k - 1), k > 0
}

func (x *sampleIndex) set(e *catalog.Entry, k int) {
	if x.m != nil {
		x.m[e.Ino] = k
		return
	}
	x.dense[e.Ino] = int32(k + 1)
}

// Layout is where job j's ranks run and its samples are cached, as this
// node's placement table says now (jobs.Config.Layout); jobs asks it for
// each plan under balance= until the plan is pinned. A rank no alive member
// gossips is on no node (-1).
func (o *Owners) Layout(j *jobs.Job) jobs.Layout {
	v := o.view.Load()
	if v.table == nil {
		// Before the first table nothing is known of where the ranks
		// run, and no plan may be pinned yet.
		unknown := make([]int, j.Spec.World)
		for r := range unknown {
			unknown[r] = -1
		}
		return jobs.Layout{RankNode: unknown, Owner: func(int) int { return -1 }}
	}
	// A rebuild of the prefetch streams asks once per rank and epoch:
	// answer from the last computation while the view (replaced on every
	// change of the membership) and the job are the same.
	if m := v.layouts.Load(); m != nil {
		if c, ok := (*m)[j.Spec.Name]; ok && c.job == j {
			return c.layout
		}
	}
	l := o.computeLayout(j, v.table, v.members)
	v.keepLayout(jobLayout{j, l})
	return l
}

// keepLayout adds c to the view's layouts, replacing the one of its job's
// name. Two computations of one layout give the same; either is kept.
func (v *View) keepLayout(c jobLayout) {
	for {
		old := v.layouts.Load()
		m := map[string]jobLayout{}
		if old != nil {
			maps.Copy(m, *old)
		}
		m[c.job.Spec.Name] = c
		if v.layouts.CompareAndSwap(old, &m) {
			return
		}
	}
}

// jobLayout is a job's layout under the table of the moment.
type jobLayout struct {
	job    *jobs.Job
	layout jobs.Layout
}

// computeLayout is layout from placement table t over members placed.
func (o *Owners) computeLayout(j *jobs.Job, t *placement.Table, placed []cluster.Member) jobs.Layout {
	id := j.Spec.Identity()
	rankNode := make([]int, j.Spec.World)
	for r := range rankNode {
		rankNode[r] = -1
	}
	// Every rank's node comes from the job lines in the table's members,
	// this node's own included: a local rank counts only once this node's
	// line is in the table, so the demand placed by the table includes it.
	// (Taken from the local job instead, a rank was known before the
	// table had this node's line, and the two nodes of a pair could pin
	// plans under different tables.)
	var capacity int64
	for mi, m := range placed {
		capacity += m.Meta.RAM + m.Meta.SSD
		for _, spec := range m.Meta.Specs {
			if spec.Identity() != id {
				continue
			}
			for _, r := range spec.Ranks {
				if r < len(rankNode) && rankNode[r] < 0 {
					rankNode[r] = mi
				}
			}
		}
	}
	cached := j.N()
	if snap := o.d.Snapshot(); snap.Files > 0 && snap.Bytes > 0 {
		cached = int(min(int64(j.N()), capacity/max(snap.Bytes/int64(snap.Files), 1)))
	}
	// The ID is the layout's content, the same on every node that sees the
	// same members, placement and ranks.
	h := fnv.New64a()
	fmt.Fprint(h, t.Fingerprint(), rankNode, cached)
	for _, m := range placed {
		fmt.Fprint(h, " ", m.Name)
	}
	return jobs.Layout{RankNode: rankNode, Cached: cached, ID: h.Sum64(), Owner: func(i int) int {
		if e := j.Samples[i].Entry; e != nil {
			return t.Owner(e.Path())
		}
		return -1
	}}
}
