package loader

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/ramcache"
	"github.com/dlfs/dlfs/source"
)

// randomRows reads rows of rowBytes of e in a scattered order after a
// read of its head, as h5py reads an HDF5 file, and checks their bytes.
// Rows start at base, after a header.
func randomRows(t *testing.T, l *Loader, e *catalog.Entry, want []byte, base int64, rows []int64, rowBytes int64) {
	t.Helper()
	read := func(off int64) {
		b, err := l.ReadAt(context.Background(), e, make([]byte, rowBytes), off)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, want[off:off+rowBytes]) {
			t.Fatalf("row at %d: wrong bytes", off)
		}
	}
	read(0)
	for _, r := range rows {
		read(base + r*rowBytes)
	}
}

// A random reader of a file the RAM tier cannot keep, with no SSD tier,
// makes the PFS read its rows and little more: not a block per row, nor
// two for a row that straddles two blocks.
func TestNarrowRandomReader(t *testing.T) {
	const bs, blocks, rowBytes = 4096, 256, 512 // 8 rows a block; 1 MiB, as the RAM tier
	want := data(bs * blocks)
	pfs := newBlockPFS(map[string][]byte{"f": want})
	l := New(Config{BlockSize: bs, ReadAhead: 4 * bs, ReadAheadTotal: 16 * bs},
		ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
	defer l.Close()
	e := entry("f", int64(len(want)))
	var rows []int64
	for i := int64(0); i < 300; i++ {
		// Past block 3: a read of the head opens a window again, and
		// one in the two blocks after the head goes on forward.
		rows = append(rows, 4*bs/rowBytes+(i*577+13)%((blocks-4)*bs/rowBytes-1))
	}
	randomRows(t, l, e, want, 100, rows, rowBytes)
	waitFor(t, "the read-ahead to settle", func() bool { return l.ReadAheadStats().Held == 0 })
	n, _ := pfs.bytesRead("f")
	// The head's block, one fetched ahead of it, then the rows alone.
	if limit := int64(2*bs) + int64(len(rows))*rowBytes; n > limit {
		t.Errorf("%d random rows of %d bytes made the PFS serve %d bytes, over %d", len(rows), rowBytes, n, limit)
	}
	if st := l.ReadAheadStats(); st.Narrow != int64(len(rows))*rowBytes {
		t.Errorf("narrow reads: %d bytes; want the rows' %d", st.Narrow, int64(len(rows))*rowBytes)
	}
	// A narrow read checks the file's version as a block's read does.
	pfs.mu.Lock()
	pfs.files["f"] = data(bs*blocks + 1)
	pfs.mu.Unlock()
	if _, err := l.ReadAt(context.Background(), e, make([]byte, rowBytes), 100*bs+rowBytes); !errors.Is(err, source.ErrChanged) {
		t.Errorf("a narrow read of a changed file: %v, want ErrChanged", err)
	}
}

// With a RAM tier that holds the file, the same reader reads whole
// blocks: each once from the PFS, the rows after the first from RAM.
func TestNarrowNotWhenCached(t *testing.T) {
	const bs, blocks, rowBytes = 4096, 64, 512
	want := data(bs * blocks)
	pfs := newBlockPFS(map[string][]byte{"f": want})
	l := New(Config{BlockSize: bs, ReadAhead: 4 * bs, ReadAheadTotal: 16 * bs},
		ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
	defer l.Close()
	e := entry("f", int64(len(want)))
	var rows []int64
	for i := int64(0); i < 2*blocks*bs/rowBytes; i++ {
		rows = append(rows, (i*37+5)%(blocks*bs/rowBytes))
	}
	randomRows(t, l, e, want, 0, rows, rowBytes)
	waitFor(t, "the read-ahead to settle", func() bool { return l.ReadAheadStats().Held == 0 })
	n, twice := pfs.bytesRead("f")
	// The block fetched ahead of the head may be dropped when the reader
	// turns away (readahead.go) and read again: at most one block.
	if n > int64(len(want))+bs || len(twice) > 1 {
		t.Errorf("the PFS served %d bytes of a %d-byte file that RAM holds; blocks read twice at %v", n, len(want), twice)
	}
	if st := l.ReadAheadStats(); st.Narrow != 0 {
		t.Errorf("narrow reads of a file RAM holds: %d bytes", st.Narrow)
	}
}

// A read of part of a cached block checks the segments it lies in: a read
// of an intact part is a hit although another part is damaged, and a read
// of the damaged part misses and reads the right bytes again.
func TestPartOfBlockChecked(t *testing.T) {
	const bs = 4 * integrity.SegmentBytes
	want := data(bs)
	pfs := newBlockPFS(map[string][]byte{"f": want})
	l := New(Config{BlockSize: bs}, ramcache.New(ramcache.Config{Capacity: 8 << 20}), nil, pfs)
	defer l.Close()
	e := entry("f", bs)
	read := func(off int64) {
		t.Helper()
		b, err := l.ReadAt(context.Background(), e, make([]byte, 100), off)
		if err != nil || !bytes.Equal(b, want[off:off+100]) {
			t.Fatalf("read at %d: %v, right bytes %v", off, err, bytes.Equal(b, want[off:off+100]))
		}
	}
	read(0)
	key := BlockKey("f", 0)
	b, ok := l.ram.Get(key, l.Tag(e, key))
	if !ok || len(b.Segs) != 4 {
		t.Fatalf("the block is not cached with its segments: %v, %d", ok, len(b.Segs))
	}
	b.Data[3*integrity.SegmentBytes+5] ^= 1 // damaged in place
	read(integrity.SegmentBytes)
	if n, _ := pfs.bytesRead("f"); n != bs {
		t.Fatalf("a read of an intact part went to the PFS (%d bytes read)", n)
	}
	read(3 * integrity.SegmentBytes)
	if n, _ := pfs.bytesRead("f"); n != 2*bs {
		t.Errorf("a read of the damaged part: the PFS served %d bytes in all, want %d", n, 2*bs)
	}
}
