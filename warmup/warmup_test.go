package warmup

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/loader"
)

// fakeSource: files named p* are plain; c<k>/<off> lie in container k at
// offset off (length 10); Warm records the units and can be held.
type fakeSource struct {
	mu    sync.Mutex
	units [][]string
	hold  chan struct{} // nil: no wait
}

func (f *fakeSource) Locate(e *catalog.Entry) (loader.Span, bool) {
	var k, off int64
	if _, err := fmt.Sscanf(e.Path(), "c%d/%d", &k, &off); err != nil {
		return loader.Span{}, false
	}
	return loader.Span{Container: fmt.Sprint(k), Off: off, Len: 10}, true
}
func (f *fakeSource) RunLimits() (gap, run int64) { return 5, 40 }
func (f *fakeSource) Warm(first *catalog.Entry, ns []*catalog.Entry) error {
	if f.hold != nil {
		<-f.hold
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
	stopped := w.cancelCurrent()
	close(src.hold)
	<-stopped
	if st := w.Status(); st.State != "stopped" || st.DoneFiles < 1 {
		t.Errorf("stopped: %+v", st)
	}
}
