package catalog

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/pfssim"
)

// simSource mounts a simulated PFS over a tree of a/1, a/2, a/deep/3 and
// b/4, and opens a catalog of it.
// stall is the catalog's StallTimeout: long enough that a healthy scan
// on a loaded machine (the race detector, other tests) is never taken for
// a stalled one.
func simSource(t *testing.T, stall time.Duration) (*pfssim.Sim, *Catalog) {
	t.Helper()
	dir, mnt := t.TempDir(), t.TempDir()
	for _, p := range []string{"a/1", "a/2", "a/deep/3", "b/4"} {
		write(t, dir, p, p)
	}
	sim, err := pfssim.Mount(mnt, pfssim.Config{Dir: dir, NoAttrCache: true})
	if err != nil {
		t.Skipf("no FUSE here: %v", err)
	}
	t.Cleanup(func() { sim.Unmount() })
	cfg := DefaultConfig(mnt)
	cfg.StallTimeout = stall
	c, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return sim, c
}

// keptAll checks that rescan d of simSource's tree, which met transient
// errors, removed nothing and kept every file, and returns the snapshot.
func keptAll(t *testing.T, c *Catalog, d Diff) *Snapshot {
	t.Helper()
	if len(d.Removed) > 0 {
		t.Errorf("a transient error removed %d entries, the first %s", len(d.Removed), d.Removed[0].Path())
	}
	snap := c.Snapshot()
	for _, p := range []string{"a/1", "a/2", "a/deep/3", "b/4"} {
		if snap.Lookup(p) == nil {
			t.Errorf("%s is gone after a rescan that could not read it or a parent", p)
		}
	}
	return snap
}

// A directory that fails to read during a rescan keeps its entries from
// the last scan, is named in the snapshot, and its subdirectories are
// still scanned; whatever the rescan, Refresh or Revalidate.
func TestRescanKeepsUnreadableDirectory(t *testing.T) {
	for _, how := range []string{"refresh", "revalidate"} {
		t.Run(how, func(t *testing.T) {
			sim, c := simSource(t, time.Minute)
			sim.FailDir("a", syscall.EIO)
			var d Diff
			var err error
			if how == "refresh" {
				d, err = c.Refresh(context.Background())
			} else {
				// Revalidate reads only directories that changed: touch a.
				write(t, c.Source(), "a/new", "n")
				d, err = c.Revalidate(context.Background())
			}
			if err != nil {
				t.Fatal(err)
			}
			snap := keptAll(t, c, d)
			if snap.UnreadableEntries != 1 || len(snap.Unreadable) != 1 || snap.Unreadable[0] != "a" {
				t.Errorf("unreadable %d %v, want 1 [a]", snap.UnreadableEntries, snap.Unreadable)
			}
			sim.FailDir("a", 0)
			if _, err := c.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			if snap := c.Snapshot(); snap.UnreadableEntries != 0 || (how == "revalidate" && snap.Lookup("a/new") == nil) {
				t.Errorf("after the error cleared: unreadable %d, a/new %v", snap.UnreadableEntries, snap.Lookup("a/new"))
			}
		})
	}
}

// A rescan of a PFS that stops answering fails once nothing moved for
// StallTimeout, or when its context ends, and the snapshot stays.
func TestRescanOfHungSource(t *testing.T) {
	sim, c := simSource(t, time.Second)
	before := c.Snapshot()
	sim.Hang()
	defer sim.Resume()
	if _, err := c.Refresh(context.Background()); !errors.Is(err, ErrStalled) {
		t.Fatalf("a refresh of a hung PFS: %v, want ErrStalled", err)
	}
	if _, err := c.Revalidate(context.Background()); !errors.Is(err, ErrStalled) {
		t.Fatalf("a revalidation of a hung PFS: %v, want ErrStalled", err)
	}
	if c.Snapshot() != before {
		t.Error("a failed rescan replaced the snapshot")
	}
	cfg := c.cfg
	cfg.StallTimeout = time.Hour
	slow := &Catalog{cfg: cfg, scanMu: make(chan struct{}, 1)}
	slow.cur.Store(before)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := slow.Refresh(ctx); done <- err }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled refresh of a hung PFS: %v, want context.Canceled", err)
	}
}

// An entry that cannot be stat'ed during a rescan (a transient error of
// the PFS) keeps what the last scan had of it, a directory its subtree,
// and is named in the snapshot; one that is gone is dropped.
func TestRescanKeepsUnstatableEntry(t *testing.T) {
	sim, c := simSource(t, time.Minute)
	sim.FailStat("a", syscall.EIO)
	sim.FailStat("b/4", syscall.EIO)
	d, err := c.Refresh(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	snap := keptAll(t, c, d)
	if snap.UnreadableEntries != 2 || len(snap.Unreadable) != 2 || snap.Unreadable[0] != "a" || snap.Unreadable[1] != "b/4" {
		t.Errorf("unreadable %d %v, want 2 [a b/4]", snap.UnreadableEntries, snap.Unreadable)
	}
}

// A scan given up on a stall stops where it stands: of its goroutines,
// only those stuck in the kernel (at most ScanWorkers) remain, not one per
// directory waiting for a slot.
func TestAbandonedScanStops(t *testing.T) {
	sim, c := simSource(t, time.Second)
	for i := range 200 {
		write(t, c.Source(), fmt.Sprintf("d%03d/f", i), "x")
	}
	if _, err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()
	sim.HangDirs() // the root lists; every directory under it hangs
	defer sim.Resume()
	if _, err := c.Refresh(context.Background()); !errors.Is(err, ErrStalled) {
		t.Fatalf("a refresh of a PFS hung under its root: %v", err)
	}
	// Each stuck open holds two goroutines here: the scan's and the one
	// of the simulator (in this process) that holds the request.
	limit := base + 2*c.cfg.ScanWorkers + 8
	for deadline := time.Now().Add(10 * time.Second); runtime.NumGoroutine() > limit; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after the stalled scan was given up, from %d before; want at most %d", runtime.NumGoroutine(), base, limit)
		}
	}
}

// blockingLister is a packed SOURCE's index that never finishes loading.
type blockingLister struct{ release chan struct{} }

func (l blockingLister) List(ctx context.Context) ([]File, error) {
	<-l.release // deaf to ctx, as a read stuck in the kernel is
	return nil, nil
}

// A rescan of a packed SOURCE that hangs ends with its context (the
// daemon's Close cancels it), leaving the stuck listing behind.
func TestListerRescanCancelled(t *testing.T) {
	c := open(t, t.TempDir())
	l := blockingLister{make(chan struct{})}
	defer close(l.release)
	c.cfg.Lister = l
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := c.Refresh(ctx); done <- err }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("a cancelled rescan of a hung packed SOURCE: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cancelled rescan of a hung packed SOURCE did not return")
	}
}
