package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Operating a mount from a terminal: hang-ups, closed pipes, --daemon,
// --log-file and --log-format json, and what the kernel is told about
// writes (docs/operating.md).

// smallSource is a SOURCE of one file, "a/f".
func smallSource(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a", "f"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return src
}

// TestHangupAndClosedPipes: a mount whose stdout and stderr readers are
// gone before it writes its mounted line (dlfs mount ... | head), and
// that is sent SIGHUP (a closed terminal, logrotate), goes on serving;
// SIGHUP opens --log-file again; SIGTERM still unmounts and exits 0.
func TestHangupAndClosedPipes(t *testing.T) {
	src, mnt := smallSource(t), t.TempDir()
	logPath := filepath.Join(t.TempDir(), "dlfs.log")
	cmd := exec.Command(bin.dlfs, "mount", "--log-file", logPath, "--ram-cache", "64MiB", src, mnt)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stdout.Close() // the mounted line will meet a broken pipe
	stderr.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-exited
		if isMounted(mnt) { // a daemon that died left it dead
			exec.Command("umount", "-l", mnt).Run()
		}
	})
	alive := func(when string) {
		t.Helper()
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("%s: the daemon exited: %v; log:\n%s", when, err, logText(logPath))
		default:
		}
	}
	waitFor(t, "the mount", time.Minute, func() bool {
		alive("mounting with closed pipes")
		b, _ := os.ReadFile(filepath.Join(mnt, "a", "f"))
		return string(b) == "hello\n"
	})
	waitFor(t, "the mounted record in the log", time.Minute, func() bool { return strings.Contains(logText(logPath), "msg=mounted") })
	alive("after the mounted line")

	if err := os.Rename(logPath, logPath+".1"); err != nil { // logrotate
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the log file opened again", time.Minute, func() bool {
		alive("after SIGHUP")
		return strings.Contains(logText(logPath), "opened the log file again")
	})
	if b, err := os.ReadFile(filepath.Join(mnt, "a", "f")); string(b) != "hello\n" {
		t.Fatalf("reading through the mount after SIGHUP: %q, %v", b, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-exited; err != nil {
		t.Errorf("after SIGTERM: %v; want exit status 0", err)
	}
	exited <- nil
	if isMounted(mnt) {
		t.Errorf("%s is still mounted", mnt)
	}
}

func logText(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// TestDaemonFlag: dlfs mount --daemon returns 0 once the mount is usable,
// holding none of the caller's pipes (so $(...) ends), with the mounted
// line on stdout; --log-format json makes that line and every line of
// --log-file JSON, go-fuse's --debug-fuse lines too. A mount that cannot
// be made returns 1 and its error, as a JSON record too.
func TestDaemonFlag(t *testing.T) {
	src, mnt := smallSource(t), t.TempDir()
	logPath := filepath.Join(t.TempDir(), "dlfs.log")
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := exec.Command(bin.dlfs, "mount", "--daemon", "--log-format", "json", "--log-file", logPath, "--debug-fuse",
			"--ram-cache", "64MiB", src, mnt).Output() // returns when stdout's last writer is gone
		done <- result{out, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(time.Minute):
		t.Fatal("dlfs mount --daemon did not return within a minute: the daemon holds its stdout")
	}
	t.Cleanup(func() {
		if isMounted(mnt) {
			runCmd(t, bin.dlfs, "umount", mnt)
		}
	})
	var rec map[string]any
	if r.err != nil || json.Unmarshal(r.out, &rec) != nil || rec["msg"] != "mounted" || rec["mountpoint"] == nil {
		t.Fatalf("dlfs mount --daemon: %v, stdout %q; want exit 0 and a JSON mounted record", r.err, r.out)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "a", "f")); string(b) != "hello\n" {
		t.Fatalf("reading through the daemon's mount: %q, %v", b, err)
	}
	if code, _, stderr := runCmd(t, bin.dlfs, "umount", mnt); code != 0 {
		t.Fatalf("dlfs umount: %d %s", code, stderr)
	}
	waitFor(t, "the daemon to log its end", time.Minute, func() bool { return strings.Contains(logText(logPath), "unmounted from outside") })
	sc := bufio.NewScanner(strings.NewReader(logText(logPath)))
	var msgs []string
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Errorf("--log-file line is not JSON: %q", sc.Text())
		}
		msgs = append(msgs, rec["msg"].(string))
	}
	if all := strings.Join(msgs, "|"); !strings.Contains(all, "|mounted|") || !strings.Contains(all, "|rx ") {
		t.Errorf("the log lacks the mounted record or go-fuse's --debug-fuse lines: %q", msgs)
	}

	cmd := exec.Command(bin.dlfs, "mount", "--daemon", "--log-format", "json", src, filepath.Join(mnt, "missing"))
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || len(out) != 0 {
		t.Fatalf("--daemon on a missing MOUNTPOINT: %v, stdout %q; want exit status 1", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(ee.Stderr)), "\n")
	last := lines[len(lines)-1]
	if json.Unmarshal([]byte(last), &rec) != nil || rec["level"] != "ERROR" || !strings.Contains(rec["err"].(string), "no such file") {
		t.Errorf("--daemon on a missing MOUNTPOINT: stderr %q; want a JSON error record", ee.Stderr)
	}
}

