package catalog

// Tests written against the mutants gremlins left alive (make mutate,
// docs/mutation.md): the catalog's configuration and bounds, Revalidate's
// trust in directories' times, what a rescan keeps.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestOpenFillsDefaults: zero and negative settings take the defaults;
// the ones given are kept.
func TestOpenFillsDefaults(t *testing.T) {
	root := t.TempDir()
	d := DefaultConfig(root)
	for _, v := range []int{0, -1} {
		c, err := Open(context.Background(), Config{Source: root, ScanWorkers: v, StallTimeout: time.Duration(v), MaxEntries: v})
		if err != nil {
			t.Fatal(err)
		}
		if c.cfg.ScanWorkers != d.ScanWorkers || c.cfg.StallTimeout != d.StallTimeout || c.cfg.MaxEntries != DefaultMaxEntries {
			t.Fatalf("settings of %d: %+v", v, c.cfg)
		}
	}
	c, err := Open(context.Background(), Config{Source: root, ScanWorkers: 3, StallTimeout: time.Hour, MaxEntries: 7})
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.ScanWorkers != 3 || c.cfg.StallTimeout != time.Hour || c.cfg.MaxEntries != 7 {
		t.Fatalf("given settings replaced: %+v", c.cfg)
	}
}

// TestScanEntryBound: a tree of exactly MaxEntries entries below its root
// is scanned; one entry more is refused with ErrTooMany.
func TestScanEntryBound(t *testing.T) {
	root := t.TempDir()
	for _, p := range []string{"a", "b", "d/x"} {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const entries = 4 // a, b, d, d/x
	if _, err := Open(context.Background(), Config{Source: root, MaxEntries: entries}); err != nil {
		t.Fatalf("%d entries under a bound of %d: %v", entries, entries, err)
	}
	if _, err := Open(context.Background(), Config{Source: root, MaxEntries: entries - 1}); !errors.Is(err, ErrTooMany) {
		t.Fatalf("%d entries under a bound of %d: %v, want ErrTooMany", entries, entries-1, err)
	}
}

// fixedLister lists fixed files.
type fixedLister []File

func (l fixedLister) List(context.Context) ([]File, error) { return l, nil }

// TestListerEntryBound: a Lister's listing of exactly MaxEntries files is
// taken; one more is refused with ErrTooMany.
func TestListerEntryBound(t *testing.T) {
	files := fixedLister{{Path: "a", Mode: syscall.S_IFREG | 0o644}, {Path: "b", Mode: syscall.S_IFREG | 0o644}, {Path: "c", Mode: syscall.S_IFREG | 0o644}}
	root := t.TempDir()
	if _, err := Open(context.Background(), Config{Source: root, Lister: files, MaxEntries: 3}); err != nil {
		t.Fatalf("3 files under a bound of 3: %v", err)
	}
	if _, err := Open(context.Background(), Config{Source: root, Lister: files, MaxEntries: 2}); !errors.Is(err, ErrTooMany) {
		t.Fatalf("3 files under a bound of 2: %v, want ErrTooMany", err)
	}
}

// aheadClock is a clock 2×racy ahead of the machine's: every directory of
// a tree made now is trusted by the next Revalidate, unless it changes.
func aheadClock() time.Time { return time.Now().Add(2 * racy) }

// trustedTree writes files at paths under a new SOURCE and opens a
// catalog of it on aheadClock.
func trustedTree(t *testing.T, paths ...string) *Catalog {
	t.Helper()
	root := t.TempDir()
	for _, p := range paths {
		write(t, root, p, p)
	}
	cfg := DefaultConfig(root)
	cfg.Now = aheadClock
	c, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// changes counts the entries a rescan reported changed, removed or added.
func changes(d Diff) int { return len(d.Changed) + len(d.Removed) + len(d.Added) }

// TestRevalidateSeesEveryDirectory: of a trusted tree, a file added to any
// one directory, the root first among them, is found by Revalidate.
func TestRevalidateSeesEveryDirectory(t *testing.T) {
	for _, dir := range []string{"", "a", "a/deep", "b"} {
		c := trustedTree(t, "a/1", "a/deep/2", "b/3")
		if d, err := c.Revalidate(context.Background()); err != nil || d.Reused != 4 || changes(d) != 0 {
			t.Fatalf("an unchanged trusted tree: %d of 4 directories unread, %d changes, %v", d.Reused, changes(d), err)
		}
		added := join(dir, "new")
		write(t, c.Source(), added, "n")
		d, err := c.Revalidate(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Added) != 1 || d.Added[0].Path() != added || c.Snapshot().Lookup(added) == nil {
			t.Errorf("%s added: the rescan added %d entries, the snapshot has it: %v", added, len(d.Added), c.Snapshot().Lookup(added) != nil)
		}
	}
}

// TestRevalidateRacyBoundary: a directory is trusted only if its mtime and
// its ctime are both before the last scan's start less racy; at exactly
// that instant it is read (it sees a file rewritten in place), a
// nanosecond later trusted (it does not: Revalidate's documented limit).
func TestRevalidateRacyBoundary(t *testing.T) {
	for _, which := range []string{"mtime", "ctime"} {
		t.Run(which, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, "f", "")
			// The boundary on one time, the other before it: an mtime
			// set an hour ahead (the ctime is now), or an hour back (the
			// ctime, now, is then the later).
			mtime := time.Now().Add(time.Hour)
			if which == "ctime" {
				mtime = time.Now().Add(-time.Hour)
			}
			if err := os.Chtimes(root, mtime, mtime); err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Stat(root, &st); err != nil {
				t.Fatal(err)
			}
			edge := time.Unix(0, st.Mtim.Nano())
			if which == "ctime" {
				edge = time.Unix(0, st.Ctim.Nano())
			}
			for after := range 2 { // the scan starts at edge+racy, then a nanosecond later
				cfg := DefaultConfig(root)
				cfg.Now = func() time.Time { return edge.Add(racy + time.Duration(after)) }
				c, err := Open(context.Background(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				write(t, root, "f", strings.Repeat("x", after+1)) // another size; the directory does not change
				d, err := c.Revalidate(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				read := len(d.Changed) == 1 && d.Changed[0].Path() == "f" && d.Reused == 0
				trusted := changes(d) == 0 && d.Reused == 1
				if after == 0 && !read || after == 1 && !trusted {
					t.Errorf("%s at the scan's start less racy, plus %d ns: changed %d, %d directories unread; want the directory %s",
						which, after, len(d.Changed), d.Reused, map[int]string{0: "read", 1: "trusted"}[after])
				}
			}
		})
	}
}

// allocated is the bytes the process allocated while fn ran.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestRevalidateOfUnchangedTreeCopiesNothing: a Revalidate of a trusted
// tree that has not changed stats its directories and keeps the snapshot,
// copying none of it: it allocates a small part of what a rescan does.
func TestRevalidateOfUnchangedTreeCopiesNothing(t *testing.T) {
	var paths []string
	for d := range 8 {
		for f := range 400 {
			paths = append(paths, fmt.Sprintf("d%d/f%03d", d, f))
		}
	}
	c := trustedTree(t, paths...)
	snap := c.Snapshot()
	rescan := func(how func(context.Context) (Diff, error)) uint64 {
		return allocated(func() {
			if d, err := how(context.Background()); err != nil || changes(d) != 0 {
				t.Fatalf("a rescan of an unchanged tree: %d changes, %v", changes(d), err)
			}
		})
	}
	full := rescan(c.Refresh)
	fast := min(rescan(c.Revalidate), rescan(c.Revalidate))
	t.Logf("bytes allocated: %d by a Refresh, %d by a Revalidate", full, fast)
	if c.Snapshot() != snap {
		t.Error("a rescan that found nothing replaced the snapshot")
	}
	if fast > full/10 {
		t.Errorf("a Revalidate of an unchanged tree of %d files allocated %d bytes, a Refresh %d: it copied the snapshot", len(paths), fast, full)
	}
}

// changingLister lists what it was last given.
type changingLister struct {
	mu    sync.Mutex
	files []File
}

func (l *changingLister) set(files ...File) { l.mu.Lock(); l.files = files; l.mu.Unlock() }

func (l *changingLister) List(context.Context) ([]File, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.files), nil
}

// TestRevalidateListsPackedDatasetAgain: a packed dataset changes inside
// its container, which no directory's times show: Revalidate lists it
// again even when SOURCE's directory is trusted.
func TestRevalidateListsPackedDatasetAgain(t *testing.T) {
	a, b := File{Path: "a", Mode: syscall.S_IFREG | 0o644}, File{Path: "b", Mode: syscall.S_IFREG | 0o644}
	l := &changingLister{files: []File{a}}
	cfg := DefaultConfig(t.TempDir())
	cfg.Lister, cfg.Now = l, aheadClock
	c, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	l.set(a, b)
	d, err := c.Revalidate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Added) != 1 || d.Added[0].Path() != "b" || c.Snapshot().Lookup("b") == nil {
		t.Errorf("b added to the packed dataset: %d added, in the snapshot: %v", len(d.Added), c.Snapshot().Lookup("b") != nil)
	}
}

// TestStallWatch: a scan has stalled once its count of answers has not
// moved for the timeout, to the nanosecond; any move starts the wait
// again; the watch is checked every eighth of the timeout, a millisecond
// at the least.
func TestStallWatch(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	const timeout = 8 * time.Second
	w := stallWatch{timeout: timeout, last: 5, moved: t0}
	if got := w.every(); got != time.Second {
		t.Errorf("a watch of %s is checked every %s, want 1s", timeout, got)
	}
	if got := (&stallWatch{timeout: 7 * time.Millisecond}).every(); got != time.Millisecond {
		t.Errorf("a watch of 7ms is checked every %s, want 1ms", got)
	}
	for _, step := range []struct {
		at    time.Duration // after t0
		ops   int64
		stall bool
	}{
		{time.Second, 5, false},
		{timeout - 1, 5, false},
		{timeout, 6, false}, // it moved: the wait starts again
		{2*timeout - 1, 6, false},
		{2 * timeout, 6, true},
		{3 * timeout, 6, true},
	} {
		if got := w.stalled(t0.Add(step.at), step.ops); got != step.stall {
			t.Errorf("%d answers at t0+%s: stalled %v, want %v", step.ops, step.at, got, step.stall)
		}
	}
}

// TestRefreshAppliesAnyChange: a refresh that finds one change, whatever
// it is, swaps in the new snapshot: in a subdirectory with the root
// untouched, or of the root itself (its mode, mtime or owner, which no
// Diff lists).
func TestRefreshAppliesAnyChange(t *testing.T) {
	hourAgo := time.Now().Add(-time.Hour).Truncate(time.Second)
	for _, c := range []struct {
		name   string
		change func(root string) error
		seen   func(s *Snapshot) bool
	}{
		{"a file removed in a subdirectory",
			func(root string) error { return os.Remove(filepath.Join(root, "a/2")) },
			func(s *Snapshot) bool { return s.Lookup("a/2") == nil }},
		{"a file rewritten in a subdirectory",
			func(root string) error { return os.WriteFile(filepath.Join(root, "a/2"), []byte("longer"), 0o644) },
			func(s *Snapshot) bool { return s.Lookup("a/2").Size == 6 }},
		{"a file added in a subdirectory",
			func(root string) error { return os.WriteFile(filepath.Join(root, "a/3"), nil, 0o644) },
			func(s *Snapshot) bool { return s.Lookup("a/3") != nil }},
		{"the root's mode",
			func(root string) error { return os.Chmod(root, 0o705) },
			func(s *Snapshot) bool { return s.Root.Mode&0o777 == 0o705 }},
		{"the root's mtime",
			func(root string) error { return os.Chtimes(root, hourAgo, hourAgo) },
			func(s *Snapshot) bool { return s.Root.Mtime == hourAgo.UnixNano() }},
		{"the root's owner",
			func(root string) error { return os.Chown(root, 4242, 4343) },
			func(s *Snapshot) bool { return s.Root.Uid() == 4242 && s.Root.Gid() == 4343 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, "a/1", "1")
			write(t, root, "a/2", "2")
			cat := open(t, root)
			old := cat.Snapshot()
			if err := c.change(root); errors.Is(err, os.ErrPermission) {
				t.Skipf("needs root: %v", err)
			} else if err != nil {
				t.Fatal(err)
			}
			if _, err := cat.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			if cat.Snapshot() == old || !c.seen(cat.Snapshot()) {
				t.Errorf("after a refresh: the snapshot replaced %v, the change in it %v", cat.Snapshot() != old, c.seen(cat.Snapshot()))
			}
		})
	}
}

