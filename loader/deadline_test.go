package loader

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/ramcache"
	"github.com/dlfs/dlfs/source"
)

// hungPFS never answers until released, and counts the reads in the
// kernel at once.
type hungPFS struct {
	release      chan struct{}
	inside, most atomic.Int64
	files        map[string][]byte
}

func newHungPFS(files map[string][]byte) *hungPFS {
	return &hungPFS{release: make(chan struct{}), files: files}
}

func (h *hungPFS) ReadAt(path string, want source.Version, p []byte, off int64) (int, error) {
	n := h.inside.Add(1)
	defer h.inside.Add(-1)
	for m := h.most.Load(); n > m && !h.most.CompareAndSwap(m, n); m = h.most.Load() {
	}
	<-h.release
	return copy(p, h.files[path][off:]), nil
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// A read of a PFS that never answers fails at the deadline, and the
// abandoned call is counted until the kernel answers.
func TestPFSDeadline(t *testing.T) {
	pfs := newHungPFS(map[string][]byte{"f": data(100)})
	// Failures forgotten at once, so the read after the PFS answers tries again.
	l := New(Config{PFSTimeout: 20 * time.Millisecond, FailureTTL: time.Nanosecond}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
	defer l.Close()
	_, err := l.ReadAt(context.Background(), entry("f", 100), make([]byte, 100), 0)
	if !errors.Is(err, ErrPFSTimeout) {
		t.Fatalf("a read of a hung PFS: %v, want ErrPFSTimeout", err)
	}
	if got := l.Stats().PFSStuck; got != 1 {
		t.Errorf("stuck calls %d, want 1", got)
	}
	close(pfs.release)
	waitFor(t, "the stuck call to be counted out", func() bool { return l.Stats().PFSStuck == 0 })
	if b, err := l.ReadAt(context.Background(), entry("f", 100), make([]byte, 100), 0); err != nil || len(b) != 100 {
		t.Fatalf("a read after the PFS answered: %d bytes, %v", len(b), err)
	}
}

// A reader whose request is interrupted stops waiting at once; the fetch
// goes on, and a later reader gets its bytes.
func TestReadInterrupted(t *testing.T) {
	file := data(100)
	pfs := newHungPFS(map[string][]byte{"f": file})
	l := New(Config{PFSTimeout: time.Hour}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := l.ReadAt(ctx, entry("f", 100), make([]byte, 100), 0)
		done <- err
	}()
	waitFor(t, "the read to reach the PFS", func() bool { return pfs.inside.Load() == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("an interrupted read: %v, want context.Canceled", err)
	}
	later := make(chan error, 1)
	go func() {
		b, err := l.ReadAt(context.Background(), entry("f", 100), make([]byte, 100), 0)
		if err == nil && string(b) != string(file) {
			err = fmt.Errorf("wrong bytes")
		}
		later <- err
	}()
	close(pfs.release)
	if err := <-later; err != nil {
		t.Fatal(err)
	}
	if got := pfs.most.Load(); got != 1 {
		t.Errorf("%d reads of the PFS at once, want 1: the second reader shares the first's fetch", got)
	}
}

// Close ends every wait on a hung PFS at once, and returns.
func TestCloseEndsWaits(t *testing.T) {
	pfs := newHungPFS(map[string][]byte{"f": data(100), "g": data(100)})
	defer close(pfs.release)
	l := New(Config{PFSTimeout: time.Hour}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
	done := make(chan error, 2)
	go func() {
		_, err := l.ReadAt(context.Background(), entry("f", 100), make([]byte, 100), 0)
		done <- err
	}()
	go func() {
		_, err := l.Prefetch(context.Background(), entry("g", 100), func(*catalog.Entry, int64, ramcache.Block) bool { return true })
		done <- err
	}()
	waitFor(t, "the reads to reach the PFS", func() bool { return pfs.inside.Load() == 2 })
	l.Close()
	for range 2 {
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Errorf("a wait at Close: %v, want ErrClosed", err)
		}
	}
	if _, err := l.ReadAt(context.Background(), entry("h", 1), make([]byte, 1), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("a read after Close: %v, want ErrClosed", err)
	}
}

// Reads of SOURCE in flight, abandoned ones included, never exceed
// PFSCalls: a PFS that hangs for good makes later reads fail at their
// deadline instead of piling up.
func TestPFSCallsBound(t *testing.T) {
	files := map[string][]byte{}
	for i := range 8 {
		files[fmt.Sprint(i)] = data(10)
	}
	pfs := newHungPFS(files)
	l := New(Config{PFSTimeout: 20 * time.Millisecond, PFSCalls: 2, FailureTTL: time.Nanosecond}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
	defer l.Close()
	for name := range files {
		if _, err := l.ReadAt(context.Background(), entry(name, 10), make([]byte, 10), 0); !errors.Is(err, ErrPFSTimeout) {
			t.Errorf("%s: %v, want ErrPFSTimeout", name, err)
		}
	}
	if got := pfs.most.Load(); got != 2 {
		t.Errorf("%d reads of the PFS at once, want the bound, 2", got)
	}
	if got := l.Stats().PFSStuck; got != 2 {
		t.Errorf("%d stuck, want 2", got)
	}
	close(pfs.release)
	waitFor(t, "the stuck calls to end", func() bool { return l.Stats().PFSStuck == 0 })
}
