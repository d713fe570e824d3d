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

// planned is what a Prefetcher publishes: its streams, and the ranks
// other nodes run (Config.AllRanks) with this node's ranks of their job.
type planned struct {
	streams []*stream
	others  []otherRank
}

// otherRank is a rank another node runs. It is never consumed here: it
// counts with the cursor of this node's furthest-behind rank of its job.
type otherRank struct {
	s     *stream
	local []*stream // this node's ranks of the same job
}

// publish makes streams, and others (ranks of other nodes), what NextUse
// answers from.
func (o *Oracle) publish(streams, others []*stream) {
	set := &planned{streams: streams}
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
// the same job. It takes no lock.
func (o *Oracle) NextUse(ino uint64) int64 {
	best := int64(math.MaxInt64)
	set := o.set.Load()
	if set == nil {
		return best
	}
	for _, s := range set.streams {
		cursor := int(s.at.Load())
		if q := s.pendingFrom(ino, cursor); q >= 0 {
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
