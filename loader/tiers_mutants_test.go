package loader

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/ramcache"
	"github.com/dlfs/dlfs/source"
	"github.com/dlfs/dlfs/ssdstore"
)

// Tests written against bugs planted by hand in the loader (issue 39,
// item 15): each fails with one of them in place. They are about where
// a block goes and where it may come from: a peer's block never into this
// node's RAM, a served block kept by its owner, the tiers Cached looks in,
// and blocks of the wrong length.

// A block read from its owning peer is not kept in this node's RAM,
// whether the read fetched it or took it off the stage.
func TestPeerBlockNotKeptInRAM(t *testing.T) {
	files := map[string][]byte{"f": data(100)}
	e, key := entry("f", 100), BlockKey("f", 0)

	l := New(Config{Remote: &fakeRemote{files: files, bs: DefaultConfig().BlockSize}}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, &fakePFS{files: files})
	if _, from, _, err := l.ReadAtWaited(context.Background(), e, make([]byte, 100), 0); err != nil || from != "peer" {
		t.Fatalf("read: from %s, %v", from, err)
	}
	if l.ram.Contains(key) {
		t.Error("a block fetched from its owner was kept in this node's RAM")
	}

	st := &fakeStage{m: map[string]ramcache.Block{}}
	l = New(Config{Stage: st}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, &fakePFS{files: files})
	tag := l.Tag(e, key)
	st.m[key] = ramcache.Block{ID: e.Ino, Data: files["f"], Tag: tag, Sum: integrity.Sum(tag, files["f"]), Peer: true}
	if _, from, _, err := l.ReadAtWaited(context.Background(), e, make([]byte, 100), 0); err != nil || from != "stage" {
		t.Fatalf("read: from %s, %v", from, err)
	}
	if l.ram.Contains(key) {
		t.Error("a peer's block taken off the stage was kept in this node's RAM")
	}
}

