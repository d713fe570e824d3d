package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

// tmuxPane returns what the tmux session's pane shows now.
func tmuxPane(t *testing.T, session string) string {
	t.Helper()
	out, err := exec.Command("tmux", "capture-pane", "-p", "-t", session).Output()
	if err != nil {
		return ""
	}
	return string(out)
}

// TestStatsCommand: `dlfs stats` prints the tables once, --json the raw
// document, and off a mount one line and exit 1; `dlfs stats --watch`,
// driven in tmux as a person would run it, redraws in place with rates
// per second while files are read, and stops on Ctrl-C.
func TestStatsCommand(t *testing.T) {
	src := t.TempDir()
	files := dataset(t, src, 60)
	d := startDlfs(t, src, "--push=false")
	readAll(t, d.Mnt, files[:10], 2, 1, fromSource(src))

	// The table shows the document's figures. (Opens are not 10: the
	// dataset's identity opened the oldest files at mount, and a file
	// stays open between reads.)
	opens := int(num(dlfsStats(t, d.Mnt), "pfs", "opens"))
	code, out, stderr := runCmd(t, bin.dlfs, "stats", d.Mnt)
	if code != 0 || !strings.Contains(out, "served") || !strings.Contains(out, "pfs") || !strings.Contains(out, fmt.Sprintf(" %d opens", opens)) ||
		!strings.Contains(strings.Join(strings.Fields(out), " "), "pfs 10 ") {
		t.Errorf("dlfs stats: exit %d\n%s%s", code, out, stderr)
	}
	code, out, _ = runCmd(t, bin.dlfs, "stats", "--json", d.Mnt)
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || doc["node"] == nil {
		t.Errorf("dlfs stats --json: exit %d, %v", code, err)
	}
	code, out, stderr = runCmd(t, bin.dlfs, "stats", src)
	if code != 1 || out != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "not a dlfs mount") {
		t.Errorf("dlfs stats off a mount: exit %d, stdout %q, stderr %q", code, out, stderr)
	}

	session := fmt.Sprintf("dlfs-stats-%d", os.Getpid())
	if b, err := exec.Command("tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "50",
		bin.dlfs+" stats --watch --interval 300ms "+d.Mnt+"; sleep 30").CombinedOutput(); err != nil {
		t.Fatalf("tmux: %v %s", err, b)
	}
	t.Cleanup(func() { _ = exec.Command("tmux", "kill-session", "-t", session).Run() })
	poll := func(what string, cond func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			if s := tmuxPane(t, session); cond(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; the pane shows:\n%s", what, tmuxPane(t, session))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	poll("the table", func(s string) bool { return strings.Contains(s, "every 300ms") && strings.Contains(s, "served") })
	// Read the rest while it watches: the pfs row shows a rate, and the
	// opens reach the dataset's size; the screen holds one table (redrawn
	// in place, not scrolled).
	readErr := make(chan error, 1)
	go func() {
		for _, f := range files[10:] {
			if _, err := os.ReadFile(filepath.Join(d.Mnt, f)); err != nil {
				readErr <- err
				return
			}
		}
		readErr <- nil
	}()
	t.Cleanup(func() {
		if err := <-readErr; err != nil {
			t.Error(err)
		}
	})
	// The first frame that shows all 60 reads from the PFS covers the last
	// of them: its pfs row has a rate above zero.
	poll("the reads, with their rate", func(s string) bool {
		if strings.Count(s, "every 300ms") != 1 {
			return false
		}
		for _, l := range strings.Split(s, "\n") {
			if f := strings.Fields(l); len(f) >= 6 && f[0] == "pfs" {
				return f[1] == "60" && f[4] != "-" && f[4] != "0"
			}
		}
		return false
	})
	if err := exec.Command("tmux", "send-keys", "-t", session, "C-c").Run(); err != nil {
		t.Fatal(err)
	}
	// After Ctrl-C the command exits and the shell goes on to sleep.
	poll("the watch to stop", func(string) bool {
		out, err := exec.Command("tmux", "list-panes", "-t", session, "-F", "#{pane_current_command}").Output()
		return err == nil && strings.TrimSpace(string(out)) == "sleep"
	})
}

// TestPipInstall: `pip install --no-build-isolation ./python` (Debian's
// pip, nothing from an index) installs the helper into a virtual
// environment made with --system-site-packages, where it imports with
// torch and carries the daemon's version.
func TestPipInstall(t *testing.T) {
	tmp := t.TempDir()
	pkg := filepath.Join(tmp, "python") // a copy: pip builds in the tree it is given
	if b, err := exec.Command("cp", "-r", "../../python", pkg).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, b)
	}
	venv := filepath.Join(tmp, "venv")
	for _, args := range [][]string{
		{"/usr/bin/python3", "-m", "venv", "--system-site-packages", venv},
		{filepath.Join(venv, "bin", "pip"), "install", "--no-build-isolation", "--no-index", "--quiet", pkg},
	} {
		if code, out, stderr := runCmd(t, args[0], args[1:]...); code != 0 {
			t.Fatalf("%s: exit %d\n%s%s", strings.Join(args, " "), code, out, stderr)
		}
	}
	cmd := exec.Command(filepath.Join(venv, "bin", "python"), "-c", "import dlfs, torch; print(dlfs.__version__, dlfs.__file__, hasattr(dlfs, 'DataLoader'))")
	cmd.Dir = tmp // not the repository, whose python/ would shadow the install
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("import dlfs: %v\n%s", err, out)
	}
	_, ver, _ := runCmd(t, bin.dlfs, "version")
	f := strings.Fields(string(out))
	if len(f) != 3 || !strings.Contains(ver, "dlfs "+f[0]+" ") || !strings.HasPrefix(f[1], venv) || f[2] != "True" {
		t.Errorf("installed helper: %q; dlfs version says %q", out, ver)
	}
}

