package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/mountproc"
)

// Issue 30, "Conventions": what an operator coming from other tools
// expects of a command line, its metrics and its pseudo-files.

// TestControlFilesCopy: cp copies .dlfs/stats (it refused, "replaced
// while being copied": each lookup gave the file a new inode number), and
// stat twice gives one inode number.
func TestControlFilesCopy(t *testing.T) {
	src := t.TempDir()
	dataset(t, src, 10)
	d := startDlfs(t, src)
	dst := filepath.Join(t.TempDir(), "stats.json")
	if code, _, stderr := runCmd(t, "cp", filepath.Join(d.Mnt, ".dlfs/stats"), dst); code != 0 {
		t.Fatalf("cp .dlfs/stats: exit %d, %s", code, stderr)
	}
	var doc map[string]any
	if b, err := os.ReadFile(dst); err != nil || json.Unmarshal(b, &doc) != nil || doc["node"] == nil {
		t.Errorf("the copy is no stats document: %v", err)
	}
	ino := func() uint64 {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(d.Mnt, ".dlfs/stats"), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	if a, b := ino(), ino(); a != b {
		t.Errorf("stat .dlfs/stats twice: inode %d, then %d", a, b)
	}
}

// TestRefreshCommand: dlfs refresh MNT rescans SOURCE, says what it
// found, and the new file is there to read.
func TestRefreshCommand(t *testing.T) {
	src := t.TempDir()
	dataset(t, src, 10)
	d := startDlfs(t, src)
	if err := os.WriteFile(filepath.Join(src, "new.jpg"), []byte("new sample"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := runCmd(t, bin.dlfs, "refresh", d.Mnt)
	if code != 0 || !strings.Contains(out, "1 added, 0 removed, 0 changed; now 11 files") {
		t.Fatalf("dlfs refresh: exit %d, %q, %q", code, out, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(d.Mnt, "new.jpg")); err != nil || string(b) != "new sample" {
		t.Errorf("the file the refresh found: %q, %v", b, err)
	}
	code, _, stderr = runCmd(t, bin.dlfs, "refresh", src)
	if code != 1 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, "not a dlfs mount") {
		t.Errorf("dlfs refresh off a mount: exit %d, %q", code, stderr)
	}
}

// TestWarmupNoCache: dlfs warmup on a mount with no cache fails with one
// line (it printed "caches hold 0 B", 100% twice, and exited 0).
func TestWarmupNoCache(t *testing.T) {
	src := t.TempDir()
	dataset(t, src, 10)
	d := startDlfs(t, src, "--ram-cache", "0")
	code, _, stderr := runCmd(t, bin.dlfs, "warmup", d.Mnt)
	if code != 1 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, "--ram-cache") || strings.Contains(stderr, "100.0%") {
		t.Errorf("warmup with no cache: exit %d, %q; want 1 and one line", code, stderr)
	}
}

// TestMetricsConventions: the metrics carry dlfs_build_info, the SSD
// tier's fault counters, and a job's name as dlfs_job (Prometheus keeps
// job for the scrape target).
func TestMetricsConventions(t *testing.T) {
	src := t.TempDir()
	files := dataset(t, src, 20)
	addr := freeAddr(t)
	d := startDlfs(t, src, "--metrics-addr", addr, "--ssd-cache", filepath.Join(t.TempDir(), "ssd"), "--ssd-cache-size", "64MiB")
	if err := os.WriteFile(filepath.Join(d.Mnt, ".dlfs/control"), []byte("job=train epoch=0\n"), 0); err != nil {
		t.Fatal(err)
	}
	readAll(t, d.Mnt, files, 2, 1, nil)
	m := httpGet(t, "http://"+addr+"/metrics")
	for _, re := range []string{`(?m)^dlfs_build_info\{goversion="go[^"]+",revision="[0-9a-f]*",version="[^"]+"\} 1$`,
		`(?m)^dlfs_ssd_dropped_writes_total 0$`, `(?m)^dlfs_ssd_corrupt_entries_total 0$`,
		`(?m)^dlfs_job_reads_total\{dlfs_job="train",outcome="hit",rank="rank-0"\} `} {
		if !regexp.MustCompile(re).MatchString(m) {
			t.Errorf("/metrics has no line matching %s", re)
		}
	}
	if regexp.MustCompile(`[{,]job="`).MatchString(m) {
		t.Errorf("/metrics has a job label")
	}
}

// TestConfigAndEnv: a mount takes its settings from a config file and
// DLFS_* variables, the command line winning; --log-format json logs one
// JSON object a line; a config file with a key that is no flag is refused
// with its file and line, before anything is mounted.
func TestConfigAndEnv(t *testing.T) {
	src := t.TempDir()
	dataset(t, src, 10)
	conf := filepath.Join(t.TempDir(), "dlfs.yaml")
	if err := os.WriteFile(conf, []byte("ram-cache: 8MiB\nnode-name: from-file\nlog-format: json\nmount:\n  staging: 32MiB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DLFS_NODE_NAME", "from-env")
	t.Setenv("DLFS_STAGING", "24MiB")
	d := startDlfs(t, src, "--config", conf, "--staging", "16MiB")
	st := dlfsStats(t, d.Mnt)
	if got := num(st, "cache", "ram", "capacity_bytes"); got != 8<<20 {
		t.Errorf("RAM tier of %v bytes, want the file's 8 MiB", got)
	}
	if st["node"] != "from-env" {
		t.Errorf("node %v, want DLFS_NODE_NAME's", st["node"])
	}
	if got := num(st, "prefetch", "staging_capacity_bytes"); got != 16<<20*3/4 && got != 16<<20 {
		t.Errorf("staging of %v bytes, want the command line's 16 MiB (less read-ahead's quarter)", got)
	}
	lines := strings.Split(strings.TrimSpace(d.Stderr.String()), "\n")
	var rec map[string]any
	if len(lines) == 0 || json.Unmarshal([]byte(lines[0]), &rec) != nil || rec["msg"] == nil {
		t.Errorf("--log-format json in the file: the log starts %q", lines[0])
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("ram-cache: 8MiB\nram-cach: 9MiB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	code, _, stderr := runCmd(t, bin.dlfs, "mount", "--config", bad, src, mnt)
	if code != 1 || !strings.Contains(stderr, bad+":2: unknown key \"ram-cach\"") || isMounted(mnt) {
		t.Errorf("a config file with an unknown key: exit %d, %q", code, stderr)
	}
}

// TestStatsWatchPiped: dlfs stats --watch MNT, its output going to a
// file, draws the tables with no terminal codes.
func TestStatsWatchPiped(t *testing.T) {
	src := t.TempDir()
	dataset(t, src, 10)
	d := startDlfs(t, src)
	cmd := exec.Command(bin.dlfs, "stats", "--watch", "--interval", "100ms", d.Mnt)
	out := &mountproc.SyncBuffer{}
	cmd.Stdout = out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	waitFor(t, "two drawings", 20*time.Second, func() bool {
		select {
		case err := <-done:
			t.Fatalf("stats --watch ended: %v", err)
		default:
		}
		return strings.Count(out.String(), "served") >= 2
	})
	_ = cmd.Process.Signal(os.Interrupt)
	if err := <-done; err != nil {
		t.Errorf("stats --watch on SIGINT: %v", err)
	}
	if s := out.String(); strings.Contains(s, "\x1b") || !strings.Contains(s, "dlfs "+d.Mnt) {
		t.Errorf("stats --watch to a pipe:\n%q", s)
	}
}

// TestJobFiguresKept: over a two-epoch run a rank's figures are those of
// the epoch it is in (they showed "epoch 0" and twice the epoch's reads
// consumed); once the job ends they stay in stats, marked ended.
func TestJobFiguresKept(t *testing.T) {
	src := t.TempDir()
	files := dataset(t, src, 60)
	d := startDlfs(t, src, "--push=false", "--infer=false")
	if err := os.WriteFile(filepath.Join(d.Mnt, ".dlfs/control"), []byte("job=j shuffle=true seed=7 lookahead=2 epoch=0\n"), 0); err != nil {
		t.Fatal(err)
	}
	rank := func() map[string]any {
		jobs, _ := dlfsStats(t, d.Mnt)["jobs"].(map[string]any)
		j, _ := jobs["j"].(map[string]any)
		r, _ := j["rank-0"].(map[string]any)
		return r
	}
	waitFor(t, "the job's stream", 20*time.Second, func() bool { return num(rank(), "predicted") == float64(len(files)) })
	for epoch := range 2 {
		plan, err := os.ReadFile(filepath.Join(d.Mnt, ".dlfs/jobs/j/rank-0", fmt.Sprintf("epoch-%d", epoch)))
		if err != nil {
			t.Fatal(err)
		}
		dropPageCache(t) // every read reaches dlfs
		for _, p := range strings.Fields(string(plan)) {
			if _, err := os.ReadFile(filepath.Join(d.Mnt, p)); err != nil {
				t.Fatal(err)
			}
		}
	}
	r := rank()
	if num(r, "epoch") != 1 || num(r, "predicted") != float64(len(files)) || num(r, "consumed") > num(r, "predicted") || num(r, "consumed") < 1 || num(r, "epochs") != 2 {
		t.Errorf("after two epochs: %v", r)
	}
	if err := os.WriteFile(filepath.Join(d.Mnt, ".dlfs/control"), []byte("end job=j\n"), 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job to end", 20*time.Second, func() bool { return rank()["ended"] == true })
	if ended := rank(); num(ended, "hits")+num(ended, "late") < num(r, "hits")+num(r, "late") || num(ended, "epoch") != 1 {
		t.Errorf("the ended job's figures: %v (before the end: %v)", ended, r)
	}
	code, out, _ := runCmd(t, bin.dlfs, "stats", d.Mnt)
	if code != 0 || !regexp.MustCompile(`(?m)^\s*j\s+rank-0\s+1\s.* ended \S+ ago\s*$`).MatchString(out) {
		t.Errorf("dlfs stats after the end:\n%s", out)
	}
}
