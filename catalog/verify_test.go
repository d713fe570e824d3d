package catalog

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/source"
)

// TestCheckLoadedEntries: an entry loaded from the saved snapshot is
// served only once SOURCE has it as saved. Changed while dlfs was down,
// the way rsync changes files (a temporary file renamed over the old
// one), rewritten in place with the same size, or removed, it is behind;
// an untouched file and directory are not; what was checked stays checked.
func TestCheckLoadedEntries(t *testing.T) {
	_, _, cfg := saved(t)
	root := cfg.Source
	// rsync: a temp file renamed over b/2.jpg, same size and contents.
	write(t, root, "b/.2.jpg.tmp", "22")
	if err := os.Rename(filepath.Join(root, "b/.2.jpg.tmp"), filepath.Join(root, "b/2.jpg")); err != nil {
		t.Fatal(err)
	}
	// In place, same size: only ctime and mtime move.
	if err := os.WriteFile(filepath.Join(root, "deep/er/still/x.png"), []byte("XYZ"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "a x/ü #.jpg")); err != nil {
		t.Fatal(err)
	}
	c, err := Open(context.Background(), cfg)
	if err != nil || !c.Loaded() || !c.Verifying() {
		t.Fatalf("open: %v, loaded %v, verifying %v", err, c != nil && c.Loaded(), c != nil && c.Verifying())
	}
	// Directories written just now are not trusted by their times (racy):
	// let the saved scan look older than it is.
	c.unchecked.Load().trusted = time.Now().Add(time.Hour).UnixNano()
	s := c.Snapshot()
	ctx := context.Background()
	for path, behind := range map[string]bool{
		"b/2.jpg": true, "deep/er/still/x.png": true, "a x/ü #.jpg": true,
		"b/1.jpg": false, "link": false, "deep/er": false, "": false,
	} {
		e := s.Lookup(path)
		if e == nil {
			t.Fatalf("%q not in the loaded snapshot", path)
		}
		err := c.Check(ctx, e)
		if behind != errors.Is(err, ErrBehind) || (!behind && err != nil) {
			t.Errorf("Check(%q) = %v; want behind %v", path, err, behind)
		}
		if behind && !errors.Is(err, source.ErrChanged) {
			t.Errorf("Check(%q) = %v: not a source.ErrChanged (the view answers ESTALE for those)", path, err)
		}
	}
	// The b directory gained and lost a name (the rename): its listing is
	// behind too.
	if err := c.Check(ctx, s.Lookup("b")); !errors.Is(err, ErrBehind) {
		t.Errorf("Check(b) after a rename in it = %v; want behind", err)
	}
	// Checked once, never stat'ed again: remove it, it still passes.
	if err := os.Remove(filepath.Join(root, "b/1.jpg")); err != nil {
		t.Fatal(err)
	}
	if err := c.Check(ctx, s.Lookup("b/1.jpg")); err != nil {
		t.Errorf("an entry checked before: %v", err)
	}
	behind, err := c.CheckAll(ctx)
	if err != nil || behind < 3 {
		t.Errorf("CheckAll = %d, %v; want at least the 3 changed files behind", behind, err)
	}
	if !c.Verifying() {
		t.Error("entries are behind, yet the snapshot counts as all checked")
	}
	// A full refresh reads everything: nothing loaded is left to check,
	// and the old snapshot's entries are behind the new one.
	if _, err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Verifying() {
		t.Error("still verifying after a full refresh")
	}
	if e := c.Snapshot().Lookup("b/2.jpg"); e == nil || c.Check(ctx, e) != nil {
		t.Errorf("the refreshed entry of b/2.jpg is not servable")
	}
}

// TestCheckAnotherDataset: another dataset behind the same path, with
// the same names and sizes: every file is behind.
func TestCheckAnotherDataset(t *testing.T) {
	_, _, cfg := saved(t)
	root := cfg.Source
	for _, f := range []string{"b/2.jpg", "b/1.jpg", "deep/er/still/x.png"} {
		p := filepath.Join(root, f)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil { // a new inode, new ctime
			t.Fatal(err)
		}
	}
	c, err := Open(context.Background(), cfg)
	if err != nil || !c.Loaded() {
		t.Fatalf("open: %v", err)
	}
	behind, err := c.CheckAll(context.Background())
	if err != nil || behind < 3 {
		t.Fatalf("CheckAll = %d, %v; want the 3 files behind", behind, err)
	}
	for _, f := range []string{"b/2.jpg", "b/1.jpg", "deep/er/still/x.png"} {
		if err := c.Check(context.Background(), c.Snapshot().Lookup(f)); !errors.Is(err, ErrBehind) {
			t.Errorf("Check(%s) = %v; want behind", f, err)
		}
	}
}

