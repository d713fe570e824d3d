package integration

// The mount's lifecycle (issue 30, point 1): an idle mount unmounts, by
// dlfs umount or by the tools an operator already has; the daemon exits 0
// when its mount goes away, whoever took it, releasing the SSD cache and
// the metrics port; and a dead mount left by a killed daemon is cleared
// by the next mount.

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/conformance"
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
// serves that file until it is closed; then the daemon exits 0.
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
	again := startMount(t, bin.dlfs, d.Mnt, "mount", src, d.Mnt)
	if n := strings.Count(again.Stderr.String(), "dead mount"); n != 1 {
		t.Errorf("%d log lines about the dead mount, want 1:\n%s", n, again.Stderr)
	}
	conformance.Tree(t, src, again.Mnt)
}
