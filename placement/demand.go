package placement

import (
	"cmp"
	"math"
	"slices"
	"strings"
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
	out := &Table{members: t.members, weights: t.weights, print: t.print, seeds: t.seeds, uniform: t.uniform, buckets: t.buckets}
	if len(samples) == 0 {
		return out
	}
	// The cost is per sample, millions of them, and mostly in cache
	// misses: each key is hashed once (the hash gives its bucket, its
	// scores and its index slot), and what placing a sample needs is
	// read from it in one pass, into its item; the passes after touch
	// the items only, except for a sample whose first reader is full.
	// Nothing is allocated per sample.
	type item struct {
		key   string
		hash  uint64 // fnv64a("", key)
		size  int64
		reads uint64 // all its reads
		idx   int32  // in samples
		first int32  // its first reader (see reader.before); -1: none
		most  uint32 // its most reads by one member
		local uint32 // reads by first
	}
	if len(samples) > math.MaxInt32 {
		samples = samples[:math.MaxInt32] // not placed by demand: hashing places them
	}
	// Items are made in the samples' order, each sample read once, in
	// order; then put in key order (hash, then key), the order the table
	// keeps its assignments in: scattered by the hash's top byte into 256
	// runs, each then sorted where it fits in cache. (Sorting indexes and
	// then gathering the samples by them read the samples in random
	// order: two cache and TLB misses a sample, 15 CPU-s at 10 M.)
	made := make([]item, len(samples))
	var start [257]int // start[d+1]: items whose hash's top byte is at most d
	for i := range samples {
		s, it := &samples[i], &made[i]
		*it = item{key: s.Key, hash: fnv64a("", s.Key), size: s.Size, idx: int32(i), first: -1}
		var best reader
		for m, r := range s.Reads {
			it.most = max(it.most, r)
			it.reads += uint64(r)
			if r > 0 && m < len(t.members) {
				if c := (reader{m, r, t.order(m, it.hash)}); it.first < 0 || c.before(best) {
					best, it.first, it.local = c, int32(m), r
				}
			}
		}
		start[it.hash>>56+1]++
	}
	for d := 1; d < len(start); d++ {
		start[d] += start[d-1]
	}
	items := make([]item, len(made))
	next := start
	for i := range made {
		d := made[i].hash >> 56
		items[next[d]] = made[i]
		next[d]++
	}
	made = nil
	var total, capSum float64
	for d := 0; d < 256; d++ {
		slices.SortFunc(items[start[d]:start[d+1]], func(a, b item) int {
			if a.hash != b.hash {
				return cmp.Compare(a.hash, b.hash)
			}
			return strings.Compare(a.key, b.key)
		})
	}
	for i := range items {
		total += float64(items[i].size) // in key order: the same sum on every node
	}
	for _, w := range t.weights {
		capSum += w
	}
	quota := make([]float64, len(t.members))
	used := make([]float64, len(t.members))
	for i, w := range t.weights {
		quota[i] = math.Min(w, w/capSum*total*1.1)
	}
	var most uint32
	for i := range items {
		most = max(most, items[i].most)
	}
	order := make([]int32, len(items))
	if most < 1<<16 {
		at := make([]int, most+2) // at[most-m+1]: how many items read more than m times
		for i := range items {
			at[most-items[i].most+1]++
		}
		for i := 1; i < len(at); i++ {
			at[i] += at[i-1]
		}
		for i := range items {
			g := most - items[i].most
			order[at[g]] = int32(i)
			at[g]++
		}
	} else { // a crafted plan: read 65,536 times or more
		for i := range order {
			order[i] = int32(i)
		}
		slices.SortStableFunc(order, func(a, b int32) int { return cmp.Compare(items[b].most, items[a].most) })
	}
	owners := make([]int32, len(items))
	var reads, local uint64
	readers := make([]reader, 0, len(t.members))
	for _, i := range order {
		it := &items[i]
		size := float64(it.size)
		owner := -1
		reads += it.reads
		if f := it.first; f >= 0 && used[f]+size <= quota[f] {
			owner = int(f)
			local += uint64(it.local)
		} else if f >= 0 {
			// The readers, most reads first; ties to the hashed order.
			// There are few: an insertion sort.
			s := &samples[it.idx]
			readers = readers[:0]
			for m, r := range s.Reads {
				if r > 0 && m < len(t.members) {
					readers = append(readers, reader{m, r, t.order(m, it.hash)})
					for j := len(readers) - 1; j > 0 && readers[j].before(readers[j-1]); j-- {
						readers[j], readers[j-1] = readers[j-1], readers[j]
					}
				}
			}
			for _, r := range readers[1:] {
				if used[r.m]+size <= quota[r.m] {
					owner = r.m
					local += uint64(r.reads)
					break
				}
			}
		}
		if owner < 0 {
			owner = t.ownerWithRoom(it.hash, size, used, quota)
			if s := &samples[it.idx]; owner < len(s.Reads) {
				local += uint64(s.Reads[owner])
			}
		}
		used[owner] += size
		owners[i] = int32(owner)
	}
	// Most samples leave their bucket's owner (all but 1/N of them, with
	// N members and balanced demand): room for all of them at once.
	moved := make([]assigned, 0, len(items))
	for i := range items {
		it := &items[i]
		if owner := owners[i]; int(owner) != t.BucketOwner(bucketOf(it.hash)) {
			moved = append(moved, assigned{key: it.key, hash: it.hash, size: it.size, owner: owner})
			// Order-free: a sum of one hash per assignment.
			out.print += mix(it.hash ^ uint64(owner))
		}
	}
	out.demand = newDemandIndex(moved)
	out.planned = [2]int64{int64(min(reads, math.MaxInt64)), int64(min(local, math.MaxInt64))}
	return out
}

// Planned returns the reads of the samples Assign placed, and how many of
// them are by the member it placed each on (0, 0 for a table Assign did
// not make).
func (t *Table) Planned() (reads, local int64) { return t.planned[0], t.planned[1] }

// order is member i's rendezvous score for the key whose hash is kh, or,
// where every weight is equal, a number in the same order without the
// logarithm (as rendezvous compares them).
func (t *Table) order(i int, kh uint64) float64 {
	if t.uniform {
		return float64(mix(t.seeds[i]^kh) >> 11)
	}
	return t.scoreHash(i, kh)
}

// reader is a member that reads a sample: its reads and its score for
// the sample's key (order).
type reader struct {
	m     int
	reads uint32
	score float64
}

// before orders readers: more reads first, then the higher score.
func (r reader) before(o reader) bool {
	if r.reads != o.reads {
		return r.reads > o.reads
	}
	return r.score > o.score
}

// ownerWithRoom returns the member with room for size bytes that scores
// the key whose hash is kh highest, or its bucket's owner when none has
// room.
func (t *Table) ownerWithRoom(kh uint64, size float64, used, quota []float64) int {
	best, bestScore := t.BucketOwner(bucketOf(kh)), math.Inf(-1)
	for i := range t.members {
		if used[i]+size > quota[i] {
			continue
		}
		if sc := t.order(i, kh); sc > bestScore {
			best, bestScore = i, sc
		}
	}
	return best
}
