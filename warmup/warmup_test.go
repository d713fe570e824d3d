package warmup

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/loader/runs"
)

// fakeSource: files named p* are plain; c<k>/<off> lie in container k at
// offset off (length 10); Warm records the units and can be held.
type fakeSource struct {
	mu    sync.Mutex
	units [][]string
	hold  chan struct{} // nil: no wait
	// ctxAware: a held Warm ends when its context does, as the loader's.
	ctxAware bool
}

func (f *fakeSource) Locate(e *catalog.Entry) (runs.Span, bool) {
	var k, off int64
	if _, err := fmt.Sscanf(e.Path(), "c%d/%d", &k, &off); err != nil {
		return runs.Span{}, false
	}
	return runs.Span{Container: fmt.Sprint(k), Off: off, Len: 10}, true
}
func (f *fakeSource) RunLimits() (gap, run int64) { return 5, 40 }
func (f *fakeSource) Warm(ctx context.Context, first *catalog.Entry, ns []*catalog.Entry) error {
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-ctxDone(ctx, f.ctxAware):
			return ctx.Err()
		}
	}
	u := []string{first.Path()}
	for _, e := range ns {
		u = append(u, e.Path())
	}
	f.mu.Lock()
	f.units = append(f.units, u)
	f.mu.Unlock()
	return nil
}

// ctxDone is ctx.Done(), or nil (never ready) when aware is false.
func ctxDone(ctx context.Context, aware bool) <-chan struct{} {
	if aware {
		return ctx.Done()
	}
	return nil
}

func entries(paths ...string) []*catalog.Entry {
	var out []*catalog.Entry
	for i, p := range paths {
		out = append(out, catalog.At(p, catalog.Entry{Ino: uint64(i + 1), Size: 10}))
	}
	return out
}

func wait(t *testing.T, w *Warmer, state string) Status {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if st := w.Status(); st.State == state {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("never %s: %+v", state, w.Status())
		}
	}
}

// TestPlan: packed samples first, by container and offset, in runs that
// respect the gap and run limits; plain files by path; only what fits.
func TestPlan(t *testing.T) {
	src := &fakeSource{}
	es := entries("p2", "c1/30", "c0/100", "c1/0", "c1/10", "p1", "c1/100", "c0/0")
	units, st := plan(src, es, 60)
	got := fmt.Sprint(unitPaths(units))
	want := "[[c0/0] [c0/100] [c1/0 c1/10] [c1/30] [c1/100]]" // c1/30: 10 past the run's end > gap 5
	if got != want || st.Files != 8 || st.Bytes != 80 || st.FitBytes != 60 || st.FitFiles != 6 {
		t.Errorf("plan %s %+v, want %s with 6 of 8 files fitting", got, st, want)
	}
	units, _ = plan(src, es, 1000)
	if got := fmt.Sprint(unitPaths(units)); got != "[[c0/0] [c0/100] [c1/0 c1/10] [c1/30] [c1/100] [p1] [p2]]" {
		t.Errorf("all: %s", got)
	}
}

func unitPaths(units [][]*catalog.Entry) [][]string {
	var out [][]string
	for _, u := range units {
		var ps []string
		for _, e := range u {
			ps = append(ps, e.Path())
		}
		out = append(out, ps)
	}
	return out
}

// TestRunAndStop: a warm-up warms every unit and says done; one stopped
// half-way says stopped and warms no more.
func TestRunAndStop(t *testing.T) {
	src := &fakeSource{}
	w := New(Config{Workers: 2}, src)
	defer w.Close()
	w.Start([]string{""}, entries("p1", "p2", "p3"), 1<<20)
	if st := wait(t, w, "done"); st.DoneFiles != 3 || st.DoneBytes != 30 || st.Paths[0] != "" {
		t.Errorf("done: %+v", st)
	}
	// Stopped while a fetch is under way: it says stopped, and what was
	// fetched counts.
	src = &fakeSource{hold: make(chan struct{})}
	w = New(Config{Workers: 1}, src)
	defer w.Close()
	w.Start([]string{"x"}, entries("p1", "p2", "p3", "p4"), 1<<20)
	src.hold <- struct{}{} // p1 through; p2 is held
	w.Stop()
	close(src.hold)
	w.Close()
	if st := w.Status(); st.State != "stopped" || st.DoneFiles < 1 {
		t.Errorf("stopped: %+v", st)
	}
}

// Stop returns at once, its fetches cancelled: a fetch from a PFS that
// never answers (Warm waits for ever, but for its context) does not hold
// it up, nor Close, nor the next warm-up.
func TestStopReturnsAtOnce(t *testing.T) {
	src := &fakeSource{hold: make(chan struct{}), ctxAware: true}
	w := New(Config{Workers: 2}, src)
	w.Start([]string{"x"}, entries("p1", "p2", "p3"), 1<<20)
	w.Stop()
	if st := w.Status(); st.State != "stopped" {
		t.Errorf("after Stop: %+v", st)
	}
	w.Start([]string{"y"}, entries("p4"), 1<<20)
	if st := w.Status(); st.State != "running" || st.Paths[0] != "y" {
		t.Errorf("the next warm-up: %+v", st)
	}
	w.Close()
	if st := w.Status(); st.State != "stopped" || st.Paths[0] != "y" {
		t.Errorf("after Close: %+v", st)
	}
}

// Sizes that sum past 2^63 (sparse files) neither wrap nor make
// everything fit.
func TestPlanSizesNear2to63(t *testing.T) {
	var es []*catalog.Entry
	for i := range 3 {
		es = append(es, catalog.At(fmt.Sprintf("p%d", i), catalog.Entry{Ino: uint64(i + 1), Size: math.MaxInt64/2 + 1}))
	}
	es = append(es, catalog.At("small", catalog.Entry{Ino: 9, Size: 10}))
	units, st := plan(&fakeSource{}, es, 16<<20)
	if st.Bytes != math.MaxInt64 || st.FitFiles != 0 || st.FitBytes != 0 || len(units) != 0 {
		t.Errorf("plan of huge sparse files into 16 MiB: %+v, %d units; want none to fit and bytes saturated", st, len(units))
	}
	_, st = plan(&fakeSource{}, es, math.MaxInt64)
	if st.FitFiles != 1 || st.FitBytes != math.MaxInt64/2+1 {
		t.Errorf("plan into all of int64: %+v; want one huge file to fit", st)
	}
}
