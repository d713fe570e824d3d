package placement

// Tests written against the mutants gremlins left alive (make mutate,
// docs/mutation.md): each pins a rule of the package doc that no other
// test checked exactly.

import (
	"errors"
	"fmt"
	"math"
	"testing"
)

// TestHashGolden pins who owns what for fixed members and keys, on the
// uniform path (equal capacities) and the weighted one. Every node must
// compute the same owners: a change of the hash is a change of
// HashVersion, and of these values with it.
func TestHashGolden(t *testing.T) {
	if HashVersion != 3 {
		t.Fatalf("HashVersion is %d: update the golden owners below for it", HashVersion)
	}
	for _, c := range []struct {
		caps   []int64
		owners string // keys(40)'s owners, one digit each
		print  uint64
	}{
		{[]int64{1, 1, 1, 1}, "3210303330333032311301110023303020302101", 3950753489829780748},
		{[]int64{1, 2, 3, 4}, "3232303330333232331303132223333320322231", 11283184203909192351},
	} {
		tab, err := New(members(len(c.caps), func(i int) int64 { return c.caps[i] << 30 }))
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, k := range keys(40) {
			got += fmt.Sprint(tab.Owner(k))
		}
		if got != c.owners {
			t.Errorf("capacities %v: owners %s, want %s (placement hash changed without a new HashVersion?)", c.caps, got, c.owners)
		}
		if tab.Fingerprint() != c.print {
			t.Errorf("capacities %v: fingerprint %d, want %d", c.caps, tab.Fingerprint(), c.print)
		}
	}
	for k, want := range map[string]int{"": 38897, "a": 23280, "train/class_000/img_0000000.jpg": 52082} {
		if got := Bucket(k); got != want {
			t.Errorf("Bucket(%q) = %d, want %d", k, got, want)
		}
	}
}

// TestMemberLimit: a table holds up to math.MaxUint16 members (owners
// are kept in 16 bits elsewhere), and refuses one more.
func TestMemberLimit(t *testing.T) {
	many := members(math.MaxUint16+1, func(int) int64 { return 1 })
	for i := range many {
		many[i].Name = fmt.Sprintf("node-%05d", i)
	}
	if _, err := New(many[:math.MaxUint16]); err != nil {
		t.Fatalf("New(%d members) = %v, want a table", math.MaxUint16, err)
	}
	if _, err := New(many); !errors.Is(err, ErrMembers) {
		t.Fatalf("New(%d members) = %v, want ErrMembers", len(many), err)
	}
}

// TestUniformFastPath: equal capacities take the path without logarithms,
// unequal ones do not, and the fast path picks the same owners as the
// weighted rule would.
func TestUniformFastPath(t *testing.T) {
	eq, err := New(members(5, func(int) int64 { return 7 << 30 }))
	if err != nil {
		t.Fatal(err)
	}
	uneq, err := New(members(5, func(i int) int64 { return int64(7+i%2) << 30 }))
	if err != nil {
		t.Fatal(err)
	}
	if !eq.uniform || uneq.uniform {
		t.Fatalf("uniform: equal capacities %v, unequal %v; want true, false", eq.uniform, uneq.uniform)
	}
	slow := *eq
	slow.uniform = false
	for b := uint64(0); b < 5000; b++ {
		kh := mix(b + 0x9e3779b97f4a7c15)
		if f, s := eq.rendezvous(kh), slow.rendezvous(kh); f != s {
			t.Fatalf("bucket hash %#x: fast path gives %d, weighted rule %d", kh, f, s)
		}
	}
}

// findKey returns the first key "prefix-N" for which ok holds.
func findKey(t *testing.T, prefix string, ok func(string) bool) string {
	t.Helper()
	for i := 0; i < 10000; i++ {
		if k := fmt.Sprintf("%s-%d", prefix, i); ok(k) {
			return k
		}
	}
	t.Fatalf("no key %s-N found", prefix)
	return ""
}

// TestAssignTiesByHash: among samples read equally often, the one first by
// hash gets its reader when the reader has room for one only.
func TestAssignTiesByHash(t *testing.T) {
	tab, err := New(members(2, func(int) int64 { return 1 << 30 }))
	if err != nil {
		t.Fatal(err)
	}
	// Two samples of 100 bytes: quotas are min(capacity, 1.1 × 100) each,
	// so member 0, reader of both, takes one.
	for _, pair := range [][2]string{{"a", "b"}, {"b", "a"}, {"img-1", "img-2"}, {"img-2", "img-1"}, {"zz", "aa"}} {
		ss := []Sample{{Key: pair[0], Size: 100, Reads: []uint32{1, 0}}, {Key: pair[1], Size: 100, Reads: []uint32{1, 0}}}
		first, second := pair[0], pair[1]
		if fnv64a("", second) < fnv64a("", first) {
			first, second = second, first
		}
		at := tab.Assign(ss)
		if at.Owner(first) != 0 || at.Owner(second) != 1 {
			t.Errorf("%v: owners %s→%d, %s→%d; want the first by hash (%s) on its reader 0, the other on 1",
				pair, first, at.Owner(first), second, at.Owner(second), first)
		}
	}
}

