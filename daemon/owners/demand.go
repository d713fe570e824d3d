package owners

import (
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"sort"

	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/control"
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
		ranks map[int]int // rank -> member index
	}
	groups := map[string]*group{}
	for mi, m := range alive {
		for _, spec := range m.Meta.Specs { // parsed and checked on arrival
			id := spec.Identity()
			g := groups[id]
			if g == nil {
				g = &group{spec: spec, ranks: map[int]int{}}
				groups[id] = g
			}
			g.spec.Epoch = min(g.spec.Epoch, spec.Epoch)
			for _, r := range spec.Ranks {
				if _, taken := g.ranks[r]; !taken { // alive is sorted: the first name wins a rank two claim
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
	var out []placement.Sample
	at := map[string]int{} // path -> index in out
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
		slot := make([]int, len(samples)) // sample index -> index in out
		for i, s := range samples {
			if s.Entry == nil {
				slot[i] = -1 // a symlink to nothing in the dataset: nothing to place
				continue
			}
			p := s.Entry.Path()
			k, ok := at[p]
			if !ok {
				k = len(out)
				at[p] = k
				out = append(out, placement.Sample{Key: p, Size: s.Entry.Size, Reads: make([]uint32, len(alive))})
			}
			slot[i] = k
		}
		jobs.Reads(g.spec, len(samples), g.spec.Epoch, o.cfg.PlacementEpochs, func(rank, i int) {
			if mi, ok := g.ranks[rank]; ok && slot[i] >= 0 {
				out[slot[i]].Reads[mi]++
			}
		})
	}
	return out
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
