package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWarmup runs dlfs warmup as a user would: the warm-up fetches the
// dataset, after which reading it costs the PFS nothing; --check reports
// it in RAM; --evict drops it; bad paths fail with one line; a warm-up of
// more than the caches hold says how much fits and warms that.
func TestWarmup(t *testing.T) {
	src := t.TempDir()
	files := dataset(t, filepath.Join(src, "train"), 120)
	pfs := startPFS(t, src, "-open-latency", "1ms")
	d := startDlfs(t, pfs.Mnt, "--ram-cache", "256MiB")
	train := filepath.Join(d.Mnt, "train")

	code, _, stderr := runCmd(t, bin.dlfs, "warmup", train)
	if code != 0 || !strings.Contains(stderr, "100.0%") {
		t.Fatalf("warmup: exit %d, %q", code, stderr)
	}
	before := pfs.counters(t).Bytes
	dropPageCache(t)
	readAll(t, train, files, 4, 1, fromSource(filepath.Join(src, "train")))
	if got := pfs.counters(t).Bytes - before; got != 0 {
		t.Errorf("reading the warmed dataset cost %d PFS bytes", got)
	}
	code, out, _ := runCmd(t, bin.dlfs, "warmup", "--check", train)
	if code != 0 || !strings.Contains(out, "120 files") || !strings.Contains(out, "RAM 100.0%") {
		t.Errorf("check: exit %d, %q", code, out)
	}
	if code, _, stderr := runCmd(t, bin.dlfs, "warmup", "--evict", train); code != 0 {
		t.Fatalf("evict: exit %d, %q", code, stderr)
	}
	if _, out, _ := runCmd(t, bin.dlfs, "warmup", "--check", train); !strings.Contains(out, "not cached 100.0%") {
		t.Errorf("check after evict: %q", out)
	}

	// Bad input: one line, exit 1.
	outside := t.TempDir()
	for _, args := range [][]string{
		{"warmup", filepath.Join(d.Mnt, "nope")},
		{"warmup", outside},
		{"warmup", "--check", "--evict", train},
	} {
		code, _, stderr := runCmd(t, bin.dlfs, args...)
		if code != 1 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%v: exit %d, %q; want 1 and one line", args, code, stderr)
		}
	}

	// More than the caches hold: it says so, warms what fits, exits 0.
	small := startDlfs(t, pfs.Mnt, "--ram-cache", "4MiB")
	code, _, stderr = runCmd(t, bin.dlfs, "warmup", small.Mnt)
	if code != 0 || !strings.Contains(stderr, "the caches hold ") || !strings.Contains(stderr, "of 120 files") {
		t.Errorf("warmup past the caches: exit %d, %q", code, stderr)
	}
	if _, err := os.ReadFile(filepath.Join(small.Mnt, "train", files[0])); err != nil {
		t.Error(err)
	}

	// Interrupted half-way: it stops, says so, and what it cached serves
	// the right bytes.
	slow := startPFS(t, src, "-open-latency", "30ms")
	d2 := startDlfs(t, slow.Mnt, "--ram-cache", "256MiB")
	cmd := exec.Command(bin.dlfs, "warmup", d2.Mnt)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); num(dlfsStats(t, d2.Mnt), "warmup", "done_files") == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the warm-up never started")
		}
	}
	cmd.Process.Signal(os.Interrupt)
	err := cmd.Wait()
	st := dlfsStats(t, d2.Mnt)
	if err == nil || !strings.Contains(errOut.String(), "interrupted") || st["warmup"].(map[string]any)["state"] != "stopped" {
		t.Errorf("interrupted warm-up: %v, %q, %v", err, errOut.String(), st["warmup"])
	}
	readAll(t, filepath.Join(d2.Mnt, "train"), files, 4, 2, fromSource(filepath.Join(src, "train")))
}

// TestWarmupCluster: a warm-up started on one node of two leaves each
// sample on its owner: afterwards the other node reads the whole dataset
// without the PFS, and the first node's RAM holds only its own share.
func TestWarmupCluster(t *testing.T) {
	src := t.TempDir()
	files := dataset(t, filepath.Join(src, "train"), 100)
	pfs := startPFS(t, src)
	a, b := pair(t, pfs.Mnt, []string{"--ram-cache", "256MiB"})
	if code, _, stderr := runCmd(t, bin.dlfs, "warmup", filepath.Join(a.Mnt, "train")); code != 0 {
		t.Fatalf("warmup: exit %d, %q", code, stderr)
	}
	before := pfs.counters(t).Bytes
	dropPageCache(t)
	readAll(t, filepath.Join(b.Mnt, "train"), files, 4, 3, fromSource(filepath.Join(src, "train")))
	if got := pfs.counters(t).Bytes - before; got != 0 {
		t.Errorf("b read %d PFS bytes after a warmed the dataset", got)
	}
	_, out, _ := runCmd(t, bin.dlfs, "warmup", "--check", filepath.Join(a.Mnt, "train"))
	var ram, ssd, peers float64
	if i := strings.Index(out, "RAM "); i >= 0 {
		fmt.Sscanf(out[i:], "RAM %f%%, SSD %f%%, peers %f%%", &ram, &ssd, &peers)
	}
	t.Logf("a: %s", strings.TrimSpace(out))
	if ram < 20 || ram > 80 || peers < 20 {
		t.Errorf("a's RAM holds %.1f%% and peers own %.1f%%: want each node its share", ram, peers)
	}
}
