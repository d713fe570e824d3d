package integration

// Issue 27, "A failing read costs a log line and a PFS open every time": a
// reader retrying a file that changed in SOURCE gets ESTALE each time, but
// the PFS sees an open per FailureTTL and the log a line per interval,
// not one of each per try.

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRetryLoopOnChangedFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, randomBytes(100<<10, 1), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startPFS(t, dir, "-open-latency", "1ms")
	d := startDlfs(t, p.Mnt, "--infer=false", "--push=false")
	// Rewritten in place after the scan: same size, mtime put back.
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, randomBytes(100<<10, 2), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	before := p.counters(t)
	start := time.Now()
	const tries = 2000
	for range tries {
		if _, err := os.ReadFile(filepath.Join(d.Mnt, "f")); !errors.Is(err, syscall.ESTALE) {
			t.Fatalf("a read of a changed file: %v, want ESTALE", err)
		}
	}
	took := time.Since(start)
	opens := p.counters(t).Opens - before.Opens
	lines := strings.Count(d.Stderr.String(), "changed in SOURCE")
	t.Logf("%d tries in %v: %d PFS opens, %d log lines", tries, took.Round(time.Millisecond), opens, lines)
	// A failure is remembered for 2 s, and a message logged 5 times per
	// 10 s: what the loop may cost follows from how long it took.
	maxOpens := int64(took/(2*time.Second)) + 2
	maxLines := 5 * (int(took/(10*time.Second)) + 2)
	if opens > maxOpens || lines > maxLines {
		t.Errorf("%d tries in %v cost %d PFS opens and %d log lines; want at most %d and %d", tries, took, opens, lines, maxOpens, maxLines)
	}
	d.alive(t)
}
