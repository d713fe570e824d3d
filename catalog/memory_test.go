package catalog

import (
	"context"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"unsafe"

	"github.com/dlfs/dlfs/test/memstat"
)

// manyFiles is a Lister of n files under n/1000 class directories, named as
// ImageNet's are.
type manyFiles int

func (l manyFiles) List(ctx context.Context) ([]File, error) {
	files := make([]File, 0, int(l))
	for i := 0; i < int(l); i++ {
		files = append(files, File{
			Path: fmt.Sprintf("train/n%08d/n%08d_%d.JPEG", i/1000, i/1000, i),
			Mode: syscall.S_IFREG | 0o644, Size: int64(100_000 + i%1000), Mtime: int64(i), Ctime: int64(i), Ino: uint64(i + 1000),
		})
	}
	return files, nil
}

// heap returns the live heap after a collection.

// TestMemoryPerEntry measures what the catalog keeps per file at scale
// (issue 13: 10 M files must fit in a few bytes each).
func TestMemoryPerEntry(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a catalog of a million files")
	}
	const n = 1_000_000
	cfg := DefaultConfig(t.TempDir())
	cfg.Lister = manyFiles(n)
	before := memstat.Heap()
	c, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	per := float64(memstat.Heap()-before) / n
	if c.Snapshot().Files != n {
		t.Fatalf("%d files, want %d", c.Snapshot().Files, n)
	}
	t.Logf("%.0f bytes per file in the catalog", per)
	// An entry (80 bytes, in its directory's array), its name (21 bytes
	// here, in its directory's buffer) and its slot in the inode index (8).
	if z := unsafe.Sizeof(Entry{}); z != 80 {
		t.Errorf("an Entry takes %d bytes, want 80", z)
	}
	if per > 130 {
		t.Errorf("the catalog holds %.0f bytes per file, want at most 130", per)
	}
	runtime.KeepAlive(c)
}
