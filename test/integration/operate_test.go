package integration

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// freeAddr returns a local TCP address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// httpGet returns the body served at url.
func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d, %v", url, resp.StatusCode, err)
	}
	return string(b)
}

// TestLatencyHistograms: reads, FUSE requests by operation and their
// sources show in stats and in the metrics, in seconds; with
// --latency-histograms=false neither has them.
func TestLatencyHistograms(t *testing.T) {
	src := t.TempDir()
	files := dataset(t, src, 40)
	addr := freeAddr(t)
	d := startDlfs(t, src, "--push=false", "--metrics-addr", addr)
	readAll(t, d.Mnt, files, 2, 1, fromSource(src))
	st := dlfsStats(t, d.Mnt)
	if n := num(st, "latency", "read", "pfs", "count"); n < float64(len(files)) {
		t.Errorf("latency.read.pfs.count = %v after reading %d files", n, len(files))
	}
	for _, op := range []string{"lookup", "read"} {
		if num(st, "latency", "fuse", op, "count") == 0 || num(st, "latency", "fuse", op, "p99_seconds") <= 0 {
			t.Errorf("latency.fuse.%s: %v", op, st["latency"])
		}
	}
	m := httpGet(t, "http://"+addr+"/metrics")
	for _, want := range []string{`dlfs_read_duration_seconds_bucket{source="pfs",le="0.001"}`, `dlfs_fuse_request_duration_seconds_count{op="lookup"}`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	off := startDlfs(t, src, "--push=false", "--latency-histograms=false")
	readAll(t, off.Mnt, files[:5], 1, 2, fromSource(src))
	if l, ok := dlfsStats(t, off.Mnt)["latency"]; ok {
		t.Errorf("histograms off, yet stats has latency: %v", l)
	}
	prom, err := os.ReadFile(filepath.Join(off.Mnt, ".dlfs/stats.prom"))
	if err != nil || strings.Contains(string(prom), "dlfs_read_duration_seconds") {
		t.Errorf("histograms off: stats.prom (%v) has dlfs_read_duration_seconds", err)
	}
}

// TestAccessLog: while `cat .dlfs/accesslog` runs, every request shows as a
// line with its pid, operation, path, bytes, source and latency; only the
// mounting user may open it; a reader still attached when the daemon
// stops gets end-of-file and the daemon exits cleanly.
func TestAccessLog(t *testing.T) {
	src := t.TempDir()
	files := dataset(t, src, 20)
	d := startDlfs(t, src, "--push=false")
	logPath := filepath.Join(d.Mnt, ".dlfs/accesslog")
	fi, err := os.Stat(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeNamedPipe == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("accesslog mode %v, want a named pipe, 0600", fi.Mode())
	}

	cat := exec.Command("cat", logPath)
	out, err := cat.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()

	// Read new files until one's read shows: cat attaches within the
	// daemon's poll.
	deadline := time.After(20 * time.Second)
	var got, file string
	for i := 0; got == "" && i < len(files); i++ {
		file = files[i]
		if _, err := os.ReadFile(filepath.Join(d.Mnt, file)); err != nil {
			t.Fatal(err)
		}
		wait := time.After(500 * time.Millisecond)
	drain:
		for {
			select {
			case l := <-lines:
				if strings.Contains(l, " op=read path="+file+" ") {
					got = l
					break drain
				}
			case <-wait:
				break drain
			case <-deadline:
				t.Fatal("no access log line for any read")
			}
		}
	}
	if got == "" {
		t.Fatal("no access log line for any read")
	}
	fields := map[string]string{}
	for _, kv := range strings.Fields(got)[1:] {
		k, v, _ := strings.Cut(kv, "=")
		fields[k] = v
	}
	size, _ := os.Stat(filepath.Join(src, file))
	secs, err := strconv.ParseFloat(fields["seconds"], 64)
	// FUSE gives the calling thread's id: one of this process's.
	_, thread := os.Stat("/proc/self/task/" + fields["pid"])
	if thread != nil || fields["offset"] != "0" || fields["source"] != "pfs" || fields["status"] != "ok" || err != nil || secs <= 0 {
		t.Errorf("line %q: want a thread of this test (pid %d), offset 0, source pfs, status ok, seconds > 0", got, os.Getpid())
	}
	if n, _ := strconv.Atoi(fields["bytes"]); n <= 0 || int64(n) > size.Size() {
		t.Errorf("line %q: bytes %s of a %d-byte file", got, fields["bytes"], size.Size())
	}
	if _, err := time.Parse("2006-01-02T15:04:05.000000Z", strings.Fields(got)[0]); err != nil {
		t.Errorf("line %q: time: %v", got, err)
	}

	// Another user may not open it.
	nobody := exec.Command("cat", logPath)
	nobody.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if b, err := nobody.CombinedOutput(); err == nil || !strings.Contains(string(b), "Permission denied") {
		t.Errorf("user nobody opened the access log: %v %s", err, b)
	}

	// The daemon stops with the reader attached: cat sees end-of-file.
	d.stop(t)
	done := make(chan error, 1)
	go func() {
		for range lines {
		}
		done <- cat.Wait()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("cat: %v", err)
		}
	case <-time.After(30 * time.Second):
		cat.Process.Kill()
		t.Fatal("cat still reading the access log after the daemon stopped")
	}
}
