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
	want := versionOf(t, filepath.Join(root, "f"))
	buf := make([]byte, 5)
	if n, err := s.ReadAt("f", want, buf, 0); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("ReadAt: %q, %v", buf[:n], err)
	}
	if st := s.Stats(); st.Opens != 1 || st.Bytes != 5 || st.ReadOps != 1 {
		t.Errorf("stats %+v", st)
	}
	for _, v := range []Version{{4, want.Mtime, want.Ctime, want.Ino}, {5, want.Mtime + 1, want.Ctime, want.Ino},
		{5, want.Mtime, want.Ctime + 1, want.Ino}, {5, want.Mtime, want.Ctime, want.Ino + 1}} {
		if _, err := s.ReadAt("f", v, buf, 0); !errors.Is(err, ErrChanged) {
			t.Errorf("version %+v of %+v: %v, want ErrChanged", v, want, err)
		}
	}
	// Each read outside names the outside file's true version, so only
	// the confinement can fail it: with openat2's RESOLVE flags removed,
	// "dirlink/secret" reads the secret.
	secret := versionOf(t, outside)
	for p, why := range map[string]error{"escape": unix.ELOOP, "dirlink/secret": unix.ELOOP, "../secret": ErrPath, "/etc/passwd": ErrPath} {
		if n, err := s.ReadAt(p, secret, buf, 0); !errors.Is(err, why) {
			t.Errorf("ReadAt(%q): %d bytes, %v; want %v", p, n, err, why)
		}
	}
}

func versionOf(t *testing.T, path string) Version {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return VersionOf(&st)
}

// TestSameSizeRewrite: a rewrite that keeps the size and puts the mtime
// back is a new version (its ctime moved): a read under the old version
// fails instead of returning the new bytes (finding 4 of issue 10).
func TestSameSizeRewrite(t *testing.T) {
	root := t.TempDir()
	f := filepath.Join(root, "f")
	os.WriteFile(f, []byte("old bytes"), 0o644)
	old := versionOf(t, f)
	mtime := time.Unix(0, old.Mtime)
	for versionOf(t, f).Ctime == old.Ctime { // ctime has a clock tick's resolution
		os.WriteFile(f, []byte("new bytes"), 0o644)
		os.Chtimes(f, mtime, mtime)
	}
	if v := versionOf(t, f); v.Size != old.Size || v.Mtime != old.Mtime {
		t.Fatalf("the rewrite changed size or mtime: %+v, %+v", v, old)
	}
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.ReadAt("f", old, make([]byte, 9), 0); !errors.Is(err, ErrChanged) {
		t.Errorf("read under the old version: %v, want ErrChanged", err)
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
	sim, s := simSource(t, mnt, pfssim.Config{Dir: dir, MaxInFlight: 1, ReadLatency: 300 * time.Millisecond})
	want := versionOf(t, filepath.Join(mnt, "a"))

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

// A file rewritten in place while its bytes are read (same size, mtime
// put back) must fail the read: the bytes may be part old and part new.
// The simulated PFS holds the read for a while; the rewrite lands after
// ReadAt checked the version and before the bytes come back.
func TestReadAtRewrittenDuringRead(t *testing.T) {
	dir, mnt := t.TempDir(), t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, []byte("old bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	sim, s := simSource(t, mnt, pfssim.Config{Dir: dir, ReadLatency: time.Second})
	want := versionOf(t, filepath.Join(mnt, "f"))
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		buf := make([]byte, 9)
		n, err := s.ReadAt("f", want, buf, 0)
		done <- result{buf[:n], err}
	}()
	for deadline := time.Now().Add(5 * time.Second); sim.Reading() == 0; {
		select {
		case r := <-done:
			t.Fatalf("the read ended before the rewrite: %q, %v", r.b, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the read never reached the PFS")
		}
		time.Sleep(time.Millisecond)
	}
	rewriteInPlace(t, path, []byte("new bytes"))
	r := <-done
	if !errors.Is(r.err, ErrChanged) {
		t.Fatalf("a read during a rewrite returned %q, %v; want ErrChanged", r.b, r.err)
	}
}

// The same holds for a Handle, which a packed dataset keeps open: a read
// after which the file is another version fails.
func TestHandleReadAtRewritten(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, []byte("old bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h, err := s.OpenHandle("f")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	buf := make([]byte, 9)
	if _, err := h.ReadAt(buf, 0); err != nil || string(buf) != "old bytes" {
		t.Fatalf("ReadAt: %q, %v", buf, err)
	}
	rewriteInPlace(t, path, []byte("new bytes"))
	if n, err := h.ReadAt(buf, 0); !errors.Is(err, ErrChanged) {
		t.Fatalf("a read of a rewritten file returned %q, %v; want ErrChanged", buf[:n], err)
	}
	if err := h.Check(); !errors.Is(err, ErrChanged) {
		t.Fatalf("Check of a rewritten file: %v; want ErrChanged", err)
	}
}

// simSource mounts a simulated PFS of cfg at mnt and opens a Source over
// it; both go at the test's end (a Source may be closed twice).
func simSource(t *testing.T, mnt string, cfg pfssim.Config) (*pfssim.Sim, *Source) {
	t.Helper()
	sim, err := pfssim.Mount(mnt, cfg)
	if err != nil {
		t.Skipf("no FUSE here: %v", err)
	}
	t.Cleanup(func() { sim.Unmount() })
	s, err := Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return sim, s
}

// rewriteInPlace writes b over the start of the file at path, keeping its
// size, and puts its mtime back: only the ctime tells.
func rewriteInPlace(t *testing.T, path string, b []byte) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
}

// Close while an open is stuck in a PFS that stopped answering returns at
// once; the directory descriptor stays open under the stuck open, which
// then resolves in SOURCE, not in whatever file took its number, and is
// closed when it ends. Opens after Close fail.
func TestCloseDuringStuckOpen(t *testing.T) {
	dir, mnt := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	sim, s := simSource(t, mnt, pfssim.Config{Dir: dir})
	want := versionOf(t, filepath.Join(mnt, "f"))
	sim.Hang()
	done := make(chan error, 1)
	go func() {
		_, err := s.ReadAt("f", want, make([]byte, 5), 0)
		done <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		users := s.users
		s.mu.Unlock()
		if users == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the open never started")
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadAt("f", want, make([]byte, 5), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("a read after Close: %v, want ErrClosed", err)
	}
	// Numbers freed now would be taken by these.
	for range 8 {
		f, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
	}
	sim.Resume()
	if err := <-done; err != nil {
		t.Errorf("the stuck read, once answered: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rootFD != -1 {
		t.Error("the last user did not close the directory descriptor")
	}
}
