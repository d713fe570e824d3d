package placement

import (
	"fmt"
	"math"
	"testing"
)

func keys(n int) []string {
	k := make([]string, n)
	for i := range k {
		k[i] = fmt.Sprintf("train/class_%03d/img_%07d.jpg", i%1000, i)
	}
	return k
}

func members(n int, capacity func(i int) int64) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{Name: fmt.Sprintf("node-%02d", i), Capacity: capacity(i)}
	}
	return ms
}

func owners(t *testing.T, ms []Member, ks []string) map[string]string {
	t.Helper()
	tab, err := New(ms)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string, len(ks))
	for _, k := range ks {
		out[k] = tab.Members()[tab.Owner(k)].Name
	}
	return out
}

// TestProportional: shares follow capacities (each key has one owner by
// construction), on 1, 3 and 64 members.
func TestProportional(t *testing.T) {
	ks := keys(200_000)
	for _, n := range []int{1, 3, 64} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			ms := members(n, func(i int) int64 { return int64(1+i%4) << 30 }) // capacities 1..4 GiB
			var total float64
			for _, m := range ms {
				total += float64(m.Capacity)
			}
			count := map[string]int{}
			for _, o := range owners(t, ms, ks) {
				count[o]++
			}
			for _, m := range ms {
				want := float64(len(ks)) * float64(m.Capacity) / total
				got := float64(count[m.Name])
				// 5 standard deviations of a binomial draw, plus 1%.
				tol := 5*math.Sqrt(want) + 0.01*want
				if math.Abs(got-want) > tol {
					t.Errorf("%s (capacity %d GiB) owns %.0f keys, want %.0f ± %.0f", m.Name, m.Capacity>>30, got, want, tol)
				}
			}
		})
	}
}

// TestMinimalMovement: when one of N members leaves, only its keys move;
// when one joins, only keys it takes move.
func TestMinimalMovement(t *testing.T) {
	ks := keys(100_000)
	for _, n := range []int{3, 64} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			ms := members(n, func(int) int64 { return 1 << 30 })
			before := owners(t, ms, ks)
			leaving := ms[n/2].Name
			after := owners(t, append(append([]Member(nil), ms[:n/2]...), ms[n/2+1:]...), ks)
			moved := 0
			for _, k := range ks {
				if before[k] != after[k] {
					moved++
					if before[k] != leaving {
						t.Fatalf("%s moved from %s, which did not leave", k, before[k])
					}
				}
			}
			if frac, want := float64(moved)/float64(len(ks)), 1/float64(n); math.Abs(frac-want) > 0.2*want+0.002 {
				t.Errorf("%.4f of keys moved when 1 of %d left, want about %.4f", frac, n, want)
			}
			joined := owners(t, append(append([]Member(nil), ms...), Member{Name: "node-new", Capacity: 1 << 30}), ks)
			for _, k := range ks {
				if joined[k] != before[k] && joined[k] != "node-new" {
					t.Fatalf("%s moved from %s to %s when a member joined", k, before[k], joined[k])
				}
			}
		})
	}
}

// TestDeterministic: the table depends on the members, not their order.
func TestDeterministic(t *testing.T) {
	ks := keys(1000)
	ms := members(5, func(i int) int64 { return int64(i+1) << 20 })
	rev := append([]Member(nil), ms...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	a, b := owners(t, ms, ks), owners(t, rev, ks)
	for _, k := range ks {
		if a[k] != b[k] {
			t.Fatalf("%s: %s or %s depending on member order", k, a[k], b[k])
		}
	}
	// A golden key pins the hash: every node of one HashVersion must agree.
	tab, _ := New(members(3, func(int) int64 { return 1 }))
	if got := tab.Members()[tab.Owner("train/class_000/img_0000000.jpg")].Name; got != goldenOwner {
		t.Errorf("owner changed to %s: the hash is part of the wire protocol", got)
	}
}

// goldenOwner was computed by this implementation when it was written
// (HashVersion 2; it was node-02 under version 1).
const goldenOwner = "node-00"

func TestBadMembers(t *testing.T) {
	for _, ms := range [][]Member{nil, {{Name: "a", Capacity: 0}}, {{Name: "a", Capacity: 1}, {Name: "a", Capacity: 2}}} {
		if _, err := New(ms); err == nil {
			t.Errorf("%v accepted", ms)
		}
	}
}
