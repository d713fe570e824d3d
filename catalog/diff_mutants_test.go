package catalog

import (
	"context"
	"syscall"
	"testing"
)

// TestRefreshDiffSeesCtimeAndInode: a file whose version changed in its
// ctime alone, or its inode number alone (rewritten in place with its
// size and mtime put back, or replaced by a rename the way rsync does), is
// listed by the refresh's diff, whose Changed and Removed entries are
// what the tiers drop, and the new snapshot has its new version. A file
// that did not change is not listed.
func TestRefreshDiffSeesCtimeAndInode(t *testing.T) {
	base := File{Path: "d/a", Mode: syscall.S_IFREG | 0o644, Size: 10, Mtime: 1e18, Ctime: 1e18 + 5, Ino: 77}
	other := File{Path: "d/b", Mode: syscall.S_IFREG | 0o644, Size: 20, Mtime: 1e18, Ctime: 1e18 + 6, Ino: 78}
	for _, tc := range []struct {
		name   string
		change func(f *File)
		listed bool
	}{
		{"nothing", func(*File) {}, false},
		{"ctime alone", func(f *File) { f.Ctime++ }, true},
		{"inode alone", func(f *File) { f.Ino++ }, true},
		{"size alone", func(f *File) { f.Size++ }, true},
		{"mtime alone", func(f *File) { f.Mtime++ }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &changingLister{files: []File{base, other}}
			cfg := DefaultConfig(t.TempDir())
			cfg.Lister = l
			c, err := Open(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			now := base
			tc.change(&now)
			l.set(now, other)
			d, err := c.Refresh(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			listed := func(es []*Entry, path string) bool {
				for _, e := range es {
					if e.Path() == path {
						return true
					}
				}
				return false
			}
			if got := listed(d.Changed, "d/a") || listed(d.Removed, "d/a"); got != tc.listed {
				t.Errorf("d/a listed as changed or removed: %v, want %v (diff: %d changed, %d removed, %d added)",
					got, tc.listed, len(d.Changed), len(d.Removed), len(d.Added))
			}
			if listed(d.Changed, "d/b") || listed(d.Removed, "d/b") {
				t.Error("d/b, unchanged, was listed")
			}
			e := c.Snapshot().Lookup("d/a")
			if e == nil || e.Ctime != now.Ctime || e.SrcIno != now.Ino || e.Size != now.Size || e.Mtime != now.Mtime {
				t.Errorf("the snapshot after the refresh has d/a as %+v, want the listed version %+v", e, now)
			}
		})
	}
}