// TestMountRefusesNesting: SOURCE holding MOUNTPOINT, or inside it, is
// refused in one line before anything is mounted.
func TestMountRefusesNesting(t *testing.T) {
	src := smallSource(t)
	for _, c := range [][2]string{{src, filepath.Join(src, "a")}, {filepath.Join(src, "a"), src}} {
		// Bounded: a mount that is not refused runs until stopped.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, bin.dlfs, "mount", "--allow-non-empty", "--ram-cache", "64MiB", c[0], c[1])
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), "MOUNTPOINT") {
			t.Errorf("dlfs mount %s %s: %v, %q; want exit status 1 and one line", c[0], c[1], err, stderr.String())
		}
		if isMounted(c[1]) {
			t.Errorf("%s was mounted", c[1])
			exec.Command("umount", "-l", c[1]).Run()
		}
	}
}

// TestWritesRefused: every write to the dataset fails with EROFS, and
// the control file takes a command: why the mount is made read-write
// rather than "ro", which the kernel would apply to the control file too
// (docs/design.md). Once a file was opened for reading, the kernel stops
// sending dlfs opens (no_open), so an open for writing without O_TRUNC
// succeeds and its first write fails.
func TestWritesRefused(t *testing.T) {
	p := startDlfs(t, smallSource(t), "--ram-cache", "64MiB")
	file := filepath.Join(p.Mnt, "a", "f")
	for _, round := range []string{"before any read", "after a read"} {
		for _, flags := range []int{os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_APPEND} {
			f, err := os.OpenFile(file, flags, 0)
			if err == nil {
				_, err = f.Write([]byte("x"))
				f.Close()
			}
			if !errors.Is(err, syscall.EROFS) {
				t.Errorf("%s: open a/f with flags %#x and write: %v; want EROFS", round, flags, err)
			}
		}
		for what, err := range map[string]error{
			"O_TRUNC":  func() error { _, err := os.OpenFile(file, os.O_WRONLY|os.O_TRUNC, 0); return err }(),
			"truncate": os.Truncate(file, 0),
			"create":   func() error { _, err := os.Create(filepath.Join(p.Mnt, "a", "new")); return err }(),
			"mkdir":    os.Mkdir(filepath.Join(p.Mnt, "d"), 0o755),
			"remove":   os.Remove(file),
		} {
			if !errors.Is(err, syscall.EROFS) {
				t.Errorf("%s: %s: %v; want EROFS", round, what, err)
			}
		}
		if b, err := os.ReadFile(file); string(b) != "hello\n" {
			t.Fatalf("reading a/f: %q, %v", b, err)
		}
	}
	if err := os.WriteFile(filepath.Join(p.Mnt, ".dlfs", "control"), []byte("refresh\n"), 0); err != nil {
		t.Errorf("writing the control file: %v", err)
	}
}
