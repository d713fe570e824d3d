package catalog

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestOwners: each entry keeps its owner and group through a scan, a saved
// snapshot and a refresh, which reports a change of owner.
func TestOwners(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	root := t.TempDir()
	write(t, root, "a/1.jpg", "1")
	write(t, root, "a/2.jpg", "2")
	write(t, root, "b/3.jpg", "3")
	own := map[string][2]uint32{"a": {0, 0}, "a/1.jpg": {1234, 5678}, "a/2.jpg": {4_000_000_001, 77}, "b": {55, 66}, "b/3.jpg": {1234, 5678}}
	for p, o := range own {
		if err := os.Lchown(filepath.Join(root, p), int(o[0]), int(o[1])); err != nil {
			t.Fatal(err)
		}
	}
	check := func(what string, s *Snapshot) {
		t.Helper()
		for p, o := range own {
			e := s.Lookup(p)
			if e == nil || e.Uid() != o[0] || e.Gid() != o[1] {
				t.Errorf("%s: %s has owner %v, want %v", what, p, e, o)
				continue
			}
		}
	}
	cfg := DefaultConfig(root)
	cfg.Saved = filepath.Join(t.TempDir(), "catalog.snap")
	cfg.Identity = "owners"
	c, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	check("scan", c.Snapshot())
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	again, err := Open(context.Background(), cfg)
	if err != nil || !again.Loaded() {
		t.Fatalf("reload: %v, loaded %v", err, again != nil && again.Loaded())
	}
	check("saved", again.Snapshot())

	own["b/3.jpg"] = [2]uint32{99, 98}
	if err := os.Lchown(filepath.Join(root, "b/3.jpg"), 99, 98); err != nil {
		t.Fatal(err)
	}
	d, err := c.Refresh(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Changed) != 1 || d.Changed[0].Path() != "b/3.jpg" {
		t.Errorf("refresh after a chown: changed %v", d.Changed)
	}
	check("refresh", c.Snapshot())
}

// TestOwnerTable: indexes are stable and shared, and concurrent use is
// safe.
func TestOwnerTable(t *testing.T) {
	if uid, gid := ownerAt(0); uid != 0 || gid != 0 {
		t.Errorf("index 0 is (%d, %d), want root's", uid, gid)
	}
	var wg sync.WaitGroup
	got := make([][]uint32, 4)
	for g := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3 * ownerPage { // across pages
				o, err := ownerOf(uint32(i), 900_000+uint32(i%7), 0)
				if err != nil {
					t.Error(err)
					return
				}
				got[g] = append(got[g], o)
				if uid, gid := ownerAt(o); uid != uint32(i) || gid != 900_000+uint32(i%7) {
					t.Errorf("index %d is (%d, %d)", o, uid, gid)
					return
				}
			}
		}()
	}
	wg.Wait()
	for g := range got {
		for i := range got[g] {
			if got[g][i] != got[0][i] {
				t.Fatalf("pair %d has indexes %d and %d", i, got[0][i], got[g][i])
			}
		}
	}
}
