package catalog

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func write(t testing.TB, root, rel, data string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func open(t *testing.T, root string) *Catalog {
	t.Helper()
	cfg := DefaultConfig(root)
	cfg.Hide = []string{".dlfs"}
	c, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestScan(t *testing.T) {
	root := t.TempDir()
	write(t, root, "b/2.jpg", "22")
	write(t, root, "b/1.jpg", "1")
	write(t, root, "a x/ü #.jpg", "")
	write(t, root, ".hidden/h", "h")
	write(t, root, ".dlfs/shadowed", "x")
	if err := os.Symlink("b/1.jpg", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := open(t, root)
	s := c.Snapshot()
	if s.Files != 4 || s.Dirs != 4 || s.Bytes != 4 {
		t.Errorf("files %d dirs %d bytes %d, want 4, 4 (root, a x, b, .hidden), 4", s.Files, s.Dirs, s.Bytes)
	}
	var names []string
	for e := range s.Root.Children() {
		names = append(names, e.Name)
	}
	if got := strings.Join(names, ","); got != ".hidden,a x,b,link" {
		t.Errorf("root children %q: want sorted, without .dlfs and the fifo", got)
	}
	e := s.Lookup("b/2.jpg")
	if e == nil || e.Size != 2 || !e.IsRegular() || e.Path() != "b/2.jpg" {
		t.Fatalf("Lookup(b/2.jpg) = %+v", e)
	}
	if s.ByIno(e.Ino) != e {
		t.Error("ByIno does not find the entry")
	}
	if l := s.Lookup("link"); l == nil || !l.IsSymlink() || l.Target() != "b/1.jpg" {
		t.Errorf("symlink: %+v", l)
	}
	for _, p := range []string{"nope", "b/nope", "b/2.jpg/x", ".dlfs"} {
		if s.Lookup(p) != nil {
			t.Errorf("Lookup(%q) found something", p)
		}
	}
	if s.Lookup("") != s.Root || s.Lookup(".") != s.Root {
		t.Error("the empty path is not the root")
	}
}

func TestRefresh(t *testing.T) {
	root := t.TempDir()
	write(t, root, "keep", "k")
	write(t, root, "change", "c")
	write(t, root, "gone", "g")
	write(t, root, "retyped", "file, then a directory")
	c := open(t, root)
	old := c.Snapshot()

	write(t, root, "change", "changed")
	write(t, root, "new", "n")
	os.Remove(filepath.Join(root, "gone"))
	os.Remove(filepath.Join(root, "retyped"))
	write(t, root, "retyped/x", "x")
	d, err := c.Refresh(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	paths := func(es []*Entry) string {
		var s []string
		for _, e := range es {
			s = append(s, e.Path())
		}
		return strings.Join(s, ",")
	}
	if got := paths(d.Changed); got != "change" {
		t.Errorf("changed %q", got)
	}
	if got := paths(d.Removed); got != "gone,retyped" {
		t.Errorf("removed %q", got)
	}
	if got := paths(d.Added); got != "new,retyped" {
		t.Errorf("added %q", got)
	}
	cur := c.Snapshot()
	if cur.Lookup("keep").Ino != old.Lookup("keep").Ino || cur.Lookup("change").Ino != old.Lookup("change").Ino {
		t.Error("inode numbers of surviving paths changed")
	}
	if cur.Lookup("retyped").Ino == old.Lookup("retyped").Ino {
		t.Error("a path whose type changed kept its inode number")
	}
	if old.Lookup("gone") == nil || cur.Lookup("gone") != nil {
		t.Error("the old snapshot must stay intact and the new one must lack the removed file")
	}
}

// TestRevalidate: a rescan by directories finds what was added, removed
// and renamed, reads only the directories that changed, trusts no
// directory that changed shortly before the previous scan, and keeps the
// snapshot when nothing changed.
func TestRevalidate(t *testing.T) {
	root := t.TempDir()
	for _, p := range []string{"a/1", "a/2", "b/1", "b/deep/1", "c/1", "d/1", "e/1"} {
		write(t, root, p, p)
	}
	c := open(t, root)
	// The tree was made just now: nothing in it is trusted yet.
	if d, err := c.Revalidate(context.Background()); err != nil || d.Reused != 0 {
		t.Fatalf("revalidated a fresh tree: %d directories unread, %v; want 0", d.Reused, err)
	}
	// As if the last scan were long after the tree was made.
	snap := c.Snapshot()
	snap.Scanned = time.Now().Add(time.Hour)
	d, err := c.Revalidate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if d.Reused != 7 || c.Snapshot() != snap || len(d.Added)+len(d.Removed)+len(d.Changed) != 0 {
		t.Fatalf("unchanged tree: %d of 7 directories unread, snapshot kept %v, diff %+v", d.Reused, c.Snapshot() == snap, d)
	}
	write(t, root, "a/3", "new")
	os.Remove(filepath.Join(root, "b/deep/1"))
	os.Rename(filepath.Join(root, "c/1"), filepath.Join(root, "c/one"))
	write(t, root, "d/1", "rewritten in place") // its directory does not change
	d, err = c.Revalidate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	paths := func(es []*Entry) (s []string) {
		for _, e := range es {
			s = append(s, e.Path())
		}
		return s
	}
	if got := fmt.Sprint(paths(d.Added), paths(d.Removed), paths(d.Changed)); got != "[a/3 c/one] [b/deep/1 c/1] [a b/deep c]" {
		t.Errorf("added, removed, changed: %s", got)
	}
	// root, b, d, e are unchanged; a, b/deep and c were read.
	if d.Reused != 4 {
		t.Errorf("%d directories unread, want 4", d.Reused)
	}
	cur := c.Snapshot()
	if e := cur.Lookup("e/1"); e == nil || e.Ino != snap.Lookup("e/1").Ino || e.Parent() != cur.Lookup("e") {
		t.Error("an unread directory's entry lost its inode number or its parent")
	}
	cur.Walk(func(e *Entry) {
		if e != cur.Root && cur.Lookup(e.Path()) != e || cur.ByIno(e.Ino) != e {
			t.Errorf("%s is not where its path and inode number say", e.Path())
		}
	})
	// A full refresh sees the file rewritten in place.
	if d, err := c.Refresh(context.Background()); err != nil || fmt.Sprint(paths(d.Changed)) != "[d/1]" {
		t.Errorf("refresh after a rewrite in place: changed %v, %v", paths(d.Changed), err)
	}
}

func TestOpenErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	write(t, filepath.Dir(file), "f", "x")
	for name, src := range map[string]string{"missing": "/no/such/dir", "file": file} {
		t.Run(name, func(t *testing.T) {
			if _, err := Open(context.Background(), DefaultConfig(src)); err == nil {
				t.Fatal("no error")
			}
		})
	}
}

type listed []File

func (l listed) List(context.Context) ([]File, error) { return l, nil }

// TestLister: a listed dataset becomes a tree, with implied parents, bad
// paths and clashes left out, and inodes kept across a refresh.
func TestLister(t *testing.T) {
	files := listed{
		{Path: "train/b/2.jpg", Mode: syscall.S_IFREG | 0o644, Size: 2, Mtime: 5},
		{Path: "train/a/1.jpg", Mode: syscall.S_IFREG | 0o600, Size: 1, Mtime: 5},
		{Path: "train", Mode: syscall.S_IFDIR | 0o750, Mtime: 9},
		{Path: "empty", Mode: syscall.S_IFDIR | 0o700},
		{Path: "link", Mode: syscall.S_IFLNK | 0o777, Target: "train"},
		{Path: "../escape", Mode: syscall.S_IFREG | 0o644},
		{Path: "train/a/1.jpg/x", Mode: syscall.S_IFREG | 0o644},
		{Path: ".dlfs", Mode: syscall.S_IFREG | 0o644},
	}
	cfg := DefaultConfig(t.TempDir())
	cfg.Lister, cfg.Hide = files, []string{".dlfs"}
	c, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := c.Snapshot()
	if s.Files != 2 || s.Dirs != 5 || s.Skipped != 3 || s.Bytes != 3 {
		t.Fatalf("files %d dirs %d skipped %d bytes %d", s.Files, s.Dirs, s.Skipped, s.Bytes)
	}
	tr := s.Lookup("train")
	if tr.Mode != syscall.S_IFDIR|0o750 || tr.Mtime != 9 || tr.NumChildren() != 2 {
		t.Errorf("train: %+v", tr)
	}
	if a := s.Lookup("train/a"); a == nil || a.Mode != syscall.S_IFDIR|0o755 {
		t.Errorf("implied train/a: %+v", a)
	}
	if e := s.Lookup("train/a/1.jpg"); e == nil || e.Size != 1 || s.ByIno(e.Ino) != e {
		t.Errorf("train/a/1.jpg: %+v", e)
	}
	if l := s.Lookup("link"); l == nil || l.Target() != "train" {
		t.Errorf("link: %+v", l)
	}
	ino := s.Lookup("train/b/2.jpg").Ino
	if _, err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := c.Snapshot().Lookup("train/b/2.jpg").Ino; got != ino {
		t.Errorf("inode %d after refresh, was %d", got, ino)
	}
}

func TestAddSize(t *testing.T) {
	for _, c := range []struct{ a, b, want int64 }{
		{1, 2, 3}, {0, math.MaxInt64, math.MaxInt64}, {math.MaxInt64, 1, math.MaxInt64}, {math.MaxInt64 / 2, math.MaxInt64/2 + 2, math.MaxInt64},
	} {
		if got := AddSize(c.a, c.b); got != c.want {
			t.Errorf("AddSize(%d, %d) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
