package catalog

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

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
