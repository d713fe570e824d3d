package loader

import (
	"context"
	"math"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/ramcache"
	"github.com/dlfs/dlfs/source"
	"github.com/dlfs/dlfs/ssdstore"
)

// sparsePFS serves a file of any size, all zeros, as a sparse file does.
type sparsePFS struct{}

func (s sparsePFS) ReadAt(path string, want source.Version, p []byte, off int64) (int, error) {
	if off >= want.Size {
		return 0, nil
	}
	n := min(int64(len(p)), want.Size-off)
	clear(p[:n])
	return int(n), nil
}

func TestBlocks(t *testing.T) {
	for _, c := range []struct{ size, bs, want int64 }{
		{0, 4, 1}, {1, 4, 1}, {4, 4, 1}, {5, 4, 2}, {8, 4, 2},
		{math.MaxInt64, 1 << 20, math.MaxInt64>>20 + 1}, {math.MaxInt64, math.MaxInt64, 1}, {math.MaxInt64 - 1, math.MaxInt64, 1},
	} {
		if got := Blocks(c.size, c.bs); got != c.want {
			t.Errorf("Blocks(%d, %d) = %d, want %d", c.size, c.bs, got, c.want)
		}
	}
	for _, c := range []struct{ size, bs, i, want int64 }{
		{10, 4, 0, 4}, {10, 4, 2, 10}, {math.MaxInt64, 1 << 20, math.MaxInt64 >> 20, math.MaxInt64},
	} {
		if got := blockEnd(c.size, c.bs, c.i); got != c.want {
			t.Errorf("blockEnd(%d, %d, %d) = %d, want %d", c.size, c.bs, c.i, got, c.want)
		}
	}
}

// The last block of a file within a block of 2^63 bytes used to panic:
// (i+1)*bs overflowed.
func TestReadAtNearMaxSize(t *testing.T) {
	l := New(Config{BlockSize: 1 << 20}, ramcache.New(ramcache.Config{Capacity: 1 << 22}), nil, sparsePFS{})
	e := entry("huge", math.MaxInt64)
	for _, off := range []int64{math.MaxInt64 - 1, math.MaxInt64 - 4096, math.MaxInt64 - 1<<20 - 10, math.MaxInt64 &^ (1<<20 - 1)} {
		b, err := l.ReadAt(context.Background(), e, make([]byte, 128<<10), off)
		if err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		if want := min(128<<10, math.MaxInt64-off); int64(len(b)) != want {
			t.Errorf("read at %d: %d bytes, want %d", off, len(b), want)
		}
	}
}

// FuzzReadAtBounds drives the read path with sizes and offsets near 2^63
// and across block edges: a read returns exactly the bytes that lie in
// the file, all zeros here, and never panics.
func FuzzReadAtBounds(f *testing.F) {
	for _, s := range []struct {
		size, off int64
		n         uint32
	}{
		{math.MaxInt64, math.MaxInt64 - 1, 4096}, {math.MaxInt64, math.MaxInt64 - 1<<20, 1 << 20},
		{math.MaxInt64 - 5, math.MaxInt64 - 1<<21, 3 << 19}, {10, 3, 100}, {1 << 20, 1<<20 - 1, 2}, {5, -1, 5}, {0, 0, 1},
	} {
		f.Add(s.size, s.off, s.n, uint8(20))
	}
	f.Fuzz(func(t *testing.T, size, off int64, n uint32, shift uint8) {
		if size < 0 {
			size = -(size + 1)
		}
		bs := int64(1) << (10 + shift%11) // 1 KiB to 1 MiB
		n %= 4 << 20
		l := New(Config{BlockSize: bs}, ramcache.New(ramcache.Config{Capacity: 8 << 20}), nil, sparsePFS{})
		b, err := l.ReadAt(context.Background(), entry("f", size), make([]byte, n), off)
		if err != nil {
			t.Fatalf("size %d, read of %d at %d: %v", size, n, off, err)
		}
		want := int64(0)
		if off >= 0 && off < size {
			want = min(int64(n), size-off)
		}
		if int64(len(b)) != want {
			t.Fatalf("size %d, read of %d at %d: %d bytes, want %d", size, n, off, len(b), want)
		}
		for _, c := range b {
			if c != 0 {
				t.Fatalf("size %d, read of %d at %d: a byte that is not the file's", size, n, off)
			}
		}
	})
}

// prefixSSD is a fakeSSD that can drop a file's blocks at once.
type prefixSSD struct{ *fakeSSD }

func (s prefixSSD) DeletePrefix(prefix string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.m {
		if strings.HasPrefix(k, prefix) {
			delete(s.m, k)
		}
	}
}

// Invalidating a sparse file of 2^63 bytes (2^43 blocks) drops its cached
// blocks without a delete per block, which would run for days under the
// refresh (or an evict's control write).
func TestInvalidateHugeFile(t *testing.T) {
	ssd := prefixSSD{&fakeSSD{m: map[string]ssdstore.Block{}}}
	ram := ramcache.New(ramcache.Config{Capacity: 1 << 22})
	// No read-ahead: the test counts the blocks its reads fetch.
	l := New(Config{BlockSize: 1 << 20, NoReadAhead: true}, ram, ssd, sparsePFS{})
	defer l.Close()
	e := catalog.At("huge", catalog.Entry{Ino: 7, Size: math.MaxInt64, Mtime: 7, Mode: syscall.S_IFREG | 0o644})
	other := catalog.At("other", catalog.Entry{Ino: 8, Size: 10, Mtime: 7, Mode: syscall.S_IFREG | 0o644})
	for _, off := range []int64{0, math.MaxInt64 - 4096} {
		if _, err := l.ReadAt(context.Background(), e, make([]byte, 4096), off); err != nil {
			t.Fatal(err)
		}
	}
	l.ReadAt(context.Background(), other, make([]byte, 10), 0)
	waitFor(t, "the SSD writes", func() bool { ssd.mu.Lock(); defer ssd.mu.Unlock(); return len(ssd.m) == 3 })
	done := make(chan struct{})
	go func() { l.Invalidate(e); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Invalidate of a 2^63-byte file walks its blocks")
	}
	if l.InRAM(e) || ram.Contains(BlockKey("huge", math.MaxInt64>>20)) || l.OnSSD(e) {
		t.Error("a block of the invalidated file is still cached")
	}
	if !l.InRAM(other) {
		t.Error("Invalidate dropped another file's block")
	}
}