// TestCheckAllClears: a loaded snapshot whose SOURCE did not change is
// checked whole by CheckAll, after which nothing is left to check.
func TestCheckAllClears(t *testing.T) {
	_, _, cfg := saved(t)
	c, err := Open(context.Background(), cfg)
	if err != nil || !c.Loaded() {
		t.Fatalf("open: %v", err)
	}
	// Directories written just now are not trusted by their times (racy):
	// let the saved scan look older than it is.
	u := c.unchecked.Load()
	u.trusted = time.Now().Add(time.Hour).UnixNano()
	if behind, err := c.CheckAll(context.Background()); err != nil || behind != 0 {
		t.Fatalf("CheckAll = %d, %v; want none behind", behind, err)
	}
	if c.Verifying() {
		t.Error("an unchanged SOURCE, checked whole, is still being verified")
	}
}

// TestCheckRacyDirectory: a directory whose times are not older than
// the saved scan by racy is not trusted (its listing may have changed in
// the same timestamp granule): it is behind, and a rescan decides.
func TestCheckRacyDirectory(t *testing.T) {
	_, _, cfg := saved(t)
	c, err := Open(context.Background(), cfg)
	if err != nil || !c.Loaded() {
		t.Fatalf("open: %v", err)
	}
	if err := c.Check(context.Background(), c.Snapshot().Lookup("deep/er")); !errors.Is(err, ErrBehind) {
		t.Errorf("a directory written just before the save: Check = %v; want behind", err)
	}
	if err := c.Check(context.Background(), c.Snapshot().Lookup("b/1.jpg")); err != nil {
		t.Errorf("a file is trusted by its version alone: %v", err)
	}
}