// TestAssignExactFit: a sample that fills its reader's quota to the byte
// still goes to the reader.
func TestAssignExactFit(t *testing.T) {
	// A: capacity 100; B: 1000. With 1000 bytes of samples, A's quota is
	// min(100, 100/1100 × 1000 × 1.1) = 100.
	tab, err := New([]Member{{Name: "a", Capacity: 100}, {Name: "b", Capacity: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	// A key B outscores A on, so that a quota check that refused the exact
	// fit would send it to B.
	x := findKey(t, "x", func(k string) bool { return tab.score(1, k) > tab.score(0, k) })
	at := tab.Assign([]Sample{{Key: x, Size: 100, Reads: []uint32{1, 0}}, {Key: "filler", Size: 900, Reads: []uint32{0, 1}}})
	if o := at.Owner(x); o != 0 {
		t.Fatalf("%s (100 bytes, read by a, whose quota is 100) went to member %d, want 0", x, o)
	}
}

// TestAssignExactRoom: when the readers are full, a member whose room is
// exactly the sample's size has room for it.
func TestAssignExactRoom(t *testing.T) {
	tab, err := New([]Member{{Name: "a", Capacity: 100}, {Name: "b", Capacity: 100}})
	if err != nil {
		t.Fatal(err)
	}
	// Quotas min(100, 100/200 × 200 × 1.1) = 100. P (read twice) fills a;
	// X, read by a, must go to b, which has exactly 100 bytes of room. X is
	// a key whose hashed owner is a, where "no room anywhere" would put it.
	x := findKey(t, "x", func(k string) bool { return tab.hashOwner(k) == 0 })
	at := tab.Assign([]Sample{{Key: "p", Size: 100, Reads: []uint32{2, 0}}, {Key: x, Size: 100, Reads: []uint32{1, 0}}})
	if o := at.Owner("p"); o != 0 {
		t.Fatalf("p went to %d, want its reader 0", o)
	}
	if o := at.Owner(x); o != 1 {
		t.Fatalf("%s went to %d, want 1, the member with exactly its size in room", x, o)
	}
}

// TestAssignZeroReadsAreNotReaders: a member listed with 0 reads is not a
// reader; when the readers are full, the sample goes to the member that
// ranks it highest by hash with room, whether or not Reads lists it.
func TestAssignZeroReadsAreNotReaders(t *testing.T) {
	tab, err := New(members(3, func(int) int64 { return 100 }))
	if err != nil {
		t.Fatal(err)
	}
	// 340 bytes: quotas min(100, 100/300 × 340 × 1.1) = 100. P fills member
	// 0 to 70; X (70, read by 0) no longer fits there. Reads lists member 1
	// with 0 reads and leaves member 2 out; X is a key member 2 outscores 1
	// on. The filler, read by no one, comes last.
	x := findKey(t, "x", func(k string) bool { return tab.score(2, k) > tab.score(1, k) })
	at := tab.Assign([]Sample{
		{Key: "p", Size: 70, Reads: []uint32{2, 0, 0}},
		{Key: x, Size: 70, Reads: []uint32{1, 0}},
		{Key: "filler", Size: 200, Reads: []uint32{0, 0, 0}},
	})
	if o := at.Owner(x); o != 2 {
		t.Fatalf("%s went to %d, want 2 (highest by hash with room; 1 only listed with 0 reads)", x, o)
	}
}

// TestAssignReadsBeyondMembers: counts for member indices the table does
// not have are ignored.
func TestAssignReadsBeyondMembers(t *testing.T) {
	tab, err := New(members(2, func(int) int64 { return 1 << 30 }))
	if err != nil {
		t.Fatal(err)
	}
	// The filler (read by no one, so placed after k) leaves every member
	// room for k.
	at := tab.Assign([]Sample{{Key: "k", Size: 10, Reads: []uint32{0, 0, 5, 9}}, {Key: "filler", Size: 1000}})
	want := 0
	if tab.score(1, "k") > tab.score(0, "k") {
		want = 1
	}
	if o := at.Owner("k"); o != want {
		t.Fatalf("a sample read only by members the table lacks went to %d, want %d, the member that ranks it highest", o, want)
	}
}