// TestRefreshOfUnchangedTreeKeepsSnapshot: a refresh that finds nothing
// changed keeps the snapshot (its holders keep the only copy).
func TestRefreshOfUnchangedTreeKeepsSnapshot(t *testing.T) {
	root := t.TempDir()
	write(t, root, "a/1", "1")
	c := open(t, root)
	old := c.Snapshot()
	if d, err := c.Refresh(context.Background()); err != nil || changes(d) != 0 {
		t.Fatalf("a refresh of an unchanged tree: %d changes, %v", changes(d), err)
	}
	if c.Snapshot() != old {
		t.Error("a refresh that found nothing replaced the snapshot")
	}
}

// TestListerDirectoryListedTwice: a directory a Lister lists more than
// once takes the mode and mtime of its last line, wherever the lines fall
// in a listing of any length (the sort by path is not stable).
func TestListerDirectoryListedTwice(t *testing.T) {
	for n := 0; n < 200; n += 7 {
		files := fixedLister{{Path: "d", Mode: syscall.S_IFDIR | 0o700, Mtime: 1}}
		for i := range n {
			files = append(files, File{Path: fmt.Sprintf("f%03d", i), Mode: syscall.S_IFREG | 0o644})
			if i == n/2 {
				files = append(files, File{Path: "d", Mode: syscall.S_IFDIR | 0o711, Mtime: 2})
			}
		}
		files = append(files, File{Path: "d", Mode: syscall.S_IFDIR | 0o750, Mtime: 3})
		cfg := DefaultConfig(t.TempDir())
		cfg.Lister = files
		c, err := Open(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if d := c.Snapshot().Lookup("d"); d.Mode != syscall.S_IFDIR|0o750 || d.Mtime != 3 || c.Snapshot().Skipped != 0 {
			t.Errorf("d listed thrice among %d files: mode %o, mtime %d, %d skipped; want its last line's, 750 and 3, none skipped",
				n, d.Mode&0o777, d.Mtime, c.Snapshot().Skipped)
		}
	}
}

// TestNamesIntern: a directory's names are copied into its one buffer,
// the last to the buffer's exact end; a name past its capacity (a saved
// snapshot whose count of name bytes lies) is returned as it is, and the
// buffer never grows (the names it gave point into it).
func TestNamesIntern(t *testing.T) {
	a := newNames([]string{"ab", "cde"})
	base := unsafe.SliceData(a.buf)
	x, y := a.intern("ab"), a.intern("cde")
	if x != "ab" || y != "cde" || unsafe.StringData(x) != base || unsafe.StringData(y) != (*byte)(unsafe.Add(unsafe.Pointer(base), 2)) {
		t.Errorf("names %q, %q not one after the other in the buffer", x, y)
	}
	past := strings.Clone("f")
	if got := a.intern(past); unsafe.StringData(got) != unsafe.StringData(past) || unsafe.SliceData(a.buf) != base || cap(a.buf) != 5 {
		t.Errorf("a name past the buffer: copied %v, the buffer moved %v, capacity %d (want 5)",
			unsafe.StringData(got) != unsafe.StringData(past), unsafe.SliceData(a.buf) != base, cap(a.buf))
	}
}

// TestDecoderScratch: a load reads every field into one scratch buffer,
// grown only for a read longer than any before.
func TestDecoderScratch(t *testing.T) {
	d := &decoder{r: bufio.NewReader(bytes.NewReader(make([]byte, 64))), crc: crc32.New(castagnoli)}
	d.bytes(8)
	first := unsafe.SliceData(d.scratch)
	d.bytes(8)
	d.bytes(4)
	if unsafe.SliceData(d.scratch) != first {
		t.Error("the scratch buffer was replaced for a read no longer than the first")
	}
	if d.bytes(9); cap(d.scratch) < 9 || d.err != nil {
		t.Errorf("a longer read: capacity %d, %v", cap(d.scratch), d.err)
	}
}
