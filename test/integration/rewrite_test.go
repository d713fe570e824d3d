package integration

// Issue 27, "A file rewritten in place while dlfs reads it is served as a
// mix of both versions": the rewrite lands while dlfs's read of a block
// is in the PFS. The read fails with ESTALE, nothing of it is cached, and
// the file is never served whole from two versions: until a refresh every
// read of the changed part fails, and after one the file reads as its new
// version.

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRewriteDuringRead(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	old, next := randomBytes(3<<20, 1), randomBytes(3<<20, 2)
	if err := os.WriteFile(path, old, 0o644); err != nil {
		t.Fatal(err)
	}
	p := startPFS(t, dir, "-read-latency", "1s", "-no-attr-cache")
	// Read-ahead off: block 1 must be read by the second dd, not fetched
	// ahead while the first one reads block 0 (TestRewriteDuringReadAhead).
	d := startDlfs(t, p.Mnt, "--infer=false", "--push=false", "--read-ahead=0")
	mnt := filepath.Join(d.Mnt, "f")
	// Block 0 read and cached as the old version.
	if out, err := exec.Command("dd", "if="+mnt, "of=/dev/null", "bs=1M", "count=1", "iflag=direct").CombinedOutput(); err != nil {
		t.Fatalf("dd: %v\n%s", err, out)
	}
	// Block 1's read is in the PFS when the file is rewritten in place,
	// same size, mtime put back.
	var stderr bytes.Buffer
	reader := exec.Command("dd", "if="+mnt, "of=/dev/null", "bs=1M", "skip=1", "count=1", "iflag=direct")
	reader.Stderr = &stderr
	if err := reader.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); p.counters(t).Reading == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("block 1's read never reached the PFS")
		}
	}
	rewriteInPlace(t, path, next)
	if err := reader.Wait(); err == nil || !strings.Contains(stderr.String(), "Stale file handle") {
		t.Fatalf("the read of a block rewritten while dlfs read it: %v, %q; want ESTALE", err, stderr.String())
	}
	checkNeverMixed(t, d, mnt, old, next)
}

// TestRewriteDuringReadAhead: the same rewrite lands while a reader's
// block and the blocks fetched ahead of it are in the PFS. None of them
// is served or kept.
func TestRewriteDuringReadAhead(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	old, next := randomBytes(3<<20, 3), randomBytes(3<<20, 4)
	if err := os.WriteFile(path, old, 0o644); err != nil {
		t.Fatal(err)
	}
	p := startPFS(t, dir, "-read-latency", "1s", "-no-attr-cache")
	d := startDlfs(t, p.Mnt, "--infer=false", "--push=false")
	mnt := filepath.Join(d.Mnt, "f")
	var stderr bytes.Buffer
	reader := exec.Command("dd", "if="+mnt, "of=/dev/null", "bs=1M", "iflag=direct")
	reader.Stderr = &stderr
	if err := reader.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); p.counters(t).Reading < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("read-ahead never had a block in the PFS beside the reader's (%d reads in flight)", p.counters(t).Reading)
		}
	}
	rewriteInPlace(t, path, next)
	if err := reader.Wait(); err == nil || !strings.Contains(stderr.String(), "Stale file handle") {
		t.Fatalf("a read of the file while it was rewritten under it and its read-ahead: %v, %q; want ESTALE", err, stderr.String())
	}
	checkNeverMixed(t, d, mnt, old, next)
}

// rewriteInPlace writes next over path, same size, and puts its mtime back.
func rewriteInPlace(t *testing.T, path string, next []byte) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(next, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
}

// checkNeverMixed: after a rewrite that a read saw, the whole file fails
// until a refresh, and reads as its new version after one.
func checkNeverMixed(t *testing.T, d *proc, mnt string, old, next []byte) {
	t.Helper()
	// Never a file of two versions: the whole file fails until a refresh.
	dropPageCache(t)
	if b, err := os.ReadFile(mnt); err == nil {
		t.Fatalf("the whole file read back (%d bytes; old %v, new %v) with its second block rewritten",
			len(b), bytes.Equal(b, old), bytes.Equal(b, next))
	}
	if err := control(d.Mnt, "refresh"); err != nil {
		t.Fatal(err)
	}
	dropPageCache(t)
	if b, err := os.ReadFile(mnt); err != nil || !bytes.Equal(b, next) {
		t.Fatalf("after a refresh: %d bytes, %v; want the new version", len(b), err)
	}
	d.alive(t)
}