// A peer asking this node, the owner, is never handed a peer's block the
// stage holds for a local rank (it is another node's share, and may be the
// asker's own), and what Serve reads for it stays in RAM here.
func TestServeToPeers(t *testing.T) {
	files := map[string][]byte{"f": data(100)}
	e, key := entry("f", 100), BlockKey("f", 0)
	st := &fakeStage{m: map[string]ramcache.Block{}}
	pfs := &fakePFS{files: files}
	l := New(Config{Stage: st}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
	tag := l.Tag(e, key)
	st.m[key] = ramcache.Block{ID: e.Ino, Data: files["f"], Tag: tag, Sum: integrity.Sum(tag, files["f"]), Peer: true}
	if _, _, ok := l.Cached(e, 0); ok {
		t.Error("Cached handed a peer a peer's block off the stage")
	}
	b, sum, err := l.Serve(context.Background(), e, 0)
	if err != nil || !bytes.Equal(b, files["f"]) || !integrity.Check(tag, sum, b) {
		t.Fatalf("Serve: %v", err)
	}
	if pfs.reads.Load() != 1 {
		t.Errorf("%d PFS reads, want Serve's own (the staged block is a peer's)", pfs.reads.Load())
	}
	if !l.ram.Contains(key) {
		t.Error("the block Serve read is not kept in RAM: the owner would read it again for the next peer")
	}
}

// Cached answers from the SSD too, never from the PFS.
func TestCachedFromSSD(t *testing.T) {
	files := map[string][]byte{"f": data(100)}
	e, key := entry("f", 100), BlockKey("f", 0)
	ssd := &fakeSSD{m: map[string]ssdstore.Block{}}
	pfs := &fakePFS{files: files}
	l := New(Config{}, ramcache.New(ramcache.Config{Capacity: 0}), ssd, pfs)
	if _, _, ok := l.Cached(e, 0); ok || pfs.reads.Load() != 0 {
		t.Fatalf("Cached of a block no cache holds: %v, %d PFS reads", ok, pfs.reads.Load())
	}
	tag := l.Tag(e, key)
	ssd.m[key] = ssdstore.Block{ID: e.Ino, Data: files["f"], Tag: tag, Sum: integrity.Sum(tag, files["f"])}
	b, sum, ok := l.Cached(e, 0)
	if !ok || !bytes.Equal(b, files["f"]) || !integrity.Check(tag, sum, b) {
		t.Errorf("Cached of a block on the SSD: %v", ok)
	}
}

// shortPFS answers every read with one byte fewer than asked, and no
// error.
type shortPFS struct{ fakePFS }

func (p *shortPFS) ReadAt(path string, want source.Version, b []byte, off int64) (int, error) {
	n, err := p.fakePFS.ReadAt(path, want, b, off)
	return max(n-1, 0), err
}

// A short read of SOURCE is an error, never a block with a tail of zeros.
func TestShortReadIsAnError(t *testing.T) {
	l := New(Config{}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, &shortPFS{fakePFS{files: map[string][]byte{"f": data(100)}}})
	if b, err := l.ReadAt(context.Background(), entry("f", 100), make([]byte, 100), 0); err == nil {
		t.Errorf("a short read of SOURCE returned %d bytes and no error", len(b))
	}
	if l.ram.Contains(BlockKey("f", 0)) {
		t.Error("a short read was cached")
	}
}

// A tier that holds a block of another length than the catalog's version
// gives it (a bug: every tier checks the version) fails the read with
// source.ErrChanged, never a panic or bytes past the block.
func TestBlockOfAnotherLength(t *testing.T) {
	files := map[string][]byte{"f": data(1000)}
	e, key := entry("f", 1000), BlockKey("f", 0)
	ssd := &fakeSSD{m: map[string]ssdstore.Block{}}
	l := New(Config{}, ramcache.New(ramcache.Config{Capacity: 0}), ssd, &fakePFS{files: files})
	tag := l.Tag(e, key)
	short := append([]byte(nil), files["f"][:500]...)
	ssd.m[key] = ssdstore.Block{ID: e.Ino, Data: short, Tag: tag, Sum: integrity.Sum(tag, short)}
	for _, r := range [][2]int64{{0, 1000}, {400, 200}} {
		b, err := l.ReadAt(context.Background(), e, make([]byte, r[1]), r[0])
		if !errors.Is(err, source.ErrChanged) {
			t.Errorf("read of %d bytes at %d from a 500-byte block of a 1000-byte file: %d bytes, %v; want ErrChanged", r[1], r[0], len(b), err)
		}
	}
}

// A read of several blocks reports the slowest tier that supplied it,
// whichever block came last.
func TestReadAcrossBlocksReportsTheSlowestTier(t *testing.T) {
	const bs = 100
	files := map[string][]byte{"f": data(2 * bs)}
	e := entry("f", 2*bs)
	l := New(Config{BlockSize: bs, NoReadAhead: true}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, &fakePFS{files: files})
	if _, err := l.ReadAt(context.Background(), e, make([]byte, bs), bs); err != nil { // block 1 into RAM
		t.Fatal(err)
	}
	b, from, _, err := l.ReadAtWaited(context.Background(), e, make([]byte, bs), bs/2) // block 0 from the PFS, then block 1 from RAM
	if err != nil || !bytes.Equal(b, files["f"][bs/2:bs/2+bs]) {
		t.Fatalf("read: %v", err)
	}
	if from != "pfs" {
		t.Errorf("a read of a block from the PFS and one from RAM reported %q, want pfs", from)
	}
}

// shortRemote is a fakeRemote whose blocks come a byte short, with a sum
// that holds over what it sends.
type shortRemote struct{ *fakeRemote }

func (r shortRemote) Fetch(ctx context.Context, peer string, e *catalog.Entry, i int64) ([]byte, uint32, error) {
	b, _, err := r.fakeRemote.Fetch(ctx, peer, e, i)
	if err != nil {
		return nil, 0, err
	}
	b = b[:len(b)-1]
	return b, integrity.Sum(integrity.Tag(0, BlockKey(e.Path(), i), e.Version()), b), nil
}

// A block from the owning peer of another length than the block's is
// refused however its sum holds, and the read goes on to the PFS.
func TestPeerBlockOfAnotherLength(t *testing.T) {
	files := map[string][]byte{"f": data(100)}
	pfs := &fakePFS{files: files}
	l := New(Config{Remote: shortRemote{&fakeRemote{files: files, bs: DefaultConfig().BlockSize}}}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
	b, from, _, err := l.ReadAtWaited(context.Background(), entry("f", 100), make([]byte, 100), 0)
	if err != nil || from != "pfs" || !bytes.Equal(b, files["f"]) {
		t.Errorf("read with a peer that sends a block a byte short: from %s, %v", from, err)
	}
}

// A block moved from its previous owner's caches is this node's own now:
// it goes to the SSD tier as a PFS read would.
func TestMovedBlockToSSD(t *testing.T) {
	files := map[string][]byte{"f": data(100)}
	ssd := &fakeSSD{m: map[string]ssdstore.Block{}}
	pfs := &fakePFS{files: files}
	rem := &movedRemote{fakeRemote: &fakeRemote{files: files, bs: DefaultConfig().BlockSize}, previous: "a"}
	l := New(Config{Remote: rem}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), ssd, pfs)
	if _, from, _, err := l.ReadAtWaited(context.Background(), entry("f", 100), make([]byte, 100), 0); err != nil || from != "moved" {
		t.Fatalf("read: from %s, %v", from, err)
	}
	if _, ok, _ := ssd.Get(BlockKey("f", 0), l.Tag(entry("f", 100), BlockKey("f", 0))); !ok {
		t.Error("a block moved from its previous owner was not queued for the SSD")
	}
}

// Serve answers a peer from the stage when it holds the block intact for
// a local rank, without reading SOURCE, and leaves it staged.
func TestServeFromStage(t *testing.T) {
	files := map[string][]byte{"f": data(100)}
	e := entry("f", 100)
	st := &fakeStage{m: map[string]ramcache.Block{}}
	pfs := &fakePFS{files: files}
	l := New(Config{Stage: st}, ramcache.New(ramcache.Config{Capacity: 0}), nil, pfs)
	if n, err := l.Prefetch(context.Background(), e, st.keep); err != nil || n != 1 {
		t.Fatalf("prefetch: %d staged, %v", n, err)
	}
	b, _, err := l.Serve(context.Background(), e, 0)
	if err != nil || !bytes.Equal(b, files["f"]) {
		t.Fatalf("Serve: %v", err)
	}
	if pfs.reads.Load() != 1 || st.len() != 1 {
		t.Errorf("%d PFS reads, %d blocks staged; want the prefetch's read alone, and the block left staged", pfs.reads.Load(), st.len())
	}
}

// A block fetched ahead whose length is not the block's (a tier's bug)
// is not held for the reader, and holds no room.
func TestReadAheadBlockOfAnotherLength(t *testing.T) {
	const bs, blocks = 100, 4
	file := data(bs * blocks)
	e := entry("f", bs*blocks)
	ssd := &fakeSSD{m: map[string]ssdstore.Block{}}
	l := New(Config{BlockSize: bs, ReadAhead: 4 * bs, ReadAheadTotal: 4 * bs}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), ssd, newBlockPFS(map[string][]byte{"f": file}))
	defer l.Close()
	key := BlockKey("f", 1)
	tag := l.Tag(e, key)
	short := append([]byte(nil), file[bs:bs+bs/2]...)
	ssd.m[key] = ssdstore.Block{ID: e.Ino, Data: short, Tag: tag, Sum: integrity.Sum(tag, short)}
	if _, err := l.ReadAt(context.Background(), e, make([]byte, bs/2), 0); err != nil { // the head: block 1 is fetched ahead
		t.Fatal(err)
	}
	l.ahead.running.Wait()
	if l.aheadHas(e, 1) {
		t.Error("a block of half its length was held ahead of the reader")
	}
	if st := l.ReadAheadStats(); st.Held != 0 {
		t.Errorf("%d bytes held ahead after the fetch of a block of another length, want 0", st.Held)
	}
}

