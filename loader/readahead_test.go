package loader

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/ramcache"
	"github.com/dlfs/dlfs/source"
)

// blockPFS serves files from memory and records every read: its offset
// and length, and how many were in flight at most.
type blockPFS struct {
	files map[string][]byte
	mu    sync.Mutex
	reads map[string][][2]int64 // path → (off, len) of each read
	in    atomic.Int64
	most  atomic.Int64
	gate  chan struct{} // if set, every read waits for a token
	// held, if set, makes a read at an offset wait until release(off);
	// asked records the offsets asked for, before they wait.
	held  map[int64]chan struct{}
	asked []int64
}

func (p *blockPFS) gateOf(off int64) chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held[off] == nil {
		p.held[off] = make(chan struct{})
	}
	return p.held[off]
}

// release lets the reads at off go on, once or again.
func (p *blockPFS) release(off int64) {
	g := p.gateOf(off)
	select {
	case <-g:
	default:
		close(g)
	}
}

func newBlockPFS(files map[string][]byte) *blockPFS {
	return &blockPFS{files: files, reads: map[string][][2]int64{}}
}

func (p *blockPFS) ReadAt(path string, want source.Version, b []byte, off int64) (int, error) {
	n := p.in.Add(1)
	defer p.in.Add(-1)
	for m := p.most.Load(); n > m && !p.most.CompareAndSwap(m, n); m = p.most.Load() {
	}
	if p.gate != nil {
		<-p.gate
	}
	if p.held != nil {
		p.mu.Lock()
		p.asked = append(p.asked, off)
		p.mu.Unlock()
		<-p.gateOf(off)
	}
	p.mu.Lock()
	p.reads[path] = append(p.reads[path], [2]int64{off, int64(len(b))})
	f, ok := p.files[path]
	p.mu.Unlock()
	if !ok {
		return 0, syscall.ENOENT
	}
	if int64(len(f)) != want.Size {
		return 0, source.ErrChanged
	}
	return copy(b, f[off:]), nil
}

// bytesRead is what the PFS served of path, and every offset read more
// than once.
func (p *blockPFS) bytesRead(path string) (int64, []int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	seen := map[int64]bool{}
	var twice []int64
	for _, r := range p.reads[path] {
		n += r[1]
		if seen[r[0]] {
			twice = append(twice, r[0])
		}
		seen[r[0]] = true
	}
	return n, twice
}

func newAheadLoader(cfg Config, pfs PFS) *Loader {
	return New(cfg, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
}

// A reader moving forward through a file finds the blocks after its read
// fetched ahead of it, each read from the PFS once; the bytes are the
// file's.
func TestReadAheadForward(t *testing.T) {
	const bs, blocks = 100, 40
	want := data(bs * blocks)
	pfs := newBlockPFS(map[string][]byte{"f": want})
	l := newAheadLoader(Config{BlockSize: bs, ReadAhead: 8 * bs, ReadAheadTotal: 8 * bs}, pfs)
	defer l.Close()
	e := entry("f", int64(len(want)))
	var got []byte
	for off := int64(0); off < e.Size; off += bs / 2 { // reads of half a block, as a reader of small buffers
		if i := off / bs; off%bs == 0 && i >= 1 {
			// Nothing but read-ahead asks for block i before this read.
			waitFor(t, fmt.Sprint("block ", i, " fetched ahead"), func() bool {
				pfs.mu.Lock()
				defer pfs.mu.Unlock()
				return slices.ContainsFunc(pfs.reads["f"], func(r [2]int64) bool { return r[0] == off })
			})
		}
		b, err := l.ReadAt(context.Background(), e, make([]byte, bs/2), off)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, b...)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the bytes read are not the file's")
	}
	waitFor(t, "the read-ahead to settle", func() bool { return l.ReadAheadStats().Held == 0 })
	n, twice := pfs.bytesRead("f")
	if n != e.Size || len(twice) > 0 {
		t.Errorf("the PFS served %d bytes of %d, offsets %v twice", n, e.Size, twice)
	}
	st := l.ReadAheadStats()
	if st.Fetched != e.Size-bs || st.Used != st.Fetched || st.Wasted != 0 {
		t.Errorf("read-ahead fetched %d, used %d, wasted %d bytes: want all but the first block, all used", st.Fetched, st.Used, st.Wasted)
	}
}

