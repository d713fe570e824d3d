package source

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/pfssim"
	"golang.org/x/sys/unix"
)

func TestLocal(t *testing.T) {
	for p, want := range map[string]bool{
		"a": true, "a/b.jpg": true, "a b/#c": true, "..a": true,
		"": false, "/etc/passwd": false, "..": false, "a/../../x": false, "./a": false, "a//b": false, "a/": false, "a\x00b": false,
	} {
		if Local(p) != want {
			t.Errorf("Local(%q) = %v, want %v", p, !want, want)
		}
	}
}

func TestReadAt(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "f"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Symlink(outside, filepath.Join(root, "escape"))
	os.Symlink(filepath.Dir(outside), filepath.Join(root, "dirlink"))
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fi, _ := os.Stat(filepath.Join(root, "f"))
	want := Want{Size: fi.Size(), Mtime: fi.ModTime().UnixNano()}
	buf := make([]byte, 5)
	if n, err := s.ReadAt("f", want, buf, 0); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("ReadAt: %q, %v", buf[:n], err)
	}
	if st := s.Stats(); st.Opens != 1 || st.Bytes != 5 || st.ReadOps != 1 {
		t.Errorf("stats %+v", st)
	}
	if _, err := s.ReadAt("f", Want{Size: 4, Mtime: want.Mtime}, buf, 0); !errors.Is(err, ErrChanged) {
		t.Errorf("identity mismatch: %v", err)
	}
	for _, p := range []string{"escape", "dirlink/secret", "../secret", "/etc/passwd"} {
		if _, err := s.ReadAt(p, Want{Size: 6}, buf, 0); err == nil {
			t.Errorf("ReadAt(%q) read outside the dataset", p)
		}
	}
}

// A SOURCE on FUSE answers a signal that reaches a blocked open with
// EINTR (the kernel sends FUSE_INTERRUPT; the server gives up the request).
// Go's runtime signals its own threads, so ReadAt must retry, not fail the
// reader's read. pfssim serves one request at a time here: a slow read
// holds the slot while the open of another file waits and is signalled.
func TestReadAtRetriesInterruptedOpens(t *testing.T) {
	dir, mnt := t.TempDir(), t.TempDir()
	for _, name := range []string{"a", "b"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sim, err := pfssim.Mount(mnt, pfssim.Config{Dir: dir, MaxInFlight: 1, ReadLatency: 300 * time.Millisecond})
	if err != nil {
		t.Skipf("no FUSE here: %v", err)
	}
	defer sim.Unmount()
	s, err := Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fi, err := os.Stat(filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	want := Want{Size: fi.Size(), Mtime: fi.ModTime().UnixNano()}

	slow := make(chan error, 1)
	go func() { _, err := os.ReadFile(filepath.Join(mnt, "b")); slow <- err }()
	for deadline := time.Now().Add(5 * time.Second); sim.Counters().Opens == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the slow read never opened its file")
		}
		time.Sleep(time.Millisecond)
	}
	tids := make(chan int, 1)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // so that the signals below reach the thread blocked in the open
		tids <- unix.Gettid()
		_, err := s.ReadAt("a", want, make([]byte, 1), 0)
		done <- err
	}()
	tid := <-tids
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("ReadAt with signals arriving: %v", err)
			}
			if err := <-slow; err != nil {
				t.Fatal(err)
			}
			return
		case <-time.After(2 * time.Millisecond):
			unix.Tgkill(unix.Getpid(), tid, unix.SIGURG)
		}
	}
}

func TestIgnoringEINTR(t *testing.T) {
	calls := 0
	err := IgnoringEINTR(func() error {
		if calls++; calls < 3 {
			return unix.EINTR
		}
		return unix.ENOENT
	})
	if calls != 3 || err != unix.ENOENT {
		t.Errorf("%d calls, %v; want 3 calls and the first error that is not EINTR", calls, err)
	}
}
