package owners

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/placement"
)

// TestMovedSamples: the samples counted as having changed owner between
// two tables are exactly those a brute-force comparison of every file's
// owner finds: a member joining, one leaving, and demand assignments on
// either side.
func TestMovedSamples(t *testing.T) {
	src := t.TempDir()
	var paths []string
	for i := range 600 {
		p := fmt.Sprintf("c%d/%04d.jpg", i%7, i)
		if err := os.MkdirAll(filepath.Join(src, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, p), []byte{byte(i)}, 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	cat, err := catalog.Open(context.Background(), catalog.DefaultConfig(src))
	if err != nil {
		t.Fatal(err)
	}
	snap := cat.Snapshot()
	table := func(names ...string) *placement.Table {
		ms := make([]placement.Member, len(names))
		for i, n := range names {
			ms[i] = placement.Member{Name: n, Capacity: 1 << 30}
		}
		tb, err := placement.New(ms)
		if err != nil {
			t.Fatal(err)
		}
		return tb
	}
	brute := func(a, b *placement.Table) int64 {
		var n int64
		for _, p := range paths {
			if a.Members()[a.Owner(p)].Name != b.Members()[b.Owner(p)].Name {
				n++
			}
		}
		return n
	}
	abc, abcd, abd := table("a", "b", "c"), table("a", "b", "c", "d"), table("a", "b", "d")
	// Demand: the first 50 paths read most by member 0 of abcd ("a").
	var demand []placement.Sample
	for _, p := range paths[:50] {
		demand = append(demand, placement.Sample{Key: p, Size: 1, Reads: []uint32{9, 0, 0, 0}})
	}
	abcdDemand := abcd.Assign(demand)
	var o ownership
	o.compute(snap, abc, nil, snap, PlacementStats{})
	for _, c := range []struct {
		name string
		a, b *placement.Table
	}{
		{"a join", abc, abcd}, {"a leave", abcd, abd}, {"a join and a leave", abc, abd},
		{"demand placed", abcd, abcdDemand}, {"demand undone", abcdDemand, abc}, {"no change", abc, abc},
	} {
		got, want := o.movedFrom(snap, c.a, c.b, snap, snap), brute(c.a, c.b)
		if got != want {
			t.Errorf("%s: %d samples moved, brute force %d", c.name, got, want)
		}
		t.Logf("%s: %d of %d moved", c.name, got, len(paths))
	}
	// Tables indexed from another snapshot: their keys are looked up, and
	// one the catalog no longer holds is no sample.
	goneReads := make([]uint32, 4)
	for m := 1; m < 4; m++ { // away from its bucket's owner, and from "a", which the others fill
		if m != abcd.Owner("gone/x.jpg") {
			goneReads[m] = 9
			break
		}
	}
	gone := abcd.Assign(append(demand[:len(demand):len(demand)], placement.Sample{Key: "gone/x.jpg", Size: 1, Reads: goneReads}))
	if _, ok := gone.AssignedOwner("gone/x.jpg"); !ok {
		t.Fatal("the deleted file is not assigned")
	}
	for _, c := range []struct {
		name         string
		a, b         *placement.Table
		aKeys, bKeys *catalog.Snapshot
	}{
		{"a deleted file placed, keys unknown", abc, gone, nil, nil},
		{"a deleted file let go, keys unknown", gone, abd, nil, snap},
		{"demand placed, keys unknown", abcd, abcdDemand, nil, nil},
	} {
		if got, want := o.movedFrom(snap, c.a, c.b, c.aKeys, c.bKeys), brute(c.a, c.b); got != want {
			t.Errorf("%s: %d samples moved, brute force %d", c.name, got, want)
		}
	}
	// With tables indexed from snap, counting looks nothing up and
	// allocates nothing per key (a lookup and a map entry per key cost
	// 6.6 to 8.8 CPU-s and 150 MiB at a million files).
	if n := testing.AllocsPerRun(5, func() { o.movedFrom(snap, abcd, abcdDemand, snap, snap) }); n > 2 {
		t.Errorf("counting %d assigned keys: %.0f allocations, want at most 2", abcdDemand.NumAssigned(), n)
	}

	// compute records the last change and the total.
	o.compute(snap, abcd, abc, snap, PlacementStats{})
	o.compute(snap, abd, abcd, snap, PlacementStats{})
	if p := o.placementStats(); p.MovedSamples != brute(abcd, abd) || p.MovedTotal != brute(abc, abcd)+brute(abcd, abd) {
		t.Errorf("stats %+v: want the last change's %d and a total of %d", p, brute(abcd, abd), brute(abc, abcd)+brute(abcd, abd))
	}
}
