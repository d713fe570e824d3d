package integration

// The mount's lifecycle (issue 30, point 1): an idle mount unmounts, by
// dlfs umount or by the tools an operator already has; the daemon exits 0
// when its mount goes away, whoever took it, releasing the SSD cache and
// the metrics port; and a dead mount left by a killed daemon is cleared
// by the next mount. A mount that cannot work says so before it scans
// SOURCE (issue 30, point 3).

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/conformance"
	"github.com/dlfs/dlfs/test/mountproc"
)

// waitExit waits for the daemon to exit on its own and checks it exited
// 0, released its mount, its SSD cache and its metrics port.
func (p *proc) waitExit(t *testing.T, why, metricsAddr string) {
	t.Helper()
	select {
	case <-p.Exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: the daemon still runs 30s later\n%s", why, p.Stderr)
	}
	if p.Err != nil {
		t.Errorf("%s: the daemon exited with %v, want 0\n%s", why, p.Err, p.Stderr)
	}
	if isMounted(p.Mnt) {
		t.Errorf("%s: %s is still mounted", why, p.Mnt)
	}
	if metricsAddr != "" {
		if c, err := net.Dial("tcp", metricsAddr); err == nil {
			c.Close()
			t.Errorf("%s: /metrics still answers on %s", why, metricsAddr)
		}
	}
}

// TestUmountIdleMount: dlfs umount of a live, idle mount succeeds (the
// daemon holds nothing open inside its own mount), and the daemon exits 0.
func TestUmountIdleMount(t *testing.T) {
	src := conformance.OddTree(t, t.TempDir())
	d := startDlfs(t, src)
	// doctor's advice for a live mount is the one followed below.
	code, out, _ := runCmd(t, bin.dlfs, "doctor", src, d.Mnt)
	if want := "FAIL  MOUNTPOINT: " + d.Mnt + " is busy: a live dlfs mount of " + src + " is there; unmount it first (dlfs umount " + d.Mnt + ")"; code != 1 || !strings.Contains(out, want) {
		t.Errorf("dlfs doctor on a live mount: exit %d, want a line %q:\n%s", code, want, out)
	}
	if code, _, stderr := runCmd(t, bin.dlfs, "umount", d.Mnt); code != 0 {
		t.Fatalf("dlfs umount of an idle mount: exit %d: %s", code, stderr)
	}
	d.waitExit(t, "dlfs umount", "")
	d.waitLog(t, "unmounted from outside")
}

// TestMountTakenAway: however the mount goes away (lazily, by fusermount,
// by an admin's umount), the daemon exits 0 and lets go of the SSD cache
// (a new mount of it is accepted) and of the metrics port.
func TestMountTakenAway(t *testing.T) {
	src := conformance.OddTree(t, t.TempDir())
	ssd := t.TempDir()
	for _, c := range []struct {
		name string
		cmd  func(mnt string) []string
	}{
		{"dlfs umount --lazy", func(mnt string) []string { return []string{bin.dlfs, "umount", "--lazy", mnt} }},
		{"umount -l", func(mnt string) []string { return []string{"umount", "-l", mnt} }},
		{"fusermount -u", func(mnt string) []string { return []string{"fusermount3", "-u", mnt} }},
		{"umount", func(mnt string) []string { return []string{"umount", mnt} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr := freeAddr(t)
			d := startDlfs(t, src, "--ssd-cache", ssd, "--metrics-addr", addr)
			httpGet(t, "http://"+addr+"/metrics")
			argv := c.cmd(d.Mnt)
			if code, out, stderr := runCmd(t, argv[0], argv[1:]...); code != 0 {
				t.Fatalf("%s: exit %d: %s%s", strings.Join(argv, " "), code, out, stderr)
			}
			d.waitExit(t, c.name, addr)
		})
	}
	d := startDlfs(t, src, "--ssd-cache", ssd) // the cache's lock is free
	conformance.Tree(t, src, d.Mnt)
}

