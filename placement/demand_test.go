package placement

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"
)

// distributedDemand draws the reads of a DistributedSampler job with one
// rank per member over epochs: each epoch every sample is read by one
// uniformly random member.
func distributedDemand(ks []string, members, epochs int, size int64, rng *rand.Rand) []Sample {
	ss := make([]Sample, len(ks))
	for i, k := range ks {
		ss[i] = Sample{Key: k, Size: size, Reads: make([]uint32, members)}
		for e := 0; e < epochs; e++ {
			ss[i].Reads[rng.Intn(members)]++
		}
	}
	return ss
}

// localReads is the fraction of planned reads that find the sample on the
// reader's own node.
func localReads(tab *Table, ss []Sample) float64 {
	var local, all float64
	for _, s := range ss {
		o := tab.Owner(s.Key)
		for m, r := range s.Reads {
			all += float64(r)
			if m == o {
				local += float64(r)
			}
		}
	}
	return local / all
}

// TestAssignFollowsDemand: with room, every sample goes to its most
// frequent reader; local reads rise well above hashing's 1/N.
func TestAssignFollowsDemand(t *testing.T) {
	for _, n := range []int{1, 3, 64} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			ks := keys(20_000)
			ss := distributedDemand(ks, n, 3, 100, rand.New(rand.NewSource(1)))
			tab, err := New(members(n, func(int) int64 { return 1 << 30 }))
			if err != nil {
				t.Fatal(err)
			}
			at := tab.Assign(ss)
			for _, s := range ss {
				o := at.Owner(s.Key)
				for _, r := range s.Reads {
					if r > s.Reads[o] { // balanced demand and 10% slack: no quota binds
						t.Fatalf("%s read %v goes to member %d", s.Key, s.Reads, o)
					}
				}
			}
			// Expected max of a 3-epoch multinomial over n members; for
			// n = 3, 51/27/3 = 0.63 of the reads, against 1/3 hashed.
			hashed, demand := localReads(tab, ss), localReads(at, ss)
			t.Logf("%d members: local reads %.3f hashed, %.3f by demand", n, hashed, demand)
			if n > 1 && demand < 1.5*hashed {
				t.Errorf("demand placement gives %.3f local reads, hashing %.3f", demand, hashed)
			}
			// Keys outside the plans keep their hashed owner.
			for _, k := range keys(20_100)[20_000:] {
				k += ".unplanned"
				if at.Owner(k) != tab.Owner(k) {
					t.Fatalf("unplanned %s moved", k)
				}
			}
		})
	}
}

// TestAssignQuota: no member is given more than its quota (its share of
// the bytes plus a tenth, within capacity) while another has room, even
// when every sample is read most by one member.
func TestAssignQuota(t *testing.T) {
	ks := keys(30_000)
	ss := make([]Sample, len(ks))
	for i, k := range ks {
		ss[i] = Sample{Key: k, Size: int64(100 + i%7), Reads: []uint32{5, uint32(i % 2), 0}}
	}
	ms := members(3, func(i int) int64 { return int64(1+i) << 20 }) // 1, 2, 3 MiB: 6 MiB for ~3 MB
	tab, _ := New(ms)
	at := tab.Assign(ss)
	var total float64
	used := make([]float64, 3)
	for _, s := range ss {
		total += float64(s.Size)
		used[at.Owner(s.Key)] += float64(s.Size)
	}
	for i, m := range ms {
		quota := min(float64(m.Capacity), float64(m.Capacity)/float64(6<<20)*total*1.1)
		if used[i] > quota {
			t.Errorf("%s holds %.0f bytes, quota %.0f", m.Name, used[i], quota)
		}
	}
	if used[0] < float64(ms[0].Capacity)/6*total/float64(1<<20) {
		t.Errorf("the most frequent reader got %.0f bytes, less than its share", used[0])
	}
}

