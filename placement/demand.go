package placement

import (
	"math"
	"sort"
)

// Sample is one sample as demand placement sees it.
type Sample struct {
	Key  string
	Size int64
	// Reads counts, by member index (Members order), how often that
	// member's ranks will read the sample over the planned epochs.
	Reads []uint32
}

// Assign returns a table that places samples by demand, as NoPFS does:
// each goes to the member whose ranks read it most, unless that member's
// quota is full, then to the next reader, then to the member that ranks
// it highest by hash with room. Every other key keeps its hashed owner.
//
// A member's quota is its proportional share of the samples' bytes plus a
// tenth, and never more than its capacity: demand moves samples towards
// their readers without piling the cluster's load onto one node.
//
// Samples are taken most-read first (ties by hash), so when quotas bind
// it is the rarely read samples that go elsewhere. The result depends
// only on the members and the set of samples, not on their order: every
// node computes the same table from the same gossip.
func (t *Table) Assign(samples []Sample) *Table {
	out := &Table{members: t.members, weights: t.weights, assigned: make(map[string]int32), print: t.print, seeds: t.seeds, uniform: t.uniform, buckets: t.buckets}
	if len(samples) == 0 {
		return out
	}
	type item struct {
		s    *Sample
		most uint32
		hash uint64
	}
	items := make([]item, 0, len(samples))
	var total, capSum float64
	for i := range samples {
		s := &samples[i]
		var most uint32
		for _, r := range s.Reads {
			most = max(most, r)
		}
		items = append(items, item{s, most, fnv64a("", s.Key)})
		total += float64(s.Size)
	}
	for _, w := range t.weights {
		capSum += w
	}
	quota := make([]float64, len(t.members))
	used := make([]float64, len(t.members))
	for i, w := range t.weights {
		quota[i] = math.Min(w, w/capSum*total*1.1)
	}
	sort.Slice(items, func(i, j int) bool {
		a, b := items[i], items[j]
		if a.most != b.most {
			return a.most > b.most
		}
		if a.hash != b.hash {
			return a.hash < b.hash
		}
		return a.s.Key < b.s.Key
	})
	readers := make([]int, 0, len(t.members))
	for _, it := range items {
		s, size := it.s, float64(it.s.Size)
		owner := -1
		// The readers, most reads first; ties to the hashed order.
		readers = readers[:0]
		for m, r := range s.Reads {
			if r > 0 && m < len(t.members) {
				readers = append(readers, m)
			}
		}
		sort.Slice(readers, func(i, j int) bool {
			a, b := readers[i], readers[j]
			if s.Reads[a] != s.Reads[b] {
				return s.Reads[a] > s.Reads[b]
			}
			return t.score(a, s.Key) > t.score(b, s.Key)
		})
		for _, m := range readers {
			if used[m]+size <= quota[m] {
				owner = m
				break
			}
		}
		if owner < 0 {
			owner = t.ownerWithRoom(s.Key, size, used, quota)
		}
		used[owner] += size
		if owner != t.hashOwner(s.Key) {
			out.assigned[s.Key] = int32(owner)
			// Order-free, so that it needs no sort: a sum of one hash per
			// assignment.
			out.print += mix(fnv64a(s.Key, "") ^ uint64(owner))
		}
	}
	return out
}

// ownerWithRoom returns the member with room for size bytes that scores key
// highest, or the hashed owner when none has room.
func (t *Table) ownerWithRoom(key string, size float64, used, quota []float64) int {
	best, bestScore := t.hashOwner(key), math.Inf(-1)
	for i := range t.members {
		if used[i]+size > quota[i] {
			continue
		}
		if sc := t.score(i, key); sc > bestScore {
			best, bestScore = i, sc
		}
	}
	return best
}