// TestLazyUmountWhileOpen: a mount detached lazily while a file is open
// serves that file until it is closed; then the daemon exits 0. A SIGTERM
// before then stops it, with exit 0 too.
func TestLazyUmountWhileOpen(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "a"), []byte("held"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDlfs(t, src)
	f, err := os.Open(filepath.Join(d.Mnt, "a"))
	if err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runCmd(t, bin.dlfs, "umount", "--lazy", d.Mnt); code != 0 {
		t.Fatalf("dlfs umount --lazy: exit %d: %s", code, stderr)
	}
	b := make([]byte, 4)
	if _, err := f.ReadAt(b, 0); err != nil || string(b) != "held" {
		t.Errorf("the file held open across the lazy unmount read %q, %v", b, err)
	}
	select {
	case <-d.Exited:
		t.Fatalf("the daemon exited while a file of its detached mount was open: %v\n%s", d.Err, d.Stderr)
	default:
	}
	f.Close()
	d.waitExit(t, "the last file closed", "")

	// SIGTERM while a detached mount still has a file open: exit 0 (it
	// exited 1, 'unmount: invalid argument').
	d = startDlfs(t, src)
	if f, err = os.Open(filepath.Join(d.Mnt, "a")); err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if code, _, stderr := runCmd(t, bin.dlfs, "umount", "--lazy", d.Mnt); code != 0 {
		t.Fatalf("dlfs umount --lazy: exit %d: %s", code, stderr)
	}
	d.Cmd.Process.Signal(syscall.SIGTERM)
	d.waitExit(t, "SIGTERM after a lazy unmount", "")
}

// TestDeadMountCleared: a daemon killed with SIGKILL leaves a dead mount;
// the next mount at that mount point clears it, saying so in one line,
// and mounts.
func TestDeadMountCleared(t *testing.T) {
	src := conformance.OddTree(t, t.TempDir())
	d := startDlfs(t, src)
	d.Cmd.Process.Signal(syscall.SIGKILL)
	<-d.Exited
	if _, err := os.Stat(filepath.Join(d.Mnt, "README")); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("a killed daemon's mount: stat gives %v, want ENOTCONN", err)
	}
	code, out, stderr := runCmd(t, bin.dlfs, "stats", d.Mnt)
	if code == 0 || !strings.Contains(stderr, "dead mount") || !strings.Contains(stderr, "dlfs umount "+d.Mnt) {
		t.Errorf("dlfs stats of a dead mount: exit %d: %s%s", code, out, stderr)
	}
	code, out, stderr = runCmd(t, bin.dlfs, "doctor", src, d.Mnt)
	if !strings.Contains(out, "warn  MOUNTPOINT: "+d.Mnt+" is a dead mount (transport endpoint is not connected): its daemon died; dlfs mount clears it") || code != 0 {
		t.Errorf("dlfs doctor on a dead mount: exit %d:\n%s%s", code, out, stderr)
	}
	again := startMount(t, bin.dlfs, d.Mnt, "mount", src, d.Mnt)
	if n := strings.Count(again.Stderr.String(), "dead mount"); n != 1 {
		t.Errorf("%d log lines about the dead mount, want 1:\n%s", n, again.Stderr)
	}
	conformance.Tree(t, src, again.Mnt)
}

// mountRefused runs dlfs mount with args and returns its stderr, failing
// the test unless it exits non-zero within 30s.
func mountRefused(t *testing.T, args ...string) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(bin.dlfs, append([]string{"mount"}, args...)...)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err == nil {
			t.Fatalf("dlfs mount %v: exit 0, want a refusal\n%s", args, &stderr)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("dlfs mount %v: still running 30s later (looking at SOURCE?)\n%s", args, &stderr)
	}
	return stderr.String()
}

