package loader

import (
	"bytes"
	"context"
	"testing"

	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/ramcache"
)

// Every place the loader takes bytes it did not just read from SOURCE
// checks them against their sum first: the stage (for a reader and for a
// peer) and the blocks fetched ahead. These tests damage the bytes where
// they lie, in memory, as a stray write or a bad DIMM would, and want the
// file's bytes back, read again.

// stagedDamaged is a loader with a fakeStage and a RAM tier that keeps
// nothing, over one file "f" of n bytes whose block was prefetched onto
// the stage and then damaged at byte at.
func stagedDamaged(t *testing.T, n, at int) (*Loader, *fakePFS, *fakeStage, []byte) {
	t.Helper()
	file := data(n)
	pfs := &fakePFS{files: map[string][]byte{"f": file}}
	st := &fakeStage{m: map[string]ramcache.Block{}}
	l := New(Config{Stage: st}, ramcache.New(ramcache.Config{Capacity: 0}), nil, pfs)
	t.Cleanup(func() { l.Close() })
	e := entry("f", int64(n))
	if k, err := l.Prefetch(context.Background(), e, st.keep); err != nil || k != 1 {
		t.Fatalf("prefetch: %d blocks staged, %v", k, err)
	}
	st.mu.Lock()
	st.m[BlockKey("f", 0)].Data[at] ^= 0x40
	st.mu.Unlock()
	return l, pfs, st, file
}

// A demand read does not take a damaged staged block: it reads the file
// again, whether it reads all of the block or the damaged part of it.
func TestStagedBlockDamagedReadAgain(t *testing.T) {
	for _, tc := range []struct {
		name          string
		n, at, off, m int
	}{
		{"whole block", 1000, 500, 0, 1000},
		{"its damaged segment", 3*integrity.SegmentBytes + 100, 2*integrity.SegmentBytes + 7, 2 * integrity.SegmentBytes, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, pfs, _, file := stagedDamaged(t, tc.n, tc.at)
			b, from, _, err := l.ReadAtWaited(context.Background(), entry("f", int64(tc.n)), make([]byte, tc.m), int64(tc.off))
			if err != nil || !bytes.Equal(b, file[tc.off:tc.off+tc.m]) {
				t.Fatalf("read from %s: %v, right bytes %v", from, err, bytes.Equal(b, file[tc.off:tc.off+tc.m]))
			}
			if from != "pfs" || pfs.reads.Load() != 2 {
				t.Errorf("read from %s after %d PFS reads; want the PFS read again", from, pfs.reads.Load())
			}
		})
	}
}

// An intact part of a staged block with a damaged segment elsewhere is
// still served from the stage: a read checks only the segments it lies in.
func TestStagedBlockIntactSegmentServed(t *testing.T) {
	n := 3*integrity.SegmentBytes + 100
	l, pfs, _, file := stagedDamaged(t, n, 2*integrity.SegmentBytes+7)
	b, from, _, err := l.ReadAtWaited(context.Background(), entry("f", int64(n)), make([]byte, 100), 10)
	if err != nil || from != "stage" || !bytes.Equal(b, file[10:110]) || pfs.reads.Load() != 1 {
		t.Errorf("read of an intact segment: from %s after %d PFS reads, %v", from, pfs.reads.Load(), err)
	}
}

// A peer that asks this node is never handed a damaged staged block:
// Serve reads the file again, and Cached (a new owner asking the previous
// one's caches) has nothing to give.
func TestStagedBlockDamagedNotServedToPeers(t *testing.T) {
	l, pfs, _, file := stagedDamaged(t, 1000, 3)
	e := entry("f", 1000)
	if b, sum, ok := l.Cached(e, 0); ok {
		t.Errorf("Cached handed a peer the damaged staged block (right bytes %v)", bytes.Equal(b, file) && integrity.Check(l.Tag(e, BlockKey("f", 0)), sum, b))
	}
	b, sum, err := l.Serve(context.Background(), e, 0)
	if err != nil || !bytes.Equal(b, file) || !integrity.Check(l.Tag(e, BlockKey("f", 0)), sum, b) {
		t.Fatalf("Serve: %v, right bytes %v", err, bytes.Equal(b, file))
	}
	if pfs.reads.Load() != 2 {
		t.Errorf("%d PFS reads, want the prefetch's and Serve's", pfs.reads.Load())
	}
}

// A block fetched ahead of a reader and damaged while held is dropped,
// not read: the read fetches it again, and a backing file is not built
// from it (HeldAhead).
func TestReadAheadBlockDamagedReadAgain(t *testing.T) {
	const bs, blocks = 100, 10
	file := data(bs * blocks)
	pfs := newBlockPFS(map[string][]byte{"f": file})
	l := newAheadLoader(Config{BlockSize: bs, ReadAhead: 4 * bs, ReadAheadTotal: 4 * bs}, pfs)
	defer l.Close()
	e := entry("f", bs*blocks)
	if _, err := l.ReadAt(context.Background(), e, make([]byte, bs/2), 0); err != nil { // the head: block 1 is fetched ahead
		t.Fatal(err)
	}
	waitFor(t, "block 1 fetched ahead", func() bool { return l.aheadHas(e, 1) })
	l.ahead.mu.Lock()
	l.ahead.streams["f"].blocks[1].b.Data[9] ^= 0x40
	l.ahead.mu.Unlock()
	key := BlockKey("f", 1)
	if _, ok := l.HeldAhead(e, 1, l.Tag(e, key)); ok {
		t.Error("HeldAhead gave out a damaged block for a backing file")
	}
	b, err := l.ReadAt(context.Background(), e, make([]byte, bs), bs)
	if err != nil || !bytes.Equal(b, file[bs:2*bs]) {
		t.Fatalf("read of block 1: %v, right bytes %v", err, bytes.Equal(b, file[bs:2*bs]))
	}
	pfs.mu.Lock()
	n := 0
	for _, r := range pfs.reads["f"] {
		if r[0] == bs {
			n++
		}
	}
	pfs.mu.Unlock()
	if n != 2 {
		t.Errorf("block 1 read %d times from the PFS, want twice: ahead, and again once found damaged", n)
	}
}