// The fetches ahead run in parallel, as deep as the per-stream bound
// past the block being read, and no further.
func TestReadAheadParallelWithinBound(t *testing.T) {
	const bs, blocks = 100, 64
	pfs := newBlockPFS(map[string][]byte{"f": data(bs * blocks)})
	pfs.held = map[int64]chan struct{}{}
	l := newAheadLoader(Config{BlockSize: bs, ReadAhead: 4 * bs, ReadAheadTotal: 100 * bs}, pfs)
	defer func() {
		for off := int64(0); off < bs*blocks; off += bs {
			pfs.release(off)
		}
		l.Close()
	}()
	e := entry("f", bs*blocks)
	var read atomic.Int64 // blocks the reader has read
	go func() {
		for off := int64(0); off < e.Size; off += bs {
			if _, err := l.ReadAt(context.Background(), e, make([]byte, bs), off); err != nil {
				return
			}
			read.Add(1)
		}
	}()
	// Blocks 0 to 3 answer, in order; 4 on do not.
	for i := int64(0); i < 4; i++ {
		waitFor(t, fmt.Sprint("block ", i, " asked for"), func() bool {
			pfs.mu.Lock()
			defer pfs.mu.Unlock()
			return slices.Contains(pfs.asked, i*bs)
		})
		pfs.release(i * bs)
		waitFor(t, fmt.Sprint("block ", i, " read"), func() bool { return read.Load() > i })
	}
	// The reader waits for block 4, and the four blocks after it are
	// asked for at the same time; nothing past them.
	waitFor(t, "five reads at once", func() bool { return pfs.in.Load() == 5 })
	pfs.mu.Lock()
	asked := slices.Sorted(slices.Values(pfs.asked))
	pfs.mu.Unlock()
	if want := []int64{0, bs, 2 * bs, 3 * bs, 4 * bs, 5 * bs, 6 * bs, 7 * bs, 8 * bs}; !slices.Equal(asked, want) {
		t.Errorf("the PFS was asked for %v, want the 5 blocks read and the 4 after them", asked)
	}
	if h := l.ReadAheadStats().Held; h != 5*bs {
		t.Errorf("read-ahead holds %d bytes, want the block being read and the per-stream bound, %d", h, 5*bs)
	}
}

// A random reader (rows of an HDF5 file, Parquet row groups) costs at
// most the head's one block: reads that are never adjacent open no
// window.
func TestReadAheadRandomReaderWastesLittle(t *testing.T) {
	const bs, blocks = 100, 200
	want := data(bs * blocks)
	pfs := newBlockPFS(map[string][]byte{"f": want})
	l := newAheadLoader(Config{BlockSize: bs, ReadAhead: 16 * bs, ReadAheadTotal: 64 * bs}, pfs)
	defer l.Close()
	e := entry("f", int64(len(want)))
	order := []int64{0} // the header first, as h5py reads it
	for i := int64(0); i < blocks/7; i++ {
		order = append(order, (i*37+11)%blocks)
	}
	for _, i := range order {
		b, err := l.ReadAt(context.Background(), e, make([]byte, 10), i*bs+3)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, want[i*bs+3:i*bs+13]) {
			t.Fatalf("block %d: wrong bytes", i)
		}
	}
	waitFor(t, "the read-ahead to settle", func() bool { return l.ReadAheadStats().Held == 0 })
	distinct := map[int64]bool{}
	for _, i := range order {
		distinct[i] = true
	}
	n, _ := pfs.bytesRead("f")
	if limit := int64(len(distinct)+1) * bs; n > limit {
		t.Errorf("a random reader of %d blocks made the PFS serve %d bytes, over %d (one block more)", len(distinct), n, limit)
	}
	if w := l.ReadAheadStats().Wasted; w > bs {
		t.Errorf("read-ahead wasted %d bytes on a random reader, over one block", w)
	}
}

