package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/conformance"
)

// TestBadArguments: each mistake gets one clear line on stderr and a
// non-zero exit, and nothing is left mounted.
func TestBadArguments(t *testing.T) {
	src := conformance.OddTree(t, t.TempDir())
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	busy := startDlfs(t, src).Mnt
	mnt := t.TempDir()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"missing source", []string{"mount", "/no/such/dir", mnt}, "SOURCE: /no/such/dir: no such file or directory"},
		{"source is a file", []string{"mount", file, mnt}, "not a directory"},
		{"mount point busy", []string{"mount", src, busy}, "busy"},
		{"mount point not a directory", []string{"mount", src, file}, "not a directory"},
		{"mount point missing", []string{"mount", src, "/no/such/mnt"}, "no such file or directory"},
		{"malformed size", []string{"mount", "--ram-cache", "12XB", src, mnt}, `"12XB" is not a size`},
		{"negative size", []string{"mount", "--ssd-cache-size", "-1G", "--ssd-cache", t.TempDir(), src, mnt}, "not a size"},
		{"bad log level", []string{"mount", "--log-level", "loud", src, mnt}, "--log-level"},
		{"wrong arity", []string{"mount", src}, "accepts 2 arg(s)"},
		{"unknown flag", []string{"mount", "--ram", "1G", src, mnt}, "unknown flag"},
		{"umount of a plain directory", []string{"umount", mnt}, "not mounted"},
		{"bad cluster key", []string{"mount", "--cluster-key-file", file, src, mnt}, "--cluster-key-file"},
		{"bad bind address", []string{"mount", "--bind", "nowhere", src, mnt}, "--bind"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := runCmd(t, bin.dlfs, c.args...)
			if code == 0 {
				t.Fatalf("exit 0, want failure")
			}
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], c.want) || !strings.HasPrefix(lines[0], "dlfs: ") {
				t.Errorf("stderr %q: want one line 'dlfs: ...' containing %q", stderr, c.want)
			}
		})
	}
	if isMounted(mnt) {
		t.Errorf("%s was left mounted", mnt)
	}
}

// TestVanishingFile: a file deleted from SOURCE behind the daemon's back
// fails its own read only; the daemon keeps serving everything else.
func TestVanishingFile(t *testing.T) {
	src := t.TempDir()
	files := dataset(t, src, 50)
	d := startDlfs(t, src)
	gone := files[7]
	if err := os.Remove(filepath.Join(src, gone)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(filepath.Join(d.Mnt, gone)); err == nil {
		t.Errorf("reading %s, deleted from SOURCE, succeeded", gone)
	}
	rest := append(append([]string(nil), files[:7]...), files[8:]...)
	readAll(t, d.Mnt, rest, 4, 1, fromSource(src))
	if err := os.WriteFile(filepath.Join(d.Mnt, ".dlfs/control"), []byte("refresh\n"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d.Mnt, gone)); !os.IsNotExist(err) {
		t.Errorf("after refresh, stat %s: %v, want not-exist", gone, err)
	}
}

// TestSignalsAndDeadMount: SIGINT unmounts and exits 0; a daemon killed
// with SIGKILL leaves a dead mount that "dlfs umount" clears.
func TestSignalsAndDeadMount(t *testing.T) {
	src := conformance.OddTree(t, t.TempDir())
	d := startDlfs(t, src)
	d.Cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-d.Exited:
		if d.Err != nil {
			t.Fatalf("SIGINT: exit %v\n%s", d.Err, d.Stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit within 30s of SIGINT")
	}
	if isMounted(d.Mnt) {
		t.Fatal("still mounted after SIGINT")
	}

	d = startDlfs(t, src)
	d.Cmd.Process.Kill()
	<-d.Exited
	if _, err := os.Stat(filepath.Join(d.Mnt, "README")); err == nil {
		t.Fatal("a killed daemon's mount still serves")
	}
	// A new mount clears the dead one (TestDeadMountCleared); so does
	// dlfs umount.
	if code, _, stderr := runCmd(t, bin.dlfs, "umount", d.Mnt); code != 0 {
		t.Fatalf("dlfs umount of a dead mount: exit %d: %s", code, stderr)
	}
	if isMounted(d.Mnt) {
		t.Fatal("dead mount still there after dlfs umount")
	}
	d = startDlfs(t, src) // the mount point is usable again
	conformance.Tree(t, src, d.Mnt)
}
