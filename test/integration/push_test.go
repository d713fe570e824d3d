package integration

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPushAhead: an announced epoch, read after the kernel dropped its
// caches (pages, dentries and inodes): dlfs pushes the samples from its
// RAM tier into the page cache ahead of the reader, opening each through
// the mount since the kernel forgot them, so only the trip samples' reads
// (one in 32) reach dlfs, and every byte read is SOURCE's. A file changed
// at SOURCE after it was pushed reads anew after a refresh.
func TestPushAhead(t *testing.T) {
	src := t.TempDir()
	files := dataset(t, src, 200)
	d := startDlfs(t, src, "--ram-cache", "256MiB", "--staging", "256MiB")
	readAll(t, d.Mnt, files, 4, 1, fromSource(src)) // into the RAM tier
	dropPageCache(t)

	served := func(st map[string]any) float64 {
		var n float64
		for _, tier := range []string{"ram", "stage", "ssd", "peer", "moved", "pfs"} {
			n += num(st, "served", tier, "reads")
		}
		return n
	}
	before := served(dlfsStats(t, d.Mnt))
	line := "job=p root=. seed=3 epoch=1 world=1 ranks=0 batch=8 workers=1\n"
	if err := os.WriteFile(filepath.Join(d.Mnt, ".dlfs/control"), []byte(line), 0); err != nil {
		t.Fatal(err)
	}
	trips := len(files) / 32
	waitFor(t, "the pushes", 30*time.Second, func() bool {
		return num(dlfsStats(t, d.Mnt), "prefetch", "pushed") >= float64(len(files)-trips)
	})

	f, err := os.Open(filepath.Join(d.Mnt, ".dlfs/jobs/p/rank-0/epoch-1"))
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		order = append(order, strings.TrimPrefix(sc.Text(), "/"))
	}
	f.Close()
	if len(order) != len(files) {
		t.Fatalf("the plan has %d files, want %d", len(order), len(files))
	}
	want := fromSource(src)
	for _, rel := range order {
		b, err := os.ReadFile(filepath.Join(d.Mnt, rel))
		if err != nil || !bytes.Equal(b, want(rel)) {
			t.Fatalf("%s: %d bytes, err %v; differs from SOURCE", rel, len(b), err)
		}
	}
	st := dlfsStats(t, d.Mnt)
	reads := served(st) - before
	t.Logf("reads reaching dlfs: %.0f of %d samples; prefetch %v", reads, len(files), st["prefetch"])
	// The trips, and a few pages the kernel may have reclaimed meanwhile.
	if reads > float64(len(files)/4) {
		t.Errorf("%.0f reads reached dlfs for %d pushed samples and %d trips", reads, len(files)-trips, trips)
	}
	if n := num(st, "prefetch", "push_failed"); n != 0 {
		t.Errorf("%.0f pushes failed", n)
	}

	// Changed at SOURCE after it was pushed (and read): a refresh drops
	// the kernel's copy.
	rel := order[len(order)-1]
	old := want(rel)
	changed := bytes.Repeat([]byte{'z'}, len(old))
	if err := os.WriteFile(filepath.Join(src, rel), changed, 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(src, rel), later, later); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.Mnt, ".dlfs/control"), []byte("refresh\n"), 0); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(d.Mnt, rel)); err != nil || !bytes.Equal(b, changed) {
		t.Fatalf("%s after the refresh: %d bytes, err %v; want the new bytes", rel, len(b), err)
	}
}
