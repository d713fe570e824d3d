package jobs

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/dlfs/dlfs/control"
)

// TestPositionsCount: the positions a job plans, exactly: its ranks (all
// of them with allRanks or balance=), ceil(n/world) samples a rank of a
// DistributedSampler, n of another, times the lookahead.
func TestPositionsCount(t *testing.T) {
	for _, c := range []struct {
		spec     control.Job
		allRanks bool
		want     int64
	}{
		{control.Job{Sampler: "random", World: 4, Ranks: []int{1}, Lookahead: 2}, false, 1 * 10 * 2},
		{control.Job{Sampler: "random", World: 4, Ranks: []int{1}, Lookahead: 2}, true, 4 * 10 * 2},
		{control.Job{Sampler: "distributed", World: 4, Ranks: []int{0, 1}, Lookahead: 1}, false, 2 * 3},
		{control.Job{Sampler: "distributed", World: 4, Ranks: []int{0}, Lookahead: 1, Balance: "locality"}, false, 4 * 3},
	} {
		if got := Positions(c.spec, 10, c.allRanks); got != c.want {
			t.Errorf("%+v over 10 samples (all ranks %v): %d positions, want %d", c.spec, c.allRanks, got, c.want)
		}
	}
}

// TestPositionsBound: a job is accepted when it brings the total to
// MaxPositions exactly and refused one past it; an index two jobs share
// counts once; a job's new line does not count its old version.
func TestPositionsBound(t *testing.T) {
	files := map[string]string{}
	for i := range 30 {
		files[fmt.Sprintf("d/c/%02d.jpg", i)] = "x"
	}
	r := registry(t, files)
	const line = "root=d sampler=random world=1 lookahead=2 epoch=0"
	// Each job: 30 × 2 positions; their one index: 30 samples.
	r.cfg.MaxPositions = 2*60 + 30
	if err := apply(r, "job=a "+line); err != nil {
		t.Fatal(err)
	}
	if err := apply(r, "job=b "+line); err != nil {
		t.Fatalf("a second job at the bound exactly (its index shared): %v", err)
	}
	if err := apply(r, "job=b epoch=1"); err != nil {
		t.Fatalf("a job's next line at the bound: %v", err)
	}
	if err := r.End("b"); err != nil {
		t.Fatal(err)
	}
	r.cfg.MaxPositions--
	if err := apply(r, "job=b "+line); !errors.Is(err, control.ErrSyntax) || !strings.Contains(err.Error(), "memory bound") {
		t.Errorf("a job one position past the bound: %v", err)
	}
}

// TestJobsBound: MaxJobs jobs are accepted and one more refused; a write
// that names a registered job, or one name twice, counts it once.
func TestJobsBound(t *testing.T) {
	r := registry(t, map[string]string{"d/c/0.jpg": "x"})
	r.cfg.MaxJobs = 2
	if err := apply(r, "job=a root=d epoch=0"); err != nil {
		t.Fatal(err)
	}
	if err := r.CheckRoom([]string{"b", "b", "a"}); err != nil {
		t.Errorf("room for b (named twice) beside a: %v", err)
	}
	if err := apply(r, "job=b root=d epoch=0"); err != nil {
		t.Fatalf("the second of 2 jobs: %v", err)
	}
	if err := r.CheckRoom([]string{"a", "b"}); err != nil {
		t.Errorf("room for the registered a and b: %v", err)
	}
	if err := apply(r, "job=c root=d epoch=0"); !errors.Is(err, control.ErrSyntax) || !strings.Contains(err.Error(), "at most 2") {
		t.Errorf("a third job: %v", err)
	}
}

// TestNotifications: every registration and end moves Version and wakes
// a subscriber.
func TestNotifications(t *testing.T) {
	r := registry(t, map[string]string{"d/c/0.jpg": "x"})
	c := r.Subscribe()
	for i, step := range []func() error{
		func() error { return apply(r, "job=a root=d epoch=0") },
		func() error { return apply(r, "job=a epoch=1") },
		func() error { return r.End("a") },
	} {
		v := r.Version()
		if err := step(); err != nil {
			t.Fatal(err)
		}
		if r.Version() <= v {
			t.Errorf("step %d: version %d, was %d", i, r.Version(), v)
		}
		select {
		case <-c:
		default:
			t.Errorf("step %d: no notification", i)
		}
	}
}

// TestAheadOfANameLost: the fetch-ahead bound of an inferred job does not
// outlive it: once announced, or ended, a later inferred job of the name
// starts unbounded.
func TestAheadOfANameLost(t *testing.T) {
	r := registry(t, map[string]string{"d/c/0.jpg": "x"})
	inferred := control.Job{Name: "i", Root: "d", Set: map[string]bool{"job": true, "root": true}}
	for _, forget := range []func() error{
		func() error { return apply(r, "job=i root=d epoch=0") },
		func() error { return r.End("i") },
	} {
		if err := r.ApplyInferred(RootOwner.Cred, inferred); err != nil {
			t.Fatal(err)
		}
		r.SetAhead("i", 7)
		if got := r.Get("i").Ahead(); got != 7 {
			t.Fatalf("ahead %d, want 7", got)
		}
		if err := forget(); err != nil {
			t.Fatal(err)
		}
		if err := r.ApplyInferred(RootOwner.Cred, inferred); err != nil {
			t.Fatal(err)
		}
		if got := r.Get("i").Ahead(); got != 0 {
			t.Errorf("a new inferred job i starts %d ahead, want 0", got)
		}
		r.End("i")
	}
}

// TestMergedLineChecked: a line whose merge with the job's settings is
// not a valid job (rank 3 of world=2) is refused, and the job stays.
func TestMergedLineChecked(t *testing.T) {
	r := registry(t, map[string]string{"d/c/0.jpg": "x"})
	if err := apply(r, "job=a root=d world=4 ranks=3 epoch=0"); err != nil {
		t.Fatal(err)
	}
	if err := apply(r, "job=a world=2 epoch=0"); !errors.Is(err, control.ErrSyntax) || !strings.Contains(err.Error(), "not below") {
		t.Errorf("rank 3 of world=2: %v", err)
	}
	if j := r.Get("a"); j.Spec.World != 4 {
		t.Errorf("the job is now of world=%d", j.Spec.World)
	}
}
