package source

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// readBlocks reads path's n blocks of bs bytes at version v.
func readBlocks(s *Source, path string, v Version, bs, n int) ([]byte, error) {
	var out []byte
	for i := range n {
		b := make([]byte, bs)
		k, err := s.ReadAt(path, v, b, int64(i*bs))
		if err != nil {
			return out, err
		}
		out = append(out, b[:k]...)
	}
	return out, nil
}

// TestOneOpenPerFile: a file read block by block is opened once, and its
// bytes are right; with Handles 0 every read opens it.
func TestOneOpenPerFile(t *testing.T) {
	root := t.TempDir()
	data := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	writeFile(t, filepath.Join(root, "big"), data)
	v := versionOf(t, filepath.Join(root, "big"))
	for _, c := range []struct {
		handles int
		opens   int64
	}{{256, 1}, {0, 8}} {
		s, err := OpenConfig(root, Config{Handles: c.handles, HandleIdle: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		got, err := readBlocks(s, "big", v, 8192, 8)
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("handles %d: %d bytes, %v", c.handles, len(got), err)
		}
		if st := s.Stats(); st.Opens != c.opens {
			t.Errorf("handles %d: %d opens for 8 blocks of one file, want %d", c.handles, st.Opens, c.opens)
		}
		s.Close()
	}
}

// TestKeptHandleNeverStale: after a file is replaced by rename (same size,
// mtime put back), rewritten in place, or removed, a read at the old
// version through a kept descriptor fails with ErrChanged instead of
// serving the bytes the descriptor still reaches, and the descriptor is
// dropped.
func TestKeptHandleNeverStale(t *testing.T) {
	for name, change := range map[string]func(t *testing.T, p string){
		"replaced by rename": func(t *testing.T, p string) {
			fi, _ := os.Stat(p)
			writeFile(t, p+".new", bytes.Repeat([]byte("N"), int(fi.Size())))
			os.Chtimes(p+".new", fi.ModTime(), fi.ModTime())
			if err := os.Rename(p+".new", p); err != nil {
				t.Fatal(err)
			}
		},
		"rewritten in place": func(t *testing.T, p string) {
			fi, _ := os.Stat(p)
			writeFile(t, p, bytes.Repeat([]byte("N"), int(fi.Size())))
			os.Chtimes(p, fi.ModTime(), fi.ModTime())
		},
		"removed": func(t *testing.T, p string) {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			p := filepath.Join(root, "f")
			writeFile(t, p, bytes.Repeat([]byte("O"), 8192))
			v := versionOf(t, p)
			s, err := OpenConfig(root, DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if _, err := readBlocks(s, "f", v, 4096, 1); err != nil {
				t.Fatal(err)
			}
			if s.handles.open() != 1 {
				t.Fatalf("%d descriptors kept after a read, want 1", s.handles.open())
			}
			change(t, p)
			b := make([]byte, 4096)
			if _, err := s.ReadAt("f", v, b, 4096); !errors.Is(err, ErrChanged) {
				t.Errorf("a read at the old version after the change: %q, %v; want ErrChanged", b[:8], err)
			}
			if s.handles.open() != 0 {
				t.Errorf("%d descriptors kept after a failed check, want 0", s.handles.open())
			}
		})
	}
}

// TestHandlesBounded: at most Handles descriptors are kept, the least
// recently used idle one going first; DropHandles and Close close them
// all; an idle one closes after HandleIdle.
func TestHandlesBounded(t *testing.T) {
	root := t.TempDir()
	vs := map[string]Version{}
	for i := range 5 {
		name := fmt.Sprint(i)
		writeFile(t, filepath.Join(root, name), []byte(name))
		vs[name] = versionOf(t, filepath.Join(root, name))
	}
	s, err := OpenConfig(root, Config{Handles: 2, HandleIdle: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	read := func(name string) {
		t.Helper()
		b := make([]byte, 1)
		if _, err := s.ReadAt(name, vs[name], b, 0); err != nil || string(b) != name {
			t.Fatalf("%s: %q, %v", name, b, err)
		}
	}
	for _, n := range []string{"0", "1", "0", "2"} { // 1 is the least recently used when 2 comes
		read(n)
	}
	if got := s.handles.open(); got != 2 {
		t.Errorf("%d descriptors kept, want 2", got)
	}
	before := s.Stats().Opens
	read("0")
	if s.Stats().Opens != before {
		t.Error("the most recently used file was evicted instead of the least")
	}
	read("1")
	if s.Stats().Opens != before+1 {
		t.Error("the evicted file was read without an open")
	}
	s.DropHandles()
	if got := s.handles.open(); got != 0 {
		t.Errorf("%d descriptors after DropHandles", got)
	}
	read("3")
	s.Close()
	if got := s.handles.open(); got != 0 {
		t.Errorf("%d descriptors after Close", got)
	}
	if _, err := s.ReadAt("3", vs["3"], make([]byte, 1), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("a read after Close: %v", err)
	}

	// Idle ones close by themselves.
	s, err = OpenConfig(root, Config{Handles: 8, HandleIdle: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	read("4")
	for deadline := time.Now().Add(10 * time.Second); s.handles.open() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("an idle descriptor was never closed")
		}
	}
	if err := (Config{Handles: -1}).Validate(); err == nil {
		t.Error("a negative handle count was accepted")
	}
}

// TestHandlesConcurrent: readers of many files through a small cache,
// with DropHandles racing them, all read the right bytes (run with -race;
// a descriptor closed under a read would fail one, or read another file).
func TestHandlesConcurrent(t *testing.T) {
	root := t.TempDir()
	vs := map[string]Version{}
	for i := range 20 {
		name := fmt.Sprint(i)
		writeFile(t, filepath.Join(root, name), bytes.Repeat([]byte{byte('a' + i)}, 4096))
		vs[name] = versionOf(t, filepath.Join(root, name))
	}
	s, err := OpenConfig(root, Config{Handles: 4, HandleIdle: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				s.DropHandles()
			}
		}
	}()
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := make([]byte, 1024)
			for i := range 400 {
				name := fmt.Sprint((g + i) % 20)
				if _, err := s.ReadAt(name, vs[name], b, int64(i%4)*1024); err != nil {
					t.Error(err)
					return
				}
				if b[0] != byte('a'+(g+i)%20) || b[1023] != b[0] {
					t.Errorf("%s: read another file's bytes", name)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
}

// TestFailedReadClosesOnce: a read whose check fails closes its kept
// descriptor once: a second close would shut whatever descriptor another
// goroutine opened under the same number meanwhile (here, victims that
// stat their own descriptor and must never see EBADF).
func TestFailedReadClosesOnce(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "f")
	writeFile(t, p, []byte("hello"))
	s, err := OpenConfig(root, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	stop := make(chan struct{})
	var victims sync.WaitGroup
	var badf atomic.Int64
	for range 4 {
		victims.Add(1)
		go func() {
			defer victims.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
				if err != nil {
					continue
				}
				var st unix.Stat_t
				for range 20 {
					if unix.Fstat(fd, &st) == unix.EBADF {
						badf.Add(1)
					}
				}
				unix.Close(fd)
			}
		}()
	}
	b := make([]byte, 5)
	for i := range 5000 {
		v := versionOf(t, p)
		if _, err := s.ReadAt("f", v, b, 0); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, os.FileMode(0o600+i%2*0o044)) // moves the ctime
		if _, err := s.ReadAt("f", v, b, 0); !errors.Is(err, ErrChanged) {
			t.Fatalf("a read after the ctime moved: %v", err)
		}
	}
	close(stop)
	victims.Wait()
	if n := badf.Load(); n > 0 {
		t.Errorf("%d stats of other goroutines' descriptors failed with EBADF: a descriptor was closed twice", n)
	}
}

// TestKeptHandleConfined: after a directory on a kept file's path is
// swapped for a symlink, even to where that file now lies, a read through
// the kept descriptor fails as a fresh open would.
func TestKeptHandleConfined(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	os.Mkdir(filepath.Join(root, "a"), 0o755)
	writeFile(t, filepath.Join(root, "a", "b"), []byte("bytes"))
	v := versionOf(t, filepath.Join(root, "a", "b"))
	s, err := OpenConfig(root, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := make([]byte, 5)
	if _, err := s.ReadAt("a/b", v, b, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(root, "a"), filepath.Join(outside, "a")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "a"), filepath.Join(root, "a")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadAt("a/b", v, b, 0); !errors.Is(err, ErrChanged) {
		t.Errorf("a read through a directory swapped for a symlink: %v, want ErrChanged", err)
	}
}
