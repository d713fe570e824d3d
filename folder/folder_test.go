package folder

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/dlfs/dlfs/catalog"
)

func tree(t *testing.T, files []string, links map[string]string) *catalog.Snapshot {
	t.Helper()
	root := t.TempDir()
	for _, f := range files {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, "/") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		} else {
			if err := os.WriteFile(p, []byte(f), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for link, target := range links {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	c, err := catalog.Open(context.Background(), catalog.DefaultConfig(root))
	if err != nil {
		t.Fatal(err)
	}
	return c.Snapshot()
}

// TestOrder pins torchvision's ordering rules; the integration tests check
// the same against torchvision itself.
func TestOrder(t *testing.T) {
	snap := tree(t, []string{
		"data/b/2.jpg", "data/b/1.JPG", "data/b/notes.txt",
		"data/b/sub/deeper/4.png", "data/b/sub-x/3.jpeg", "data/b/sub/5.jpg",
		"data/.hidden/h.jpg", "data/a/x.webp", "data/empty/", "data/readme.jpg",
		"elsewhere/e.jpg",
	}, map[string]string{
		"data/linked":       "../elsewhere",
		"data/a/dangling":   "nowhere.jpg",
		"data/a/self":       ".",
		"data/a/outside":    "/etc",
		"data/b/alias.jpeg": "2.jpg",
	})
	idx, err := Build(snap, "data", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(idx.Classes, ","); got != ".hidden,a,b,empty,linked" {
		t.Errorf("classes %q", got)
	}
	var got []string
	for _, s := range idx.Samples {
		got = append(got, s.Path()+"="+string(rune('0'+s.Target)))
		if s.Entry == nil || !s.Entry.IsRegular() {
			t.Errorf("%s resolves to %+v", s.Path(), s.Entry)
		}
	}
	want := []string{
		"data/.hidden/h.jpg=0",
		"data/a/x.webp=1",
	}
	// data/a/self -> . is walked 40 links deep, as the kernel allows.
	self := "data/a"
	for i := 0; i < maxLinks; i++ {
		self += "/self"
		want = append(want, self+"/x.webp=1")
	}
	want = append(want,
		"data/b/1.JPG=2", "data/b/2.jpg=2", "data/b/alias.jpeg=2",
		"data/b/sub/5.jpg=2",
		"data/b/sub-x/3.jpeg=2", // "sub-x" sorts before "sub/deeper"
		"data/b/sub/deeper/4.png=2",
		"data/linked/e.jpg=4",
	)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("samples\n got %v\nwant %v", got, want)
	}
	// data/a/outside -> /etc, seen in data/a and 39 of its self levels (the
	// 40th runs out of links first).
	if idx.Unresolved != 40 {
		t.Errorf("unresolved %d, want 40", idx.Unresolved)
	}
	for _, s := range idx.Samples {
		if s.Path() == "data/b/alias.jpeg" && s.Entry.Path() != "data/b/2.jpg" {
			t.Errorf("alias resolves to %s", s.Entry.Path())
		}
		// Only a path through a link is stored: the rest cost 24 bytes.
		if direct := s.Path() == s.Entry.Path(); direct != (s.link == nil) {
			t.Errorf("%s: stored path %v, want it stored only through a link", s.Path(), s.link != nil)
		}
	}
	if z := unsafe.Sizeof(Sample{}); z != 24 {
		t.Errorf("a sample is %d bytes, want 24", z)
	}
	if _, err := Build(snap, "data/b/2.jpg", nil); err == nil {
		t.Error("a file accepted as root")
	}
	if _, err := Build(snap, "nope", nil); err == nil {
		t.Error("a missing root accepted")
	}
}

// TestSymlinkCycleBounded: two links to the parent in a class make
// os.walk's walk 2^40 directories; Build refuses it within its budget,
// naming the cause, instead of burning the CPU for minutes.
func TestSymlinkCycleBounded(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "cls"), 0o755)
	os.WriteFile(filepath.Join(root, "cls", "x.jpg"), []byte("x"), 0o644)
	os.Symlink("..", filepath.Join(root, "cls", "a"))
	os.Symlink("..", filepath.Join(root, "cls", "b"))
	cat, err := catalog.Open(context.Background(), catalog.DefaultConfig(root))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = Build(cat.Snapshot(), "", nil)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "symlink cycle") {
		t.Fatalf("got %v, want ErrTooLarge naming a symlink cycle", err)
	}
	t.Logf("refused in %v", time.Since(start))
}