// TestChecksBeforeScan: each check that came after the scan of SOURCE
// now refuses the mount before SOURCE is looked at: SOURCE here is a PFS
// that stopped answering, whose first stat would hang the mount for ever.
// A mount point that is not empty is refused unless --allow-non-empty.
func TestChecksBeforeScan(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	hung := startPFS(t, dir)
	hung.Cmd.Process.Signal(syscall.SIGUSR2)
	hung.waitLog(t, "pfssim: hung")
	t.Cleanup(func() { hung.Cmd.Process.Signal(syscall.SIGHUP) }) // a refused mount left stuck on it would linger

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	busy := l.Addr().String()
	locked := t.TempDir()
	startDlfs(t, conformance.OddTree(t, t.TempDir()), "--ssd-cache", locked) // holds the cache's lock
	key := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(key, []byte("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "left-over"), nil, 0o644)
	for _, c := range []struct {
		name  string
		flags []string
		mnt   string
		want  string
	}{
		{"metrics port taken", []string{"--metrics-addr", busy}, "", "--metrics-addr: " + busy + " cannot be listened on (address already in use)"},
		{"gossip port taken", []string{"--bind", busy, "--insecure"}, "", "--bind: " + busy + " cannot be listened on"},
		{"SSD cache of another mount", []string{"--ssd-cache", locked}, "", "another dlfs is using this cache"},
		{"SSD cache too small", []string{"--ssd-cache", t.TempDir(), "--ssd-cache-size", "1MiB"}, "", "--ssd-cache-size: 1.0 MiB is too small"},
		{"RAM tier beyond the host", []string{"--ram-cache", "100TiB"}, "", "--ram-cache: 100.0 TiB asked for"},
		{"key others may read", []string{"--bind", "127.0.0.1:0", "--cluster-key-file", key}, "", "chmod 600 " + key},
		{"mount point not empty", nil, full, "--allow-non-empty"},
	} {
		t.Run(c.name, func(t *testing.T) {
			mnt := c.mnt
			if mnt == "" {
				mnt = t.TempDir()
			}
			stderr := mountRefused(t, append(c.flags, hung.Mnt, mnt)...)
			if !strings.Contains(stderr, c.want) || strings.Contains(stderr, "SOURCE") || strings.Contains(stderr, "scanned") {
				t.Errorf("stderr %q: want %q, and nothing about SOURCE", stderr, c.want)
			}
		})
	}
	if isMounted(full) {
		t.Fatalf("%s was mounted over", full)
	}
	d := startMount(t, bin.dlfs, full, "mount", "--allow-non-empty", dir, full)
	if _, err := os.Stat(filepath.Join(d.Mnt, "left-over")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the mount does not hide what its mount point held: %v", err)
	}
}

// TestRelativeSource: SOURCE given relative, or through a link, is the
// same SOURCE: the catalog the first mount saved is loaded by the next,
// not discarded as another dataset's.
func TestRelativeSource(t *testing.T) {
	parent := t.TempDir()
	src := filepath.Join(parent, "data")
	conformance.OddTree(t, src)
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(src, link); err != nil {
		t.Fatal(err)
	}
	ssd, mnt := t.TempDir(), t.TempDir()
	cmd := exec.Command(bin.dlfs, "mount", "--ssd-cache", ssd, "data", mnt)
	cmd.Dir = parent
	p, err := mountproc.StartCmd(cmd, mnt, "", 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	d := &proc{p}
	t.Cleanup(func() { d.stop(t) })
	waitFor(t, "the catalog to be saved", 30*time.Second, func() bool { _, err := os.Stat(filepath.Join(ssd, "catalog.snap")); return err == nil })
	d.stop(t)
	for _, given := range []string{src, link} {
		again := startMount(t, bin.dlfs, mnt, "mount", "--ssd-cache", ssd, given, mnt)
		again.waitLog(t, "loaded the saved snapshot")
		if strings.Contains(again.Stderr.String(), "another dataset") {
			t.Errorf("SOURCE %s: the saved catalog was discarded:\n%s", given, again.Stderr)
		}
		again.stop(t)
	}
}

// TestStatsOtherUsersMount: dlfs stats of a mount made without
// --allow-other, run by another user, says whose mount it is and what to
// do, instead of "not a dlfs mount".
func TestStatsOtherUsersMount(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to act as another user")
	}
	open := func(dir string) string { // a directory nobody may enter, and its parent
		os.Chmod(dir, 0o755)
		os.Chmod(filepath.Dir(dir), 0o755)
		return dir
	}
	mnt := open(t.TempDir())
	startMount(t, bin.dlfs, mnt, "mount", conformance.OddTree(t, t.TempDir()), mnt)
	dlfs := filepath.Join(open(t.TempDir()), "dlfs")
	b, err := os.ReadFile(bin.dlfs)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dlfs, b, 0o755); err != nil {
		t.Fatal(err)
	}
	code, stderr := asNobody(t, dlfs, "stats", mnt)
	if want := mnt + ": permission denied: it is root's FUSE mount"; code == 0 || !strings.Contains(stderr, want) || !strings.Contains(stderr, "--allow-other") {
		t.Errorf("dlfs stats as another user: exit %d, %q; want %q and --allow-other", code, stderr, want)
	}
}
