package loader

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlfs/dlfs/ramcache"
	"github.com/dlfs/dlfs/source"
)

// A reader retrying a file that changed gets the error at once: one read
// of the PFS however many tries, until a refresh forgets it or it expires.
func TestFailedReadsRemembered(t *testing.T) {
	pfs := &fakePFS{files: map[string][]byte{"f": data(100)}}
	l := New(Config{FailureTTL: time.Hour}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
	defer l.Close()
	changed := entry("f", 50) // the catalog's size; SOURCE's is 100
	for range 1000 {
		if _, err := l.ReadAt(context.Background(), changed, make([]byte, 50), 0); !errors.Is(err, source.ErrChanged) {
			t.Fatalf("a read of a changed file: %v, want ErrChanged", err)
		}
	}
	if got := pfs.reads.Load(); got != 1 {
		t.Errorf("1000 tries read the PFS %d times, want once", got)
	}
	l.Invalidate(changed) // a refresh
	if _, err := l.ReadAt(context.Background(), changed, make([]byte, 50), 0); !errors.Is(err, source.ErrChanged) {
		t.Fatal(err)
	}
	if got := pfs.reads.Load(); got != 2 {
		t.Errorf("after a refresh, %d reads of the PFS, want 2", got)
	}
	// Another file is another key, and so is another version of f.
	if b, err := l.ReadAt(context.Background(), entry("f", 100), make([]byte, 100), 0); err != nil || len(b) != 100 {
		t.Fatalf("the current version of f: %d bytes, %v", len(b), err)
	}
}

// A remembered failure expires.
func TestFailedReadsExpire(t *testing.T) {
	pfs := &fakePFS{files: map[string][]byte{}}
	l := New(Config{FailureTTL: time.Millisecond}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
	defer l.Close()
	waitFor(t, "a second read of the PFS once the failure expired", func() bool {
		l.ReadAt(context.Background(), entry("gone", 10), make([]byte, 10), 0)
		return pfs.reads.Load() >= 2
	})
}

// At most maxFailures are remembered.
func TestFailuresBounded(t *testing.T) {
	var f failures
	now := time.Now()
	for i := range maxFailures + 100 {
		f.put(failKey{path: fmt.Sprint(i)}, errors.New("x"), now, time.Hour)
	}
	if n := f.len(); n > maxFailures {
		t.Errorf("%d failures remembered, bound %d", n, maxFailures)
	}
	f.put(failKey{path: "closed"}, ErrClosed, now, time.Hour)
	if f.get(failKey{path: "closed"}, now) != nil {
		t.Error("a read cut short by Close was remembered as the file's failure")
	}
}