// TestStatusPage loads the status page at / on --metrics-addr in headless
// Chromium, after reads and two samples of the rates: the page shows the
// node, each tier's reads as stats count them, and the last minutes'
// rates as lines, the PFS's visibly above zero.
func TestStatusPage(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is missing: make deps installs it")
	}
	src := t.TempDir()
	files := dataset(t, src, 40)
	addr := freeAddr(t)
	d := startDlfs(t, src, "--push=false", "--metrics-addr", addr, "--node-name", "status-node")
	readAll(t, d.Mnt, files, 2, 1, fromSource(src))
	deadline := time.Now().Add(30 * time.Second)
	for {
		var h struct {
			Points []map[string]any `json:"points"`
		}
		if err := json.Unmarshal([]byte(httpGet(t, "http://"+addr+"/history.json")), &h); err != nil {
			t.Fatal(err)
		}
		if len(h.Points) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rate history has %d points after 30 s", len(h.Points))
		}
		time.Sleep(100 * time.Millisecond)
	}
	pfsReads := int(num(dlfsStats(t, d.Mnt), "served", "pfs", "reads"))

	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(chromium, append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
			"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=4000", "--window-size=1200,1400"}, args...)...)
		var out strings.Builder
		cmd.Stdout = &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("chromium %v: %v", args, err)
		}
		return out.String()
	}
	dom := run("--dump-dom", "http://"+addr+"/")
	text := regexp.MustCompile(`(?s)<(script|style)[^>]*>.*?</(script|style)>`).ReplaceAllString(dom, " ")
	text = regexp.MustCompile(`<[^>]*>`).ReplaceAllString(text, " ")
	text = strings.Join(strings.Fields(text), " ")
	for _, want := range []string{"dlfs " + d.Mnt, "node status-node", fmt.Sprintf("pfs %s", fmtThousands(pfsReads)), "Reads served per second, by tier"} {
		if !strings.Contains(text, want) {
			t.Errorf("the page does not show %q; it shows: %.2000s", want, text)
		}
	}
	if strings.Contains(text, "cannot reach the daemon") {
		t.Errorf("the page could not fetch its data: %s", regexp.MustCompile(`<div id="error">[^<]*`).FindString(dom))
	}
	line := regexp.MustCompile(`data-series="pfs" points="([^"]+)"`).FindStringSubmatch(dom)
	if line == nil || len(strings.Fields(line[1])) < 2 {
		t.Fatalf("no pfs line of two points or more in the chart: %v", line)
	}
	above := false // the chart's zero is at y = 180
	for _, p := range strings.Fields(line[1]) {
		_, y, _ := strings.Cut(p, ",")
		if v, _ := strconv.ParseFloat(y, 64); v < 170 {
			above = true
		}
	}
	if !above {
		t.Errorf("the pfs line never rises above zero: %s", line[1])
	}

	// What a person sees: a screenshot with the pfs line's red drawn.
	shot := filepath.Join(t.TempDir(), "status.png")
	run("--screenshot="+shot, "http://"+addr+"/")
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	red := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if r>>8 > 190 && g>>8 < 80 && bl>>8 < 80 {
				red++
			}
		}
	}
	if red < 100 {
		t.Errorf("the screenshot shows %d red pixels: no pfs line drawn", red)
	}
}

// fmtThousands writes n as the page does (en-US grouping).
func fmtThousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// TestDoctor runs `dlfs doctor` with a mount's command line: on this
// machine (root, /dev/fuse) a sound one passes, one line per check; a
// cache directory open to everyone and a key others may read fail it,
// each with what to do, and it exits 1.
func TestDoctor(t *testing.T) {
	src, mnt, dir := t.TempDir(), t.TempDir(), t.TempDir()
	cache := filepath.Join(dir, "cache")
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"doctor", "--ram-cache", "64MiB", "--ssd-cache", cache, "--ssd-cache-size", "64MiB", "--cluster-key-file", key,
		"--data-addr", freeAddr(t), "--metrics-addr", freeAddr(t), "--node-name", "n1", src, mnt}
	code, out, stderr := runCmd(t, bin.dlfs, args...)
	if code != 0 || strings.Contains(out, "FAIL") || strings.Count(out, "\n") < 8 {
		t.Errorf("a sound mount: exit %d\n%s%s", code, out, stderr)
	}
	if err := os.Mkdir(cache, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(cache, 0o777)
	os.Chmod(key, 0o644)
	code, out, stderr = runCmd(t, bin.dlfs, args...)
	if code != 1 || !strings.Contains(out, "FAIL  --ssd-cache: "+cache+" is mode 0777") || !strings.Contains(out, "chmod 600 "+key) ||
		!strings.Contains(stderr, "2 checks failed") {
		t.Errorf("an open cache and key: exit %d\n%s%s", code, out, stderr)
	}
}
