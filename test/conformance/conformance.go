// Package conformance checks that a mount shows exactly what its source
// holds. The same checks run on an in-process mount (package daemon) and on
// the dlfs binary (test/integration).
package conformance

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/datagen"
)

// OddTree writes a tree with the shapes that break naive filesystems:
// nested directories, names with spaces, unicode and '#', empty and
// multi-MB files, a hidden directory, unusual modes, old mtimes and
// symlinks. It returns dir.
func OddTree(t testing.TB, dir string) string {
	t.Helper()
	mk := func(rel string, size int64, mode os.FileMode) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, datagen.Bytes(size, uint64(len(rel))*7919+uint64(size)), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	mk("cats/tabby 01.jpg", 110_000, 0o644)
	mk("cats/ünïcödé-猫.jpg", 95_000, 0o644)
	mk("cats/#hash#name.JPG", 1, 0o600)
	mk("cats/empty.jpg", 0, 0o644)
	mk("dogs/deep/er/still deeper/pup.png", 4_200_000, 0o640) // multi-MB, crosses blocks
	mk("dogs/sub-x/a.jpg", 12_345, 0o444)
	mk("dogs/sub/b.jpg", 54_321, 0o755)
	mk(".hidden/secret.jpg", 777, 0o644)
	mk("README", 1234, 0o644)
	old := time.Date(2001, 2, 3, 4, 5, 6, 789_000_000, time.UTC)
	if err := os.Chtimes(filepath.Join(dir, "cats/tabby 01.jpg"), old, old); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../cats/tabby 01.jpg", filepath.Join(dir, "dogs/link to tabby")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("dogs/sub", filepath.Join(dir, "dirlink")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Tree compares the mount mnt with its source src: the same names, types,
// sizes, modes, mtimes, symlink targets and bytes, and nothing else.
func Tree(t testing.TB, src, mnt string) {
	t.Helper()
	want := walk(t, src)
	got := walk(t, mnt)
	for rel, w := range want {
		g, ok := got[rel]
		if !ok {
			t.Errorf("%s: in SOURCE, missing from the mount", rel)
			continue
		}
		if g.mode != w.mode {
			t.Errorf("%s: mode %v, want %v", rel, g.mode, w.mode)
		}
		if w.mode.IsRegular() && g.size != w.size {
			t.Errorf("%s: size %d, want %d", rel, g.size, w.size)
		}
		if !g.mtime.Equal(w.mtime) {
			t.Errorf("%s: mtime %v, want %v", rel, g.mtime, w.mtime)
		}
		if g.uid != w.uid || g.gid != w.gid {
			t.Errorf("%s: owner %d:%d, want %d:%d", rel, g.uid, g.gid, w.uid, w.gid)
		}
		if g.target != w.target {
			t.Errorf("%s: symlink target %q, want %q", rel, g.target, w.target)
		}
		if w.mode.IsRegular() {
			wb, err := os.ReadFile(filepath.Join(src, rel))
			if err != nil {
				t.Fatal(err)
			}
			gb, err := os.ReadFile(filepath.Join(mnt, rel))
			if err != nil {
				t.Errorf("%s: read through the mount: %v", rel, err)
			} else if !bytes.Equal(gb, wb) {
				t.Errorf("%s: bytes differ from SOURCE (%d vs %d bytes)", rel, len(gb), len(wb))
			}
		}
	}
	for rel := range got {
		if _, ok := want[rel]; !ok {
			t.Errorf("%s: in the mount, not in SOURCE", rel)
		}
	}
}

type info struct {
	mode     fs.FileMode
	size     int64
	mtime    time.Time
	uid, gid uint32
	target   string
}

func walk(t testing.TB, root string) map[string]info {
	t.Helper()
	out := map[string]info{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		in := info{mode: fi.Mode(), size: fi.Size(), mtime: fi.ModTime(), uid: st.Uid, gid: st.Gid}
		if fi.Mode()&fs.ModeSymlink != 0 {
			if in.target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		out[rel] = in
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return out
}

// StatsKeys fails t unless m has every key .dlfs/stats promises.
func StatsKeys(t testing.TB, m map[string]any) {
	t.Helper()
	for _, k := range []string{"node", "uptime_seconds", "served", "fetched", "sources", "coalescing", "pfs", "cache", "prefetch", "cluster", "jobs"} {
		if _, ok := m[k]; !ok {
			t.Errorf("stats lacks %q", k)
		}
	}
	co, _ := m["coalescing"].(map[string]any)
	for _, k := range []string{"coalesced_reads", "coalesced_samples", "pfs_calls_per_sample"} {
		if _, ok := co[k]; !ok {
			t.Errorf("stats.coalescing lacks %s", k)
		}
	}
	cl, _ := m["cluster"].(map[string]any)
	if pl, _ := cl["placement"].(map[string]any); pl != nil || cl["gossip"] != nil {
		for _, k := range []string{"mode", "planned_samples", "planned_reads", "local_reads"} {
			if _, ok := pl[k]; !ok {
				t.Errorf("stats.cluster.placement lacks %s", k)
			}
		}
	}
	served, _ := m["served"].(map[string]any)
	for _, tier := range []string{"ram", "stage", "ssd", "peer", "moved", "pfs"} {
		s, _ := served[tier].(map[string]any)
		if _, ok := s["reads"]; !ok {
			t.Errorf("stats.served.%s lacks reads", tier)
		}
		if _, ok := s["bytes"]; !ok {
			t.Errorf("stats.served.%s lacks bytes", tier)
		}
	}
	pfs, _ := m["pfs"].(map[string]any)
	for _, k := range []string{"opens", "read_ops", "bytes"} {
		if _, ok := pfs[k]; !ok {
			t.Errorf("stats.pfs lacks %s", k)
		}
	}
	cache, _ := m["cache"].(map[string]any)
	for _, tier := range []string{"ram", "ssd"} {
		c, _ := cache[tier].(map[string]any)
		for _, k := range []string{"entries", "bytes", "capacity_bytes"} {
			if _, ok := c[k]; !ok {
				t.Errorf("stats.cache.%s lacks %s", tier, k)
			}
		}
	}
}