// TestAssignDeterministic: the table depends on the set of samples, not
// their order.
func TestAssignDeterministic(t *testing.T) {
	ks := keys(5000)
	ss := distributedDemand(ks, 3, 2, 1000, rand.New(rand.NewSource(2)))
	for i := range ss {
		if i%5 < 3 {
			ss[i].Reads = []uint32{2, 1, 0} // node 0 reads 60% most: its quota binds
		}
	}
	tab, _ := New(members(3, func(int) int64 { return 2 << 20 }))
	a := tab.Assign(ss)
	displaced := 0
	for _, s := range ss {
		if o := a.Owner(s.Key); s.Reads[o] < slices.Max(s.Reads) {
			displaced++
		}
	}
	if displaced < 500 {
		t.Fatalf("%d of %d samples displaced from their top reader: the quotas do not bind", displaced, len(ss))
	}
	rev := append([]Sample(nil), ss...)
	rand.New(rand.NewSource(3)).Shuffle(len(rev), func(i, j int) { rev[i], rev[j] = rev[j], rev[i] })
	b := tab.Assign(rev)
	for _, k := range ks {
		if a.Owner(k) != b.Owner(k) {
			t.Fatalf("%s: owner %d, or %d with the samples shuffled", k, a.Owner(k), b.Owner(k))
		}
	}
	if a.Fingerprint() != b.Fingerprint() {
		t.Fatalf("fingerprints %x and %x of equal tables", a.Fingerprint(), b.Fingerprint())
	}
}

// TestFingerprint: tables that place any key differently have different
// fingerprints; equal ones, built apart, have the same.
func TestFingerprint(t *testing.T) {
	ks := keys(2000)
	ss := distributedDemand(ks, 3, 2, 1000, rand.New(rand.NewSource(4)))
	tab, _ := New(members(3, func(int) int64 { return 1 << 30 }))
	again, _ := New(members(3, func(int) int64 { return 1 << 30 }))
	bigger, _ := New(members(3, func(i int) int64 { return 1<<30 + int64(i) }))
	fewer, _ := New(members(2, func(int) int64 { return 1 << 30 }))
	moved := append([]Sample(nil), ss...)
	moved[7] = Sample{Key: moved[7].Key, Size: 1000, Reads: []uint32{0, 0, 9}}
	moved[8] = Sample{Key: moved[8].Key, Size: 1000, Reads: []uint32{9, 0, 0}}
	cases := []struct {
		name  string
		a, b  *Table
		equal bool
	}{
		{"hash, same members", tab, again, true},
		{"hash, other capacities", tab, bigger, false},
		{"hash, fewer members", tab, fewer, false},
		{"demand, same reads", tab.Assign(ss), again.Assign(ss), true},
		{"demand, two samples moved", tab.Assign(ss), tab.Assign(moved), false},
		{"demand against hash", tab.Assign(ss), tab, false},
	}
	for _, c := range cases {
		if eq := c.a.Equal(c.b); eq != c.equal {
			t.Fatalf("%s: Equal %v, want %v", c.name, eq, c.equal)
		}
		if same := c.a.Fingerprint() == c.b.Fingerprint(); same != c.equal {
			t.Errorf("%s: fingerprints %x and %x, want equal=%v", c.name, c.a.Fingerprint(), c.b.Fingerprint(), c.equal)
		}
	}
}

// TestAssignTieBreaks: a sample read as often by two members, both with
// room, goes to the one of them that rendezvous hashing ranks higher,
// whichever owns it by hash alone.
func TestAssignTieBreaks(t *testing.T) {
	// Node 2 is tiny: the quotas of 0 and 1 (their share and a tenth) take
	// every tied sample.
	tab, _ := New(members(3, func(i int) int64 { return []int64{1 << 30, 1 << 30, 1 << 10}[i] }))
	ks := keys(2000)
	ss := make([]Sample, len(ks))
	for i, k := range ks {
		ss[i] = Sample{Key: k, Size: 100, Reads: []uint32{1, 1, 0}}
	}
	at := tab.Assign(ss)
	picked := [2]int{}
	for _, s := range ss {
		want := 0
		if tab.score(1, s.Key) > tab.score(0, s.Key) {
			want = 1
		}
		if got := at.Owner(s.Key); got != want {
			t.Fatalf("%s: owner %d, want %d (scores %.3f, %.3f)", s.Key, got, want, tab.score(0, s.Key), tab.score(1, s.Key))
		}
		picked[want]++
	}
	if picked[0] == 0 || picked[1] == 0 {
		t.Errorf("ties all went one way: %v", picked)
	}
}