// Many readers at once get no more read-ahead memory than the total bound.
func TestReadAheadTotalBound(t *testing.T) {
	const bs, files, blocks = 100, 40, 20
	m := map[string][]byte{}
	for i := range files {
		m[fmt.Sprint("f", i)] = data(bs * blocks)
	}
	pfs := newBlockPFS(m)
	pfs.gate = make(chan struct{})
	const total = 10 * bs
	l := newAheadLoader(Config{BlockSize: bs, ReadAhead: 8 * bs, ReadAheadTotal: total}, pfs)
	defer l.Close()
	var wg sync.WaitGroup
	errs := make(chan error, files)
	for i := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := entry(fmt.Sprint("f", i), bs*blocks)
			for off := int64(0); off < e.Size; off += bs {
				if _, err := l.ReadAt(context.Background(), e, make([]byte, bs), off); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	for {
		select {
		case <-finished:
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			return
		case pfs.gate <- struct{}{}:
			if h := l.ReadAheadStats().Held; h > total {
				t.Fatalf("read-ahead holds %d bytes, over its total bound of %d", h, total)
			}
		}
	}
}

// A file whose last block is small is read with the block before it in
// one request, and its reader finds that block without another.
func TestSmallLastBlockInOneRequest(t *testing.T) {
	const bs = 1024
	want := data(bs + 98) // a numpy .npz: a block and a header
	pfs := newBlockPFS(map[string][]byte{"f": want, "g": data(bs + bs/2)})
	l := newAheadLoader(Config{BlockSize: bs}, pfs)
	defer l.Close()
	e := entry("f", int64(len(want)))
	var got []byte
	for off := int64(0); off < e.Size; off += bs {
		b, err := l.ReadAt(context.Background(), e, make([]byte, bs), off)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, b...)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("wrong bytes")
	}
	pfs.mu.Lock()
	reads := pfs.reads["f"]
	pfs.mu.Unlock()
	if len(reads) != 1 || reads[0] != [2]int64{0, e.Size} {
		t.Errorf("the PFS saw reads %v, want one of the whole file", reads)
	}
	// A last block of half a block is not small: it has a read of its own.
	g := entry("g", bs+bs/2)
	if _, err := l.ReadAt(context.Background(), g, make([]byte, g.Size), 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the read-ahead to settle", func() bool { return l.ReadAheadStats().Held == 0 })
	pfs.mu.Lock()
	defer pfs.mu.Unlock()
	if len(pfs.reads["g"]) != 2 {
		t.Errorf("the PFS saw reads %v of a file of 1.5 blocks, want one per block", pfs.reads["g"])
	}
}

// A file changed while blocks are fetched ahead: a reader of the new
// version never gets a block of the old one.
func TestReadAheadNeverMixesVersions(t *testing.T) {
	const bs, blocks = 100, 8
	old := bytes.Repeat([]byte{'1'}, bs*blocks)
	pfs := newBlockPFS(map[string][]byte{"f": old})
	l := newAheadLoader(Config{BlockSize: bs, ReadAhead: 8 * bs, ReadAheadTotal: 8 * bs}, pfs)
	defer l.Close()
	e1 := catalog.At("f", catalog.Entry{Size: bs * blocks, Mtime: 1, Mode: syscall.S_IFREG | 0o644})
	for off := int64(0); off < 3*bs; off += bs {
		if _, err := l.ReadAt(context.Background(), e1, make([]byte, bs), off); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "blocks held ahead", func() bool { return l.ReadAheadStats().Held > 0 && pfs.in.Load() == 0 })
	// Rewritten in place, same size: only the version tells.
	pfs.mu.Lock()
	pfs.files["f"] = bytes.Repeat([]byte{'2'}, bs*blocks)
	pfs.mu.Unlock()
	e2 := catalog.At("f", catalog.Entry{Size: bs * blocks, Mtime: 2, Mode: syscall.S_IFREG | 0o644})
	for off := int64(3 * bs); off < e2.Size; off += bs {
		b, err := l.ReadAt(context.Background(), e2, make([]byte, bs), off)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.IndexByte(b, '1') >= 0 {
			t.Fatalf("a reader of version 2 got bytes of version 1 at %d", off)
		}
	}
}

// Invalidate drops the blocks held ahead of a changed file.
func TestInvalidateDropsBlocksAhead(t *testing.T) {
	const bs, blocks = 100, 8
	pfs := newBlockPFS(map[string][]byte{"f": data(bs * blocks)})
	l := newAheadLoader(Config{BlockSize: bs, ReadAhead: 8 * bs, ReadAheadTotal: 8 * bs}, pfs)
	defer l.Close()
	e := entry("f", bs*blocks)
	for off := int64(0); off < 2*bs; off += bs {
		if _, err := l.ReadAt(context.Background(), e, make([]byte, bs), off); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "blocks held ahead", func() bool { return l.ReadAheadStats().Held > 0 && pfs.in.Load() == 0 })
	l.Invalidate(e)
	if st := l.ReadAheadStats(); st.Streams != 0 {
		t.Errorf("after Invalidate read-ahead follows %d streams", st.Streams)
	}
	// A fetch that was ending keeps its room until it ends, then drops it.
	waitFor(t, "nothing held", func() bool { return l.ReadAheadStats().Held == 0 })
}

// Close ends the fetches ahead, even on a PFS that does not answer (its
// calls are abandoned, as demand reads' are), and reads after it fail.
func TestCloseEndsReadAhead(t *testing.T) {
	const bs = 100
	pfs := newBlockPFS(map[string][]byte{"f": data(bs * 20)})
	pfs.gate = make(chan struct{})
	defer close(pfs.gate)
	l := newAheadLoader(Config{BlockSize: bs, ReadAhead: 8 * bs, ReadAheadTotal: 8 * bs, PFSTimeout: time.Hour}, pfs)
	e := entry("f", bs*20)
	go l.ReadAt(context.Background(), e, make([]byte, bs), 0)
	waitFor(t, "reads ahead in flight", func() bool { return pfs.in.Load() >= 2 })
	closed := make(chan struct{})
	go func() { l.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("Close waits on the fetches ahead of a PFS that does not answer")
	}
	if _, err := l.ReadAt(context.Background(), e, make([]byte, bs), 5*bs); err == nil {
		t.Error("a read after Close succeeded")
	}
}

// The depth follows the PFS's fitted latency and bandwidth.
func TestReadAheadDepth(t *testing.T) {
	for _, c := range []struct {
		name      string
		lat, per  float64 // seconds, seconds per block
		most, out int64
	}{
		{"latency under a block's time", 0.001, 0.0026, 16, 2},
		{"latency of three blocks", 0.003, 0.001, 16, 4},
		{"at the per-stream bound", 1, 0.001, 8, 8},
		{"unmeasured bandwidth", 0.001, 0, 8, 8},
	} {
		if got := aheadDepth(c.lat, c.per, c.most); got != c.out {
			t.Errorf("%s: depth %d, want %d", c.name, got, c.out)
		}
	}
}

// A prefetch of a file that a reader is moving through leaves the blocks
// it read or passed, and those fetched ahead of it, alone: none is read
// from the PFS twice.
func TestPrefetchLeavesReadersBlocks(t *testing.T) {
	const bs, blocks = 100, 12
	pfs := newBlockPFS(map[string][]byte{"f": data(bs * blocks)})
	l := New(Config{BlockSize: bs, ReadAhead: 2 * bs, ReadAheadTotal: 8 * bs}, ramcache.New(ramcache.Config{Capacity: 1}), nil, pfs)
	defer l.Close()
	e := entry("f", bs*blocks)
	for off := int64(0); off < 4*bs; off += bs {
		if off > 0 {
			waitFor(t, fmt.Sprint("block ", off/bs, " fetched ahead"), func() bool { return l.ReadAheadStats().Fetched >= off })
		}
		if _, err := l.ReadAt(context.Background(), e, make([]byte, bs), off); err != nil {
			t.Fatal(err)
		}
	}
	// Blocks 4 and 5 are held ahead of the reader.
	waitFor(t, "the read-ahead to settle", func() bool { return l.ReadAheadStats().Fetched == 5*bs })
	st := &fakeStage{m: map[string]ramcache.Block{}}
	if _, err := l.Prefetch(context.Background(), e, st.keep); err != nil {
		t.Fatal(err)
	}
	n, twice := pfs.bytesRead("f")
	if len(twice) > 0 {
		t.Errorf("offsets %v read from the PFS twice", twice)
	}
	// Nor the rest: the reader's read-ahead fetches it in order, within
	// its bounds, and a block fetched past them would be read again.
	if n != 6*bs {
		t.Errorf("the PFS served %d bytes, want the %d of blocks 0-5: a prefetch fetched past the reader's read-ahead", n, 6*bs)
	}
}

// A block a prefetch fetched and the stage refused (its sample's reader
// has begun it) is kept for that reader if it has not passed it.
func TestKeepForReader(t *testing.T) {
	const bs, blocks = 100, 12
	want := data(bs * blocks)
	pfs := newBlockPFS(map[string][]byte{"f": want})
	l := New(Config{BlockSize: bs, ReadAhead: 4 * bs, ReadAheadTotal: 8 * bs, NoReadAhead: false}, ramcache.New(ramcache.Config{Capacity: 1}), nil, pfs)
	defer l.Close()
	e := entry("f", bs*blocks)
	if _, err := l.ReadAt(context.Background(), e, make([]byte, bs), 5*bs); err != nil { // not the head: no window
		t.Fatal(err)
	}
	key := BlockKey("f", 7)
	tag := l.Tag(e, key)
	l.keepForReader(e, 7, blockOf(e, tag, fetch{want[7*bs : 8*bs], tierPFS, integrity.Sum(tag, want[7*bs:8*bs])}), tierPFS)
	l.keepForReader(e, 3, blockOf(e, tag, fetch{want[3*bs : 4*bs], tierPFS, 0}), tierPFS) // passed: not kept
	b, err := l.ReadAt(context.Background(), e, make([]byte, bs), 7*bs)
	if err != nil || !bytes.Equal(b, want[7*bs:8*bs]) {
		t.Fatalf("block 7: %v, right bytes %v", err, bytes.Equal(b, want[7*bs:8*bs]))
	}
	pfs.mu.Lock()
	for _, r := range pfs.reads["f"] {
		if r[0] == 7*bs {
			t.Error("block 7 was read from the PFS: it was not kept for the reader")
		}
	}
	pfs.mu.Unlock()
	if l.aheadHas(e, 3) {
		t.Error("a block behind the reader was kept for it")
	}
}

// A random reader whose reads cross into the next block, each sent as two
// requests (an HDF5 row across a block boundary, split by the kernel),
// opens no window: read-ahead wastes no more than the head's block.
func TestReadAheadRandomReaderAcrossBlocks(t *testing.T) {
	const bs, blocks = 100, 200
	l, read := aheadFile(t, bs, blocks, Config{BlockSize: bs, ReadAhead: 16 * bs, ReadAheadTotal: 64 * bs})
	read(0, 10) // the header
	for k := int64(0); k < 40; k++ {
		i := 2 + (k*37+11)%(blocks-3)
		read(i*bs-bs/4, bs/4) // the row's first part, in block i-1
		read(i*bs, bs/4)      // its second part, in block i
	}
	waitFor(t, "the read-ahead to settle", func() bool { return l.ReadAheadStats().Held == 0 })
	if w := l.ReadAheadStats().Wasted; w > bs {
		t.Errorf("read-ahead wasted %d bytes on a random reader of rows across blocks, over one block", w)
	}
}

// A random reader that comes back to rows at the file's head, or reads
// two rows that happen to lie a block apart with a gap between them,
// opens no window; the same reader going on through the file with no
// gaps opens one again.
func TestReadAheadRandomReaderHeadAndNeighbours(t *testing.T) {
	const bs, blocks = 100, 200
	l, read := aheadFile(t, bs, blocks, Config{BlockSize: bs, ReadAhead: 16 * bs, ReadAheadTotal: 64 * bs})
	read(0, 10) // the header
	for k := int64(0); k < 30; k++ {
		i := 3 + (k*37+11)%(blocks-6)
		read(i*bs+60, 10)      // a row
		read((i+1)*bs+50, 10)  // a row a block on, with a gap
		read((i+2)*bs+70, 10)  // and another
		l.ahead.running.Wait() // what they set off fetching is fetched
		read(0, 10)            // a row at the head, from a turned reader
		read(bs/2, 10)         // the next row in the first block
	}
	waitFor(t, "the read-ahead to settle", func() bool { return l.ReadAheadStats().Held == 0 })
	if w := l.ReadAheadStats().Wasted; w > bs {
		t.Errorf("read-ahead wasted %d bytes on a random reader of rows near each other and at the head, over one block", w)
	}
	before := l.ReadAheadStats().Fetched
	for off := int64(100 * bs); off < 140*bs; off += bs / 2 {
		read(off, bs/2) // then a scan with no gaps
	}
	waitFor(t, "a block fetched ahead of a reader scanning on with no gaps after random reads", func() bool {
		return l.ReadAheadStats().Fetched > before
	})
}

// A reader that reads a file through and then again from its head (a
// later epoch) gets read-ahead at once in the second pass, as in the
// first; it is not taken for a random reader.
func TestReadAheadSecondPass(t *testing.T) {
	const bs, blocks = 100, 40
	l, read := aheadFile(t, bs, blocks, Config{BlockSize: bs, ReadAhead: 8 * bs, ReadAheadTotal: 8 * bs})
	for off := int64(0); off < bs*blocks; off += bs / 2 {
		read(off, bs/2)
	}
	l.ahead.running.Wait()
	l.ram.Delete(BlockKey("f", 1)) // RAM holds only the first pass's blocks; a second pass would find them there
	before := l.ReadAheadStats().Fetched
	read(0, bs/2)
	l.ahead.running.Wait()
	if l.ReadAheadStats().Fetched == before {
		t.Error("the second pass's read of the head fetched nothing ahead")
	}
}

// aheadFile is a loader with read-ahead (cfg) over one file "f" of blocks
// blocks of bs bytes, and a read that checks the bytes it returns.
func aheadFile(t *testing.T, bs, blocks int64, cfg Config) (*Loader, func(off, n int64)) {
	t.Helper()
	want := data(int(bs * blocks))
	l := newAheadLoader(cfg, newBlockPFS(map[string][]byte{"f": want}))
	t.Cleanup(func() { l.Close() })
	e := entry("f", int64(len(want)))
	return l, func(off, n int64) {
		t.Helper()
		b, err := l.ReadAt(context.Background(), e, make([]byte, n), off)
		if err != nil || !bytes.Equal(b, want[off:off+n]) {
			t.Fatalf("read at %d: %v", off, err)
		}
	}
}
