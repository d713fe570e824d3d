package pfssim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestCounts: opens, read calls and bytes are counted exactly and reach the
// stats file; every read reaches the simulator (direct I/O, no cache).
func TestCounts(t *testing.T) {
	dir, mnt := t.TempDir(), t.TempDir()
	data := make([]byte, 300_000)
	if err := os.WriteFile(filepath.Join(dir, "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	stats := filepath.Join(t.TempDir(), "stats.json")
	sim, err := Mount(mnt, Config{Dir: dir, StatsFile: stats, Bandwidth: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Unmount() })
	for i := 0; i < 2; i++ {
		b, err := os.ReadFile(filepath.Join(mnt, "f"))
		if err != nil || len(b) != len(data) {
			t.Fatalf("read %d: %d bytes, %v", i, len(b), err)
		}
	}
	c := sim.Counters()
	if c.Opens != 2 || c.Bytes != 2*int64(len(data)) || c.ReadOps < 2 {
		t.Errorf("counters %+v: want 2 opens and %d bytes", c, 2*len(data))
	}
	if err := sim.Dump(); err != nil {
		t.Fatal(err)
	}
	got, err := ReadCounters(stats)
	if err != nil || got.Bytes != c.Bytes || got.Dumps != 1 {
		t.Errorf("stats file %+v, %v; want %+v with 1 dump", got, err, c)
	}
}

// TestPerMountInodes: two mounts of one directory with PerMountInodes show
// a file under two inode numbers, each stable within its mount, distinct
// between files, and the bytes and times alike; without it the backing
// file's number shows through.
func TestPerMountInodes(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"a", "b"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stat := func(p string) *syscall.Stat_t {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return &st
	}
	mount := func(perMount bool) string {
		mnt := t.TempDir()
		sim, err := Mount(mnt, Config{Dir: dir, PerMountInodes: perMount, NoAttrCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sim.Unmount() })
		return mnt
	}
	m1, m2, plain := mount(true), mount(true), mount(false)
	backing := stat(filepath.Join(dir, "a"))
	a1, a2 := stat(filepath.Join(m1, "a")), stat(filepath.Join(m2, "a"))
	if a1.Ino == a2.Ino || a1.Ino == backing.Ino {
		t.Errorf("inode of a: %d and %d on two mounts, %d backing; want three numbers", a1.Ino, a2.Ino, backing.Ino)
	}
	if again := stat(filepath.Join(m1, "a")); again.Ino != a1.Ino {
		t.Errorf("a's inode changed within one mount: %d then %d", a1.Ino, again.Ino)
	}
	if b1 := stat(filepath.Join(m1, "b")); b1.Ino == a1.Ino {
		t.Errorf("a and b share inode %d", a1.Ino)
	}
	if a1.Size != backing.Size || a1.Mtim != backing.Mtim || a1.Ctim != backing.Ctim {
		t.Errorf("a on a mount %+v, backing %+v: size and times differ", a1, backing)
	}
	if p := stat(filepath.Join(plain, "a")); p.Ino != backing.Ino {
		t.Errorf("without PerMountInodes a's inode is %d, backing %d", p.Ino, backing.Ino)
	}
	if b, err := os.ReadFile(filepath.Join(m2, "b")); err != nil || string(b) != "b" {
		t.Errorf("read b on a per-mount mount: %q, %v", b, err)
	}
}

// TestTrace: with TraceFile, every read served is a line (path, offset,
// bytes) and every Dump a marker between them, written at Unmount; the
// lines add up to the bytes counted.
func TestTrace(t *testing.T) {
	dir, mnt := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "d", "f"), make([]byte, 300_000), 0o644); err != nil {
		t.Fatal(err)
	}
	trace := filepath.Join(t.TempDir(), "trace")
	sim, err := Mount(mnt, Config{Dir: dir, TraceFile: trace})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(filepath.Join(mnt, "d", "f")); err != nil {
		t.Fatal(err)
	}
	if err := sim.Dump(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(mnt, "d", "f"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(make([]byte, 1000), 5000); err != nil {
		t.Fatal(err)
	}
	f.Close()
	bytes := sim.Counters().Bytes
	if err := sim.Unmount(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	var sum int64
	var dumps int
	for i, l := range lines {
		var path string
		var off, n int64
		if _, err := fmt.Sscanf(l, "%s %d %d", &path, &off, &n); err != nil {
			if l == "-- dump 1 0" {
				dumps++
				continue
			}
			t.Fatalf("line %d %q: %v", i, l, err)
		}
		if path != "d/f" || off < 0 || n < 0 {
			t.Fatalf("line %d %q: want a read of d/f", i, l)
		}
		sum += n
	}
	if dumps != 1 || sum != bytes || lines[len(lines)-1] != "d/f 5000 1000" {
		t.Errorf("trace %q: want the reads (%d bytes), one dump marker, and the last read at 5000", lines, bytes)
	}
}
