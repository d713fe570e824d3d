package prefetch

import (
	"math"
	"sync/atomic"
)

// Oracle tells the RAM and SSD tiers how soon the plans need a file. It
// answers from the streams its Prefetcher publishes whenever they change,
// without a lock: a stream's order does not change once built, its
// consumed bits are atomic and its cursor is published (stream.at). So
// the RAM tier may ask it many times per eviction, under its own lock,
// without waiting on the scheduler or a plan change.
//
// Make one before the tiers, hand its NextUse to them, and give it to the
// Prefetcher (Config.Oracle), which publishes to it. The zero Oracle
// knows no plan. It is safe for concurrent use; one Oracle serves one
// Prefetcher.
type Oracle struct {
	set atomic.Pointer[planned]
}

// planned is what a Prefetcher publishes: its streams, the ranks other
// nodes run (Config.AllRanks) with this node's ranks of their job, and its
// stage (which knows what was pushed).
type planned struct {
	streams []*stream
	others  []otherRank
	stage   *Stage
}

// otherRank is a rank another node runs. It is never consumed here: it
// counts with the cursor of this node's furthest-behind rank of its job.
type otherRank struct {
	s     *stream
	local []*stream // this node's ranks of the same job
}

// publish makes streams, and others (ranks of other nodes), what NextUse
// answers from; stage says what was pushed.
func (o *Oracle) publish(streams, others []*stream, stage *Stage) {
	set := &planned{streams: streams, stage: stage}
	for _, r := range others {
		or := otherRank{s: r}
		for _, s := range streams {
			if s.id.job == r.id.job {
				or.local = append(or.local, s)
			}
		}
		set.others = append(set.others, or)
	}
	o.set.Store(set)
}

// NextUse is how many positions ahead of its stream's cursor file ino is
// next needed; math.MaxInt64 if no plan has it. Ranks of other nodes
// (AllRanks) count with the cursor of this node's furthest-behind rank of
// the same job. A file pushed into the page cache is next needed by dlfs
// after the read the push serves: a copy RAM keeps of it is a spare until
// then, and must not take the place of a neighbour a coalesced run read
// ahead (which the PFS would serve again: an HDF5 file's rows read
// 1.004-1.013x with pushed files counted at their pushed read, 1.003-1.006x
// without). It takes no lock but the stage's, briefly, for a pushed file.
func (o *Oracle) NextUse(ino uint64) int64 {
	best := int64(math.MaxInt64)
	set := o.set.Load()
	if set == nil {
		return best
	}
	pushed := set.stage != nil && set.stage.wasPushed(ino)
	for _, s := range set.streams {
		cursor := int(s.at.Load())
		q := s.pendingFrom(ino, cursor)
		if pushed && q >= 0 {
			q = s.pendingFrom(ino, q+1) // the push serves the read at q
		}
		if q >= 0 {
			best = min(best, int64(q-cursor))
		}
	}
	for _, r := range set.others {
		cursor := -1
		for _, s := range r.local {
			if c := int(s.at.Load()); cursor < 0 || c < cursor {
				cursor = c
			}
		}
		if cursor < 0 {
			continue
		}
		if q := r.s.pendingFrom(ino, cursor); q >= 0 {
			best = min(best, int64(q-cursor))
		}
	}
	return best
}