// TestRacyDirectoriesTrustedLater: a dataset mounted within a minute of
// its last change is saved with directories Check does not trust (racy):
// a rescan decides, once. A rescan that finds nothing changed keeps the
// snapshot but moves the saved scan's time (Save), so a later remount
// trusts them (found by helper G: the old time was saved again for ever).
func TestRacyDirectoriesTrustedLater(t *testing.T) {
	_, _, cfg := saved(t)
	ctx := context.Background()
	for remount := 1; remount <= 3; remount++ {
		// Time passes: the dataset is days old at this remount.
		cfg.Now = func() time.Time { return time.Now().Add(time.Duration(remount) * 24 * time.Hour) }
		c, err := Open(ctx, cfg)
		if err != nil || !c.Loaded() {
			t.Fatalf("remount %d: open: %v", remount, err)
		}
		err = c.Check(ctx, c.Snapshot().Root)
		t.Logf("remount %d: saved scan at %v, Check(root) = %v", remount, c.Snapshot().Scanned.Format(time.TimeOnly), err)
		if remount > 1 && errors.Is(err, ErrBehind) {
			t.Errorf("remount %d of an unchanged SOURCE: the root is behind again (the saved Scanned never moves: %v)", remount, c.Snapshot().Scanned)
		}
		// What the keeper does: revalidate, check all, refresh if behind, save.
		if _, err := c.Revalidate(ctx); err != nil {
			t.Fatal(err)
		}
		if behind, err := c.CheckAll(ctx); err != nil || behind > 0 {
			if _, err := c.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Save(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCheckShapesBehind: changes made while dlfs was down
// that keep names, sizes and mtimes: a directory replaced by a file of
// the same name, a symlink retargeted to a path of the same length with
// its mtime restored, two directories swapped by renames. Each is behind.
func TestCheckShapesBehind(t *testing.T) {
	_, _, cfg := saved(t)
	root := cfg.Source
	ctx := context.Background()
	mtimeOf := func(p string) time.Time {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		return time.Unix(st.Mtim.Unix())
	}
	// deep/er/still becomes a file.
	still := filepath.Join(root, "deep/er/still")
	m := mtimeOf(still)
	if err := os.RemoveAll(still); err != nil {
		t.Fatal(err)
	}
	write(t, root, "deep/er/still", "")
	os.Chtimes(still, m, m)
	// link -> b/1.jpg becomes link -> b/2.jpg, same length, same mtime.
	lp := filepath.Join(root, "link")
	m = mtimeOf(lp)
	os.Remove(lp)
	if err := os.Symlink("b/2.jpg", lp); err != nil {
		t.Fatal(err)
	}
	ts := []unix.Timespec{unix.NsecToTimespec(m.UnixNano()), unix.NsecToTimespec(m.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, lp, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
	// b and "a x" swapped.
	os.Rename(filepath.Join(root, "b"), filepath.Join(root, "tmp"))
	os.Rename(filepath.Join(root, "a x"), filepath.Join(root, "b"))
	os.Rename(filepath.Join(root, "tmp"), filepath.Join(root, "a x"))

	c, err := Open(ctx, cfg)
	if err != nil || !c.Loaded() {
		t.Fatalf("open: %v", err)
	}
	c.unchecked.Load().trusted = time.Now().Add(time.Hour).UnixNano() // trust the times
	s := c.Snapshot()
	for _, p := range []string{"deep/er/still", "deep/er/still/x.png", "link", "b", "a x", "b/1.jpg", "a x/ü #.jpg"} {
		e := s.Lookup(p)
		if e == nil {
			t.Fatalf("%q not in the saved snapshot", p)
		}
		if err := c.Check(ctx, e); !errors.Is(err, ErrBehind) {
			t.Errorf("Check(%q) = %v; want behind", p, err)
		}
	}
}

// TestCheckBounded: the checks' stats of SOURCE in flight are bounded (a
// PFS that stops answering keeps at most ScanWorkers threads in the
// kernel): with every slot held by a stat that does not return, a check
// gives up at its deadline without a stat of its own, and CheckAll stops
// at the first such failure instead of trying every entry.
func TestCheckBounded(t *testing.T) {
	_, _, cfg := saved(t)
	cfg.StallTimeout = 50 * time.Millisecond
	c, err := Open(context.Background(), cfg)
	if err != nil || !c.Loaded() {
		t.Fatalf("open: %v", err)
	}
	for range cap(c.checks) { // every slot held, as by stats stuck in a hung PFS
		c.checks <- struct{}{}
	}
	err = c.Check(context.Background(), c.Snapshot().Lookup("b/1.jpg"))
	if err == nil || errors.Is(err, ErrBehind) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Check with every stat slot held = %v; want the deadline", err)
	}
	behind, err := c.CheckAll(context.Background())
	if err == nil || behind != 0 {
		t.Errorf("CheckAll with every stat slot held = %d, %v; want an error", behind, err)
	}
	if len(c.checks) != cap(c.checks) {
		t.Errorf("%d of %d slots held after the checks gave up; want only the stuck ones", len(c.checks), cap(c.checks))
	}
}

// TestRevalidateDirsRereads: a file rewritten in place, size and mtime
// kept, is found by listing its directory again (RevalidateDirs), whose
// times say nothing changed; Revalidate alone keeps the old entry.
func TestRevalidateDirsRereads(t *testing.T) {
	_, _, cfg := saved(t)
	p := filepath.Join(cfg.Source, "b/2.jpg")
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("XX"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(p, fi.ModTime(), fi.ModTime())
	c, err := Open(context.Background(), cfg)
	if err != nil || !c.Loaded() {
		t.Fatalf("open: %v", err)
	}
	c.unchecked.Load().trusted = time.Now().Add(time.Hour).UnixNano() // trust the times
	c.lastScan.Store(0)
	old := c.Snapshot().Lookup("b/2.jpg")
	if err := c.Check(context.Background(), old); !errors.Is(err, ErrBehind) {
		t.Fatalf("Check of a file rewritten in place = %v; want behind", err)
	}
	d, err := c.RevalidateDirs(context.Background(), map[uint64]bool{old.Parent().Ino: true})
	if err != nil {
		t.Fatal(err)
	}
	cur := c.Snapshot().Lookup("b/2.jpg")
	if len(d.Changed) != 1 || cur == old || cur.Ctime == old.Ctime || !c.Checked(cur) {
		t.Errorf("after RevalidateDirs: %d changed, the entry %v (checked %v); want b/2.jpg changed, new and checked", len(d.Changed), cur, c.Checked(cur))
	}
}
