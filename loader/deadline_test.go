package loader

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
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

// A reader whose request is interrupted stops waiting at once; a reader
// that shared its fetch is not failed by it, and gets the bytes.
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
	later := make(chan error, 1)
	go func() {
		b, err := l.ReadAt(context.Background(), entry("f", 100), make([]byte, 100), 0)
		if err == nil && string(b) != string(file) {
			err = fmt.Errorf("wrong bytes")
		}
		later <- err
	}()
	waitFor(t, "the second reader to share the fetch", func() bool {
		l.flight.mu.Lock()
		defer l.flight.mu.Unlock()
		c := l.flight.calls[flightKey{BlockKey("f", 0), l.Tag(entry("f", 100), BlockKey("f", 0))}]
		return c != nil && len(c.done) == 0 && l.flight.unreported[BlockKey("f", 0)] == 2
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("an interrupted read: %v, want context.Canceled", err)
	}
	close(pfs.release)
	if err := <-later; err != nil {
		t.Fatalf("the reader that shared an interrupted read's fetch: %v", err)
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

// versionedPFS serves each version of f (by mtime) with its own bytes, and
// holds reads of version 1 until released.
type versionedPFS struct {
	v1, v2  []byte
	release chan struct{}
	inside  atomic.Int64
}

func (p *versionedPFS) ReadAt(path string, want source.Version, b []byte, off int64) (int, error) {
	if want.Mtime == 1 {
		p.inside.Add(1)
		<-p.release
		return copy(b, p.v1[off:]), nil
	}
	return copy(b, p.v2[off:]), nil
}

// A fetch is shared only by readers of one version: a reader holding the
// refreshed entry never gets the bytes of a fetch of the old version still
// under way (a file of two versions), whatever their sizes.
func TestFetchNotSharedAcrossVersions(t *testing.T) {
	for _, sizes := range [][2]int64{{200, 200}, {100, 200}, {200, 100}} {
		const bs = 100
		pfs := &versionedPFS{v1: bytes.Repeat([]byte{'1'}, int(sizes[0])), v2: bytes.Repeat([]byte{'2'}, int(sizes[1])), release: make(chan struct{})}
		l := New(Config{BlockSize: bs, PFSTimeout: time.Hour}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
		e1 := catalog.At("f", catalog.Entry{Size: sizes[0], Mtime: 1, Mode: syscall.S_IFREG | 0o644})
		e2 := catalog.At("f", catalog.Entry{Size: sizes[1], Mtime: 2, Mode: syscall.S_IFREG | 0o644})
		go l.ReadAt(context.Background(), e1, make([]byte, bs), 0) // an old reader, on a slow PFS
		waitFor(t, "the old read to reach the PFS", func() bool { return pfs.inside.Load() >= 1 })
		got := make(chan []byte, 1)
		go func() {
			b, err := l.ReadAt(context.Background(), e2, make([]byte, sizes[1]), 0)
			if err != nil {
				t.Error(err)
			}
			got <- b
		}()
		select {
		case b := <-got:
			if !bytes.Equal(b, pfs.v2) {
				t.Errorf("sizes %v: a reader of version 2 got %q", sizes, b)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("sizes %v: a reader of version 2 waits on the fetch of version 1", sizes)
		}
		close(pfs.release)
		l.Close()
	}
}
