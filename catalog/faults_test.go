package catalog

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/pfssim"
)

// simSource mounts a simulated PFS over a tree of a/1, a/2, a/deep/3 and
// b/4, and opens a catalog of it (simTree).
// stall is the catalog's StallTimeout: long enough that a healthy scan
// on a loaded machine (the race detector, other tests) is never taken for
// a stalled one.
func simSource(t *testing.T, stall time.Duration) (*pfssim.Sim, *Catalog) {
	t.Helper()
	return simTree(t, func(cfg *Config) { cfg.StallTimeout = stall }, "a/1", "a/2", "a/deep/3", "b/4")
}

// simTree mounts a simulated PFS over a tree of the files at paths, and
// opens a catalog of it, its Config as set changes it.
func simTree(t *testing.T, set func(*Config), paths ...string) (*pfssim.Sim, *Catalog) {
	t.Helper()
	dir, mnt := t.TempDir(), t.TempDir()
	for _, p := range paths {
		write(t, dir, p, p)
	}
	sim, err := pfssim.Mount(mnt, pfssim.Config{Dir: dir, NoAttrCache: true})
	if err != nil {
		t.Skipf("no FUSE here: %v", err)
	}
	t.Cleanup(func() { sim.Unmount() })
	cfg := DefaultConfig(mnt)
	set(&cfg)
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

// TestUnreadableListBounded: a rescan that cannot stat more than
// maxUnreadable entries keeps them all, counts them all, and lists the
// first maxUnreadable.
func TestUnreadableListBounded(t *testing.T) {
	var paths []string
	for i := range maxUnreadable + 3 {
		paths = append(paths, fmt.Sprintf("many/f%02d", i))
	}
	sim, c := simTree(t, func(*Config) {}, paths...)
	for _, p := range paths {
		sim.FailStat(p, syscall.EIO)
	}
	if _, err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	snap := c.Snapshot()
	if snap.UnreadableEntries != len(paths) || !slices.Equal(snap.Unreadable, paths[:maxUnreadable]) || snap.Files != len(paths) {
		t.Errorf("%d entries unreadable: counted %d, listed %v, %d files kept; want all counted, the first %d listed, all kept",
			len(paths), snap.UnreadableEntries, snap.Unreadable, snap.Files, maxUnreadable)
	}
}

// TestRevalidateAfterUnreadable: a directory whose listing holds what
// could not be read (the directory itself, an entry in it) does not vouch
// for it with its times of now: once everything can be read, a
// Revalidate, which keeps the listing of a directory whose times are
// unchanged, finds what changed meanwhile. And a snapshot that lists
// unreadable entries is rescanned, not kept as it is.
func TestRevalidateAfterUnreadable(t *testing.T) {
	add := func(p string) func(string) { return func(src string) { write(t, src, p, "changed") } }
	for _, c := range []struct {
		name   string
		dir    bool   // a directory that cannot be read, or an entry that cannot be stat'ed
		path   string // which
		change func(src string)
		want   string // a file the last Revalidate must have, with "changed" in it
	}{
		{"a directory, a file added to it", true, "a", add("a/new"), "a/new"},
		{"a directory, nothing changed", true, "a", func(string) {}, ""},
		{"a file added", false, "b/new", add("b/new"), "b/new"},
		{"a file in a new directory", false, "c/1", add("c/1"), "c/1"},
		{"a file replaced", false, "b/3", func(src string) {
			write(t, src, "b/3.tmp", "changed")
			if err := os.Rename(filepath.Join(src, "b/3.tmp"), filepath.Join(src, "b/3")); err != nil {
				t.Fatal(err)
			}
		}, "b/3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sim, cat := simTree(t, func(cfg *Config) { cfg.Now = aheadClock }, "a/1", "a/deep/2", "b/3")
			fail := func(errno syscall.Errno) {
				if c.dir {
					sim.FailDir(c.path, errno)
				} else {
					sim.FailStat(c.path, errno)
				}
			}
			c.change(cat.Source()) // then the rescan that cannot read it
			fail(syscall.EIO)
			if _, err := cat.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			if snap := cat.Snapshot(); snap.UnreadableEntries != 1 || snap.Lookup("a/1") == nil {
				t.Fatalf("%d entries unreadable, a/1 kept %v; want 1, true", snap.UnreadableEntries, snap.Lookup("a/1") != nil)
			}
			fail(0)
			if _, err := cat.Revalidate(context.Background()); err != nil {
				t.Fatal(err)
			}
			snap := cat.Snapshot()
			if e := snap.Lookup(c.want); c.want != "" && (e == nil || e.Size != int64(len("changed"))) {
				t.Errorf("%s, changed before a rescan that could not read it: %+v after a revalidation that could", c.want, e)
			}
			if snap.UnreadableEntries != 0 || len(snap.Unreadable) != 0 {
				t.Errorf("after a revalidation that read everything: %d entries unreadable %v", snap.UnreadableEntries, snap.Unreadable)
			}
		})
	}
}
