package placement

import (
	"fmt"
	"math"
	"math/rand"
	"sort"
	"testing"
)

// referenceAssign is Assign as first written, a sort and a score per
// reader of every sample: the plain statement of the rule, which Assign
// must match owner for owner.
func referenceAssign(t *Table, samples []Sample) map[string]int {
	type item struct {
		s    *Sample
		most uint32
		hash uint64
	}
	var items []item
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
	owners := map[string]int{}
	for _, it := range items {
		s, size := it.s, float64(it.s.Size)
		owner := -1
		var readers []int
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
			owner = t.hashOwner(s.Key)
			best := math.Inf(-1)
			for i := range t.members {
				if used[i]+size <= quota[i] {
					if sc := t.score(i, s.Key); sc > best {
						owner, best = i, sc
					}
				}
			}
		}
		used[owner] += size
		owners[s.Key] = owner
	}
	return owners
}

// TestAssignMatchesReference: the fast Assign (one hash a key, a radix
// sort, a first reader per sample, no allocation per sample) places every
// sample where the plain rule does, with quotas binding or not, equal
// capacities or not, and counts the planned reads the same.
func TestAssignMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	for _, c := range []struct {
		name    string
		members int
		caps    func(int) int64
		samples int
		skew    bool // most reads by member 0: its quota binds
	}{
		{"3 equal, balanced", 3, func(int) int64 { return 1 << 40 }, 9000, false},
		{"3 equal, skewed", 3, func(int) int64 { return 1 << 40 }, 9000, true},
		{"5 unequal, skewed", 5, func(i int) int64 { return int64(1+i) << 30 }, 6000, true},
		{"4 small capacities", 4, func(i int) int64 { return int64(2000 + 500*i) }, 5000, true},
		{"1 member", 1, func(int) int64 { return 1 << 30 }, 100, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tab, err := New(members(c.members, c.caps))
			if err != nil {
				t.Fatal(err)
			}
			ss := make([]Sample, c.samples)
			var reads, local int64
			for i := range ss {
				ss[i] = Sample{Key: fmt.Sprintf("k/%06d", i), Size: int64(1 + rng.Intn(9)), Reads: make([]uint32, c.members+1)} // one reader too many: ignored
				for range 4 {
					m := rng.Intn(c.members + 1)
					if c.skew && rng.Intn(2) == 0 {
						m = 0
					}
					ss[i].Reads[m]++
				}
			}
			want := referenceAssign(tab, ss)
			at := tab.Assign(ss)
			moved := 0
			for _, s := range ss {
				if got := at.Owner(s.Key); got != want[s.Key] {
					t.Fatalf("%s (reads %v): owner %d, the rule gives %d", s.Key, s.Reads, got, want[s.Key])
				}
				if want[s.Key] != tab.Owner(s.Key) {
					moved++
				}
				for m, r := range s.Reads {
					reads += int64(r)
					if m == want[s.Key] {
						local += int64(r)
					}
				}
			}
			if at.NumAssigned() != moved {
				t.Errorf("%d keys assigned, %d differ from their bucket's owner", at.NumAssigned(), moved)
			}
			if r, l := at.Planned(); r != reads || l != local {
				t.Errorf("planned %d reads, %d local; want %d, %d", r, l, reads, local)
			}
		})
	}
}

// TestAssignAllocations: Assign allocates a fixed number of arrays, none
// per sample (sorting every sample's readers with sort.Slice made three
// allocations a sample: 3 M at a million samples).
func TestAssignAllocations(t *testing.T) {
	tab, err := New(members(3, func(int) int64 { return 1 << 40 }))
	if err != nil {
		t.Fatal(err)
	}
	ss := distributedDemand(keys(5000), 3, 4, 100, rand.New(rand.NewSource(1)))
	if n := testing.AllocsPerRun(3, func() { tab.Assign(ss) }); n > 40 {
		t.Errorf("Assign of %d samples: %.0f allocations, want a fixed few", len(ss), n)
	}
}

// TestAssignedDiff: the merge of two tables' assignments visits every key
// either assigns once, with each table's owner for it (as Owner says) and
// whether each assigns it.
func TestAssignedDiff(t *testing.T) {
	ks := keys(4000)
	abc, err := New(members(3, func(int) int64 { return 1 << 40 }))
	if err != nil {
		t.Fatal(err)
	}
	ab, err := New(members(2, func(int) int64 { return 1 << 40 }))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(2))
	a := abc.Assign(distributedDemand(ks[:3000], 3, 4, 10, rng))
	b := ab.Assign(distributedDemand(ks[1000:], 2, 4, 10, rng))
	seen := map[string]bool{}
	AssignedDiff(a, b, func(key string, bucket, aOwner, bOwner int, inA, inB bool) {
		if seen[key] {
			t.Fatalf("%s visited twice", key)
		}
		seen[key] = true
		_, wantA := a.AssignedOwner(key)
		_, wantB := b.AssignedOwner(key)
		if inA != wantA || inB != wantB || bucket != Bucket(key) || aOwner != a.Owner(key) || bOwner != b.Owner(key) {
			t.Fatalf("%s: bucket %d, owners %d %d, in %v %v; want %d, %d %d, %v %v", key, bucket, aOwner, bOwner, inA, inB,
				Bucket(key), a.Owner(key), b.Owner(key), wantA, wantB)
		}
	})
	n := 0
	for _, k := range ks {
		_, inA := a.AssignedOwner(k)
		_, inB := b.AssignedOwner(k)
		if inA || inB {
			n++
		}
	}
	if len(seen) != n || n == 0 {
		t.Errorf("visited %d keys, %d are assigned by either", len(seen), n)
	}
}