// A block kept for a reader (keepForReader) is held only within the
// read-ahead's total bound.
func TestKeepForReaderWithinTotal(t *testing.T) {
	const bs, blocks = 100, 12
	want := data(bs * blocks)
	l := New(Config{BlockSize: bs, ReadAhead: 4 * bs, ReadAheadTotal: bs}, ramcache.New(ramcache.Config{Capacity: 1}), nil, newBlockPFS(map[string][]byte{"f": want}))
	defer l.Close()
	e := entry("f", bs*blocks)
	if _, err := l.ReadAt(context.Background(), e, make([]byte, bs), 5*bs); err != nil { // not the head: no window
		t.Fatal(err)
	}
	l.ahead.running.Wait()
	for _, j := range []int64{7, 8} {
		tag := l.Tag(e, BlockKey("f", j))
		d := want[j*bs : (j+1)*bs]
		l.keepForReader(e, j, blockOf(e, tag, fetch{d, tierPFS, integrity.Sum(tag, d)}), tierPFS)
	}
	if !l.aheadHas(e, 7) || l.aheadHas(e, 8) {
		t.Errorf("blocks 7 and 8 held: %v, %v; want the first alone (the total bound is one block)", l.aheadHas(e, 7), l.aheadHas(e, 8))
	}
	if st := l.ReadAheadStats(); st.Held > bs {
		t.Errorf("%d bytes held ahead, over the total bound of %d", st.Held, bs)
	}
}

