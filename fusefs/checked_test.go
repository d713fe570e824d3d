package fusefs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/dlfs/dlfs/catalog"
)

// checkedTree is a tree over a catalog loaded from its saved snapshot,
// which checks entries as the daemon does: catalog.Check, and an entry
// behind SOURCE brought up to date by a refresh before ErrBehind.
type checkedTree struct {
	tree
	checks, behind atomic.Int64
}

func (c *checkedTree) Check(ctx context.Context, e *catalog.Entry) error {
	c.checks.Add(1)
	err := c.cat.Check(ctx, e)
	if errors.Is(err, catalog.ErrBehind) {
		c.behind.Add(1)
		if _, rerr := c.cat.Refresh(ctx); rerr != nil {
			return rerr
		}
	}
	return err
}

func (c *checkedTree) Checked(e *catalog.Entry) bool { return c.cat.Checked(e) }

// TestCheckedBeforeServed: over a catalog loaded from a saved snapshot,
// a file that grew while the snapshot was down is looked up with its new
// size (the lookup checked it, found it behind, and resolved it again
// after the refresh), and so read whole; an unchanged one is checked
// once and read as it is.
func TestCheckedBeforeServed(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	root := t.TempDir()
	for name, body := range map[string]string{"c/grew.jpg": "aaa", "c/same.jpg": "sss"} {
		p := filepath.Join(root, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := catalog.DefaultConfig(root)
	cfg.Saved = filepath.Join(t.TempDir(), "catalog.snap")
	cat, err := catalog.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.Save(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "c/grew.jpg"), []byte("bbbbbbbbb"), 0o644); err != nil {
		t.Fatal(err)
	}
	if cat, err = catalog.Open(context.Background(), cfg); err != nil || !cat.Loaded() {
		t.Fatalf("reopen: %v", err)
	}
	data := &checkedTree{tree: tree{cat}}
	f := New(Config{ListingAttrs: true}, data, &plane{})
	mnt := t.TempDir()
	server, err := f.Mount(mnt, "dlfs-test")
	if err != nil {
		t.Skipf("cannot mount: %v", err)
	}
	t.Cleanup(func() { _ = server.Unmount() })

	// A listing with attributes first: it must not hand the kernel the
	// old size of a file not checked yet.
	if _, err := os.ReadDir(filepath.Join(mnt, "c")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(mnt, "c/grew.jpg")); err != nil || fi.Size() != 9 {
		t.Fatalf("stat of a file that grew while the snapshot was saved: %v, %v; want SOURCE's 9 bytes", fi, err)
	}
	got, err := os.ReadFile(filepath.Join(mnt, "c/grew.jpg"))
	if err != nil || string(got) != "bbbbbbbbb" {
		t.Errorf("a file that grew while the snapshot was saved: read %q, %v; want SOURCE's 9 bytes", got, err)
	}
	if data.behind.Load() == 0 {
		t.Error("no check found the grown file behind SOURCE")
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "c/same.jpg")); err != nil || string(got) != "sss" {
		t.Errorf("an unchanged file: %q, %v", got, err)
	}
	if data.checks.Load() == 0 {
		t.Error("nothing was checked")
	}
}
