package integration

// Issue 27, "A read of the last block of a file within 1 MiB of 2^63
// bytes panics" and "Sparse files whose sizes sum past 2^63 overflow the
// warm-up's sums": over a tmpfs SOURCE holding sparse files of nearly
// 2^63 bytes, reads near the end return the file's zeros, the warm-up
// finds that none fits a small cache and reads nothing, and the daemon
// logs no panic.

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestHugeSparseFiles(t *testing.T) {
	src := t.TempDir()
	if err := syscall.Mount("tmpfs", src, "tmpfs", 0, "size=16m"); err != nil {
		t.Fatalf("mount tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(src, syscall.MNT_DETACH) })
	for _, name := range []string{"a", "b", "c"} {
		if err := os.WriteFile(filepath.Join(src, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(filepath.Join(src, name), math.MaxInt64); err != nil {
			t.Fatal(err)
		}
	}
	d := startDlfs(t, src, "--infer=false", "--push=false", "--ram-cache", "16MiB")
	f, err := os.Open(filepath.Join(d.Mnt, "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, off := range []int64{math.MaxInt64 - 4095, math.MaxInt64 - 1<<20 - 4096, 1 << 40} {
		buf := make([]byte, 4095)
		n, err := syscall.Pread(int(f.Fd()), buf, off)
		if err != nil || n != len(buf) || !bytes.Equal(buf, make([]byte, len(buf))) {
			t.Errorf("read at %d: %d bytes, %v; want %d zeros", off, n, err, len(buf))
		}
	}
	before := num(dlfsStats(t, d.Mnt), "pfs", "bytes")
	if err := control(d.Mnt, "warmup ."); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the warm-up never ended: %v", dlfsStats(t, d.Mnt)["warmup"])
		}
		st := dlfsStats(t, d.Mnt)
		w, _ := st["warmup"].(map[string]any)
		if w["state"] == "done" {
			if w["fit_files"].(float64) != 0 || w["bytes"].(float64) < math.MaxInt64/2 {
				t.Errorf("warm-up of three files of 2^63 bytes into 16 MiB: %v", w)
			}
			break
		}
	}
	if got := num(dlfsStats(t, d.Mnt), "pfs", "bytes") - before; got > 0 {
		t.Errorf("the warm-up read %v bytes of SOURCE; none fits", got)
	}
	// Dropping their cached blocks walks the caches, not 2^43 block numbers:
	// an evict, and a refresh that finds one changed, return.
	done := make(chan error, 1)
	go func() {
		err := control(d.Mnt, "evict a")
		if err == nil {
			err = os.Truncate(filepath.Join(src, "b"), math.MaxInt64-1)
		}
		if err == nil {
			err = control(d.Mnt, "refresh")
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("an evict or a refresh of 2^63-byte files did not return")
	}
	if strings.Contains(d.Stderr.String(), "panic") {
		t.Errorf("the daemon panicked:\n%s", d.Stderr)
	}
	d.alive(t)
}