// A read that shares a prefetch's fetch and gets the block kept in RAM
// takes the prefetch's staged copy off the stage: it would sit there,
// never read, beside the copy in RAM.
func TestSharedFetchKeptInRAMLeavesTheStage(t *testing.T) {
	file := data(5000)
	pfs := &fakePFS{files: map[string][]byte{"f": file}, gate: make(chan struct{})}
	st := &fakeStage{m: map[string]ramcache.Block{}}
	l := New(Config{Stage: st}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
	e, key := entry("f", 5000), BlockKey("f", 0)
	prefetched := make(chan error, 1)
	go func() {
		_, err := l.Prefetch(context.Background(), e, st.keep)
		prefetched <- err
	}()
	waitFor(t, "the prefetch's PFS read", func() bool { return pfs.reads.Load() == 1 })
	read := make(chan error, 1)
	go func() {
		b, err := l.ReadAt(context.Background(), e, make([]byte, 5000), 0)
		if err == nil && !bytes.Equal(b, file) {
			err = errors.New("wrong bytes")
		}
		read <- err
	}()
	waitFor(t, "the read to join the fetch", func() bool {
		l.flight.mu.Lock()
		defer l.flight.mu.Unlock()
		c := l.flight.calls[flightKey{key, l.Tag(e, key)}]
		return c != nil && c.read
	})
	close(pfs.gate)
	if err := <-read; err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := <-prefetched; err != nil {
		t.Fatalf("prefetch: %v", err)
	}
	if !l.ram.Contains(key) || st.len() != 0 {
		t.Errorf("RAM holds the block: %v; %d blocks left on the stage, want none", l.ram.Contains(key), st.len())
	}
}

// A prefetch of a file whose reader has left it (no read for readerGone)
// reads it through; what the stage refuses past the reader's last read is
// kept for the reader, which reads it from there if it comes back.
func TestRefusedPrefetchKeptForReader(t *testing.T) {
	const bs, blocks = 100, 12
	want := data(bs * blocks)
	pfs := newBlockPFS(map[string][]byte{"f": want})
	l := New(Config{BlockSize: bs, ReadAhead: 4 * bs, ReadAheadTotal: 8 * bs}, ramcache.New(ramcache.Config{Capacity: 1}), nil, pfs)
	defer l.Close()
	e := entry("f", bs*blocks)
	if _, err := l.ReadAt(context.Background(), e, make([]byte, bs), 5*bs); err != nil { // not the head: no window
		t.Fatal(err)
	}
	l.ahead.running.Wait()
	l.ahead.mu.Lock()
	l.ahead.streams["f"].at = time.Now().Add(-2 * readerGone) // the reader left a while ago
	l.ahead.mu.Unlock()
	refuse := func(*catalog.Entry, int64, ramcache.Block) bool { return false }
	if _, err := l.Prefetch(context.Background(), e, refuse); err != nil {
		t.Fatal(err)
	}
	b, err := l.ReadAt(context.Background(), e, make([]byte, bs), 6*bs)
	if err != nil || !bytes.Equal(b, want[6*bs:7*bs]) {
		t.Fatalf("block 6: %v", err)
	}
	pfs.mu.Lock()
	defer pfs.mu.Unlock()
	n := 0
	for _, r := range pfs.reads["f"] {
		if r[0] == 6*bs {
			n++
		}
	}
	if n != 1 {
		t.Errorf("block 6 read %d times from the PFS, want once (the prefetch's, kept for the reader)", n)
	}
}

// waitingCtx closes waiting when a wait asks for Done: its read waits on
// another's fetch.
type waitingCtx struct {
	context.Context
	once    sync.Once
	waiting chan struct{}
}

func (c *waitingCtx) Done() <-chan struct{} {
	c.once.Do(func() { close(c.waiting) })
	return c.Context.Done()
}

// scriptStage is a fakeStage whose Serve misses the first and third looks
// (the block not staged yet), and holds the second until release.
type scriptStage struct {
	*fakeStage
	calls            atomic.Int64
	second, released chan struct{}
}

func (s *scriptStage) Serve(key string, tag uint64, lo, hi int) (ramcache.Block, bool, bool) {
	switch s.calls.Add(1) {
	case 1, 3:
		return ramcache.Block{}, false, false
	case 2:
		close(s.second)
		<-s.released
	}
	return s.fakeStage.Serve(key, tag, lo, hi)
}

// TestSharedReadOfAStagedBlockServed: two reads of a block's two halves
// miss the stage at first; the first one's fetch finds the block staged
// meanwhile, and the second shares that fetch. Each read's part is
// counted: the block leaves the stage once both are read.
func TestSharedReadOfAStagedBlockServed(t *testing.T) {
	const n = 4096
	file := data(n)
	e, key := entry("f", n), BlockKey("f", 0)
	st := &scriptStage{fakeStage: &fakeStage{m: map[string]ramcache.Block{}}, second: make(chan struct{}), released: make(chan struct{})}
	l := New(Config{Stage: st}, ramcache.New(ramcache.Config{Capacity: 0}), nil, &fakePFS{files: map[string][]byte{"f": file}})
	tag := l.Tag(e, key)
	st.m[key] = blockOf(e, tag, fetch{file, tierPFS, integrity.Sum(tag, file)})
	read := func(ctx context.Context, off int64, done chan<- error) {
		b, from, _, err := l.ReadAtWaited(ctx, e, make([]byte, n/2), off)
		if err == nil && (from != "stage" || !bytes.Equal(b, file[off:off+n/2])) {
			err = fmt.Errorf("from %s, right bytes %v", from, bytes.Equal(b, file[off:off+n/2]))
		}
		done <- err
	}
	first, second := make(chan error, 1), make(chan error, 1)
	go read(context.Background(), 0, first)
	<-st.second // the first read's fetch looks at the stage
	ctx := &waitingCtx{Context: context.Background(), waiting: make(chan struct{})}
	go read(ctx, n/2, second)
	<-ctx.waiting // the second read waits on the first's fetch
	close(st.released)
	if err := <-first; err != nil {
		t.Fatalf("first half: %v", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("second half: %v", err)
	}
	if st.len() != 0 {
		t.Error("the block is still staged after reads of both its halves: the read that shared the fetch was not counted")
	}
}
