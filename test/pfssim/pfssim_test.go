package pfssim

import (
	"os"
	"path/filepath"
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
