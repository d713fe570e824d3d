package catalog

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func write(t *testing.T, root, rel, data string) {
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
	for _, e := range s.Root.Children() {
		names = append(names, e.Name)
	}
	if got := strings.Join(names, ","); got != ".hidden,a x,b,link" {
		t.Errorf("root children %q: want sorted, without .dlfs and the fifo", got)
	}
	e := s.Lookup("b/2.jpg")
	if e == nil || e.Size != 2 || !e.IsRegular() || e.Path != "b/2.jpg" {
		t.Fatalf("Lookup(b/2.jpg) = %+v", e)
	}
	if s.ByIno(e.Ino) != e {
		t.Error("ByIno does not find the entry")
	}
	if l := s.Lookup("link"); l == nil || !l.IsSymlink() || l.Target != "b/1.jpg" {
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
			s = append(s, e.Path)
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
