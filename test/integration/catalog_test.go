package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSavedCatalog: with --ssd-cache the catalog is saved; a remount
// starts from it and rescans in the background, so a file added while
// unmounted appears; a damaged snapshot is ignored with one log line and
// SOURCE is scanned.
func TestSavedCatalog(t *testing.T) {
	src, ssd := t.TempDir(), t.TempDir()
	for _, f := range treeFiles(20) {
		p := filepath.Join(src, f)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(f), 0o644)
	}
	snap := filepath.Join(ssd, "catalog.snap")
	d := startDlfs(t, src, "--ssd-cache", ssd)
	waitFor(t, "the catalog to be saved", 30*time.Second, func() bool { _, err := os.Stat(snap); return err == nil })
	d.stop(t)

	added := filepath.Join(filepath.Dir(filepath.Join(src, treeFiles(20)[0])), "added.jpg")
	if err := os.WriteFile(added, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	d = startDlfs(t, src, "--ssd-cache", ssd)
	if !strings.Contains(d.Stderr.String(), "loaded the saved snapshot") {
		t.Errorf("the remount did not start from the saved catalog:\n%s", d.Stderr)
	}
	rel, _ := filepath.Rel(src, added)
	waitFor(t, "the file added while unmounted to appear", 30*time.Second, func() bool {
		b, err := os.ReadFile(filepath.Join(d.Mnt, rel))
		return err == nil && string(b) == "new"
	})
	readAll(t, d.Mnt, treeFiles(20), 2, 1, func(name string) []byte { return []byte(name) })
	d.stop(t)

	b, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(snap, b, 0o600); err != nil {
		t.Fatal(err)
	}
	d = startDlfs(t, src, "--ssd-cache", ssd)
	if log := d.Stderr.String(); strings.Count(log, "ignoring the saved snapshot") != 1 || strings.Contains(log, "loaded the saved snapshot") {
		t.Errorf("a damaged snapshot: want one line saying it was ignored, got:\n%s", log)
	}
	readAll(t, d.Mnt, append(treeFiles(20), rel), 2, 2, func(name string) []byte {
		if name == rel {
			return []byte("new")
		}
		return []byte(name)
	})
}
