package loader

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/perfmodel"
	"github.com/dlfs/dlfs/ramcache"
	"github.com/dlfs/dlfs/source"
	"github.com/dlfs/dlfs/ssdstore"
)

// fakePFS serves files from memory and counts reads; gate, if set, holds
// every read until it is closed.
type fakePFS struct {
	files map[string][]byte
	reads atomic.Int64
	gate  chan struct{}
}

func (f *fakePFS) ReadAt(path string, want source.Version, p []byte, off int64) (int, error) {
	f.reads.Add(1)
	if f.gate != nil {
		<-f.gate
	}
	b, ok := f.files[path]
	if !ok {
		return 0, syscall.ENOENT
	}
	if int64(len(b)) != want.Size {
		return 0, source.ErrChanged
	}
	return copy(p, b[off:]), nil
}

// fakeSSD is a map standing in for the SSD tier.
type fakeSSD struct {
	mu sync.Mutex
	m  map[string]ssdstore.Block
}

// Get checks the tag and the sum, as the real store does: a loader that
// stored a wrong sum finds nothing here.
func (s *fakeSSD) Get(key string, tag uint64) (ssdstore.Block, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[key]
	return b, ok && b.Tag == tag && integrity.Check(tag, b.Sum, b.Data), nil
}

func (s *fakeSSD) Put(key string, b ssdstore.Block) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[key] = b
	return nil
}

func (s *fakeSSD) Delete(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
}

func entry(path string, size int64) *catalog.Entry {
	return catalog.At(path, catalog.Entry{Size: size, Mtime: 7, Mode: syscall.S_IFREG | 0o644})
}

func data(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

func TestReadRanges(t *testing.T) {
	const bs = 1000
	file := data(3500) // four blocks, the last partial
	pfs := &fakePFS{files: map[string][]byte{"f": file}}
	l := New(Config{BlockSize: bs}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
	e := entry("f", int64(len(file)))
	for _, c := range []struct{ off, n int }{{0, 10}, {990, 20}, {0, 3500}, {2500, 2000}, {3499, 1}, {3500, 10}, {5000, 1}, {100, 0}} {
		got, err := l.ReadAt(context.Background(), e, make([]byte, c.n), int64(c.off))
		if err != nil {
			t.Fatalf("ReadAt(%d, %d): %v", c.off, c.n, err)
		}
		want := file[min(c.off, len(file)):min(c.off+c.n, len(file))]
		if !bytes.Equal(got, want) {
			t.Errorf("ReadAt(%d, %d): %d bytes, want %d", c.off, c.n, len(got), len(want))
		}
	}
	if n := pfs.reads.Load(); n != 4 {
		t.Errorf("%d PFS reads, want 4 (one per block)", n)
	}
}

func TestConcurrentMissesShareOneFetch(t *testing.T) {
	file := data(5000)
	pfs := &fakePFS{files: map[string][]byte{"f": file}, gate: make(chan struct{})}
	l := New(DefaultConfig(), ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
	e := entry("f", 5000)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if b, err := l.ReadAt(context.Background(), e, make([]byte, 5000), 0); err != nil || !bytes.Equal(b, file) {
				t.Errorf("read: %v", err)
			}
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for pfs.reads.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(pfs.gate)
	wg.Wait()
	if n := pfs.reads.Load(); n != 1 {
		t.Errorf("%d PFS reads for 8 concurrent readers, want 1", n)
	}
}

func TestTiers(t *testing.T) {
	file := data(2000)
	pfs := &fakePFS{files: map[string][]byte{"f": file}}
	ssd := &fakeSSD{m: map[string]ssdstore.Block{}}
	ram := ramcache.New(ramcache.Config{Capacity: 1 << 20})
	l := New(DefaultConfig(), ram, ssd, pfs)
	e := entry("f", 2000)
	e.Ino = 5
	read := func() {
		t.Helper()
		if b, err := l.ReadAt(context.Background(), e, make([]byte, 2000), 0); err != nil || !bytes.Equal(b, file) {
			t.Fatalf("read: %v", err)
		}
	}
	read() // PFS, fills RAM and SSD
	if b := ssd.m[BlockKey("f", 0)]; b.ID != e.Ino {
		t.Errorf("the SSD got the block with ID %d, want the file's inode %d", b.ID, e.Ino)
	}
	read() // RAM
	ram.Delete(BlockKey("f", 0))
	read() // SSD, promoted to RAM
	read() // RAM
	s := l.Stats().Served
	if s["pfs"].Reads != 1 || s["ram"].Reads != 2 || s["ssd"].Reads != 1 || s["ram"].Bytes != 4000 {
		t.Errorf("served %+v", s)
	}
	if pfs.reads.Load() != 1 {
		t.Errorf("%d PFS reads, want 1", pfs.reads.Load())
	}

	// A new version of the file misses in every tier.
	pfs.files["f"] = data(1000)
	e2 := entry("f", 1000)
	if b, err := l.ReadAt(context.Background(), e2, make([]byte, 1000), 0); err != nil || len(b) != 1000 {
		t.Fatalf("new version: %v", err)
	}
	if pfs.reads.Load() != 2 {
		t.Error("the new version was served from a cache")
	}
	l.Invalidate(e2)
	if ram.Contains(BlockKey("f", 0)) || len(ssd.m) != 0 {
		t.Error("Invalidate left blocks behind")
	}
}

// A failed read caches nothing: once the failure is no longer remembered
// (failures.go: a refresh forgets it), the file is read again.
func TestErrorsAreNotCached(t *testing.T) {
	pfs := &fakePFS{files: map[string][]byte{}}
	l := New(DefaultConfig(), ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
	e := entry("gone", 10)
	if _, err := l.ReadAt(context.Background(), e, make([]byte, 10), 0); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("got %v, want ENOENT", err)
	}
	pfs.files["gone"] = data(10)
	l.Invalidate(e)
	if _, err := l.ReadAt(context.Background(), e, make([]byte, 10), 0); err != nil {
		t.Fatalf("after the file came back: %v", err)
	}
}

// fakeRemote serves blocks as a peer called "b" would, from files, and
// counts fetches; err, if set, is what every fetch returns instead.
type fakeRemote struct {
	files   map[string][]byte
	bs      int64
	fetches atomic.Int64
	err     error
	damage  bool // send every block with one byte flipped after summing
}

func (r *fakeRemote) Owner(e *catalog.Entry) (string, bool) { return "b", true }

func (r *fakeRemote) Previous(e *catalog.Entry) (string, bool) { return "", false }

func (r *fakeRemote) FetchCached(ctx context.Context, peer string, e *catalog.Entry, i int64) ([]byte, uint32, error) {
	return nil, 0, ErrNoBlock
}

// Fetch answers as a peer of the same dataset (the tests' loaders have
// dataset 0) would: the block with its sum under the asker's tag.
func (r *fakeRemote) Fetch(ctx context.Context, peer string, e *catalog.Entry, i int64) ([]byte, uint32, error) {
	r.fetches.Add(1)
	if r.err != nil {
		return nil, 0, r.err
	}
	b := append([]byte(nil), r.files[e.Path()][i*r.bs:min((i+1)*r.bs, int64(len(r.files[e.Path()])))]...)
	sum := integrity.Sum(integrity.Tag(0, BlockKey(e.Path(), i), e.Version()), b)
	if r.damage {
		b[len(b)/2] ^= 1
	}
	return b, sum, nil
}

// TestSourceChoice: past RAM, reads go to a cached copy, unless a margin
// is set and the model expects the copy to be that many times slower than
// the PFS; a failing peer costs the reader nothing and is skipped; a peer
// that only lacks a block is not.
func TestSourceChoice(t *testing.T) {
	files := map[string][]byte{}
	var es []*catalog.Entry
	for i := 0; i < 20; i++ {
		p := string(rune('a' + i))
		files[p] = data(1000 + i)
		es = append(es, entry(p, int64(1000+i)))
	}
	for _, c := range []struct {
		name      string
		warm      func(m *perfmodel.Model)
		err       error
		peer, pfs int64 // fetches expected; -1: at most one
		skipped   bool
		prefetch  bool
		margin    float64
	}{
		{name: "unmeasured peer first", peer: 20, pfs: 0},
		{name: "peer a little slower than the PFS", warm: func(m *perfmodel.Model) {
			for i := 0; i < 30; i++ {
				m.Observe("peer:b", 1000+int64(i), 5*time.Millisecond)
				m.Observe("pfs", 1000+int64(i), time.Millisecond)
			}
		}, peer: 20, pfs: 0, margin: 8},
		{name: "peer far slower than the PFS, no margin set", warm: func(m *perfmodel.Model) {
			for i := 0; i < 30; i++ {
				m.Observe("peer:b", 1000+int64(i), 50*time.Millisecond)
				m.Observe("pfs", 1000+int64(i), time.Millisecond)
			}
		}, peer: 20, pfs: 0},
		{name: "peer far slower than the PFS, margin 8", warm: func(m *perfmodel.Model) {
			for i := 0; i < 30; i++ {
				m.Observe("peer:b", 1000+int64(i), 50*time.Millisecond)
				m.Observe("pfs", 1000+int64(i), time.Millisecond)
			}
		}, peer: -1, pfs: 20, margin: 8},
		{name: "prefetch waits for a far slower peer", warm: func(m *perfmodel.Model) {
			for i := 0; i < 30; i++ {
				m.Observe("peer:b", 1000+int64(i), 50*time.Millisecond)
				m.Observe("pfs", 1000+int64(i), time.Millisecond)
			}
		}, peer: 20, pfs: 0, prefetch: true, margin: 8},
		{name: "failing peer", err: errors.New("connection refused"), peer: 1, pfs: 20, skipped: true},
		{name: "peer lacks the block", err: ErrNoBlock, peer: 20, pfs: 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The model is the warm-up's: the reads' own times, which
			// move with the machine's load (one preempted read of a fake
			// peer took the model past the margin), weigh next to
			// nothing, and the clock stands still, so no backoff ends and
			// no copy goes unmeasured for a second during the test.
			mcfg := perfmodel.DefaultConfig()
			mcfg.Weight = 1e-9
			now := time.Unix(1e9, 0)
			mcfg.Now = func() time.Time { return now }
			m := perfmodel.New(mcfg)
			if c.warm != nil {
				c.warm(m)
			}
			pfs := &fakePFS{files: files}
			r := &fakeRemote{files: files, bs: 1 << 20, err: c.err}
			l := New(Config{Model: m, PFSMargin: c.margin, Remote: r}, ramcache.New(ramcache.Config{Capacity: 0}), nil, pfs)
			for _, e := range es {
				if c.prefetch {
					var got []byte
					keep := func(_ *catalog.Entry, _ int64, b ramcache.Block) bool { got = b.Data; return true }
					if _, err := l.Prefetch(context.Background(), e, keep); err != nil || !bytes.Equal(got, files[e.Path()]) {
						t.Fatalf("prefetch %s: %v", e.Path(), err)
					}
					continue
				}
				got, err := l.ReadAt(context.Background(), e, make([]byte, e.Size), 0)
				if err != nil || !bytes.Equal(got, files[e.Path()]) {
					t.Fatalf("read %s: %v", e.Path(), err)
				}
			}
			peer, pfsReads := r.fetches.Load(), pfs.reads.Load()
			if c.peer >= 0 && peer != c.peer || c.peer < 0 && peer > 1 || pfsReads != c.pfs {
				t.Errorf("%d peer fetches and %d PFS reads, want %d and %d", peer, pfsReads, c.peer, c.pfs)
			}
			if got := l.Stats().Sources["peer:b"].Skipped; got != c.skipped {
				t.Errorf("peer skipped: %v, want %v", got, c.skipped)
			}
		})
	}
}

// fakePacked is a fakePFS whose files lie in one container, in order,
// 1000 bytes apart, and can be read in runs.
type fakePacked struct {
	*fakePFS
	order []string
	runs  atomic.Int64
}

func (f *fakePacked) Locate(path string) (Span, bool) {
	for i, p := range f.order {
		if p == path {
			return Span{Container: "shard", Off: int64(i) * 1000, Len: int64(len(f.files[p]))}, true
		}
	}
	return Span{}, false
}

func (f *fakePacked) ReadRun(paths []string, wants []source.Version) ([][]byte, error) {
	f.runs.Add(1)
	out := make([][]byte, len(paths))
	for i, p := range paths {
		out[i] = append([]byte(nil), f.files[p]...)
	}
	return out, nil
}

// TestCombinedDemandReads: demand reads of one container past the limit
// in flight wait, and are then read in one run; every reader gets its
// bytes.
func TestCombinedDemandReads(t *testing.T) {
	files := map[string][]byte{}
	var order []string
	for i := 0; i < 40; i++ {
		p := fmt.Sprintf("f%02d", i)
		files[p] = data(1000 + i%3)
		files[p][0] = byte(i)
		order = append(order, p)
	}
	pfs := &fakePacked{fakePFS: &fakePFS{files: files, gate: make(chan struct{})}, order: order}
	l := New(Config{DemandPerContainer: 2}, ramcache.New(ramcache.Config{Capacity: 0}), nil, pfs)
	var wg sync.WaitGroup
	read := func(p string) {
		defer wg.Done()
		e := entry(p, int64(len(files[p])))
		got, err := l.ReadAt(context.Background(), e, make([]byte, e.Size), 0)
		if err != nil || !bytes.Equal(got, files[p]) {
			t.Errorf("%s: %v", p, err)
		}
	}
	wg.Add(2)
	go read(order[0]) // these two take both slots and wait on the gate
	go read(order[39])
	waitFor := func(what string, cond func() bool) {
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFor("both slots", func() bool { return pfs.reads.Load() == 2 })
	for _, p := range order[1:39] {
		wg.Add(1)
		go read(p)
	}
	waitFor("38 waiting reads", func() bool {
		l.combine.mu.Lock()
		defer l.combine.mu.Unlock()
		return len(l.combine.queues["shard"].waiting) == 38
	})
	close(pfs.gate)
	wg.Wait()
	if r, n := pfs.runs.Load(), pfs.reads.Load(); r != 1 || n != 2 {
		t.Errorf("%d runs and %d single reads for 40 demand reads, want 1 and 2", r, n)
	}
	if st := l.Stats(); st.Runs != 1 || st.RunSamples != 38 {
		t.Errorf("stats: %d runs of %d samples", st.Runs, st.RunSamples)
	}
}

// fakeStage is a map standing in for the prefetcher's stage.
type fakeStage struct {
	mu sync.Mutex
	m  map[string]ramcache.Block
	// taking, if set, is called as Take starts.
	taking func()
}

func (s *fakeStage) keep(e *catalog.Entry, i int64, b ramcache.Block) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[BlockKey(e.Path(), i)] = b
	return true
}

func (s *fakeStage) Take(key string, tag uint64, done bool) (ramcache.Block, bool) {
	if s.taking != nil {
		s.taking()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[key]
	if ok && done {
		delete(s.m, key)
	}
	return b, ok
}

// Serve unstages the block at a read that reaches its end (the page
// accounting of the real stage is prefetch's to test).
func (s *fakeStage) Serve(key string, tag uint64, lo, hi int) (ramcache.Block, bool, bool) {
	if s.taking != nil {
		s.taking()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[key]
	gone := ok && (hi < 0 || hi >= len(b.Data))
	if gone {
		delete(s.m, key)
	}
	return b, ok, gone
}

func (s *fakeStage) Hold(key string, b ramcache.Block) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[key] = b
}

func (s *fakeStage) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// A prefetch stages a block before its fetch ends, so a read arriving just
// after finds it staged; a read that shares the fetch takes the staged copy
// off (else it would sit there, never read, until the cursor passed); a
// prefetch during a read's fetch leaves the block to the read.
func TestPrefetchStagingAndSharedReads(t *testing.T) {
	file := data(5000)
	pfs := &fakePFS{files: map[string][]byte{"f": file, "g": data(100)}, gate: make(chan struct{})}
	st := &fakeStage{m: map[string]ramcache.Block{}}
	cfg := DefaultConfig()
	cfg.Stage = st
	l := New(cfg, ramcache.New(ramcache.Config{Capacity: 0}), nil, pfs) // RAM keeps nothing
	e, key := entry("f", 5000), BlockKey("f", 0)
	// inFlight says whether key's fetch is in flight, and whether a read
	// runs or shares it.
	inFlight := func() (ok, read bool) {
		l.flight.mu.Lock()
		defer l.flight.mu.Unlock()
		if c := l.flight.calls[flightKey{key, l.Tag(e, key)}]; c != nil {
			return true, c.read
		}
		return false, false
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}

	// A read joins a prefetch's fetch.
	keptInFlight := false
	keep := func(e *catalog.Entry, i int64, b ramcache.Block) bool {
		keptInFlight, _ = inFlight()
		return st.keep(e, i, b)
	}
	prefetched := make(chan error, 1)
	go func() {
		_, err := l.Prefetch(context.Background(), e, keep)
		prefetched <- err
	}()
	waitFor("the prefetch's PFS read", func() bool { return pfs.reads.Load() == 1 })
	read := make(chan error, 1)
	go func() {
		b, err := l.ReadAt(context.Background(), e, make([]byte, 5000), 0)
		if err == nil && !bytes.Equal(b, file) {
			err = errors.New("wrong bytes")
		}
		read <- err
	}()
	waitFor("the read to join the fetch", func() bool { _, read := inFlight(); return read })
	close(pfs.gate)
	if err := <-read; err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := <-prefetched; err != nil {
		t.Fatalf("prefetch: %v", err)
	}
	if !keptInFlight {
		t.Error("the prefetch staged the block after its fetch ended; a read in between would fetch it again")
	}
	if n := st.len(); n != 0 {
		t.Errorf("%d blocks left on the stage after the read that shared the fetch took the whole block", n)
	}
	if n := pfs.reads.Load(); n != 1 {
		t.Errorf("%d PFS reads, want 1", n)
	}

	// A read fetches; a prefetch of the same sample leaves it to the read.
	pfs.gate = make(chan struct{})
	g := entry("g", 100)
	go func() {
		_, err := l.ReadAt(context.Background(), g, make([]byte, 100), 0)
		read <- err
	}()
	waitFor("the read's PFS read", func() bool { return pfs.reads.Load() == 2 })
	staged := make(chan int, 1)
	go func() {
		n, err := l.Prefetch(context.Background(), g, st.keep)
		if err != nil {
			t.Errorf("prefetch: %v", err)
		}
		staged <- n
	}()
	select {
	case n := <-staged:
		if n != 0 || st.len() != 0 {
			t.Errorf("a prefetch during a read's fetch staged %d blocks (%d on the stage); the read keeps the block", n, st.len())
		}
	case <-time.After(5 * time.Second):
		close(pfs.gate)
		t.Fatal("the prefetch waited on the read's fetch instead of leaving the block to it")
	}
	close(pfs.gate)
	if err := <-read; err != nil {
		t.Fatalf("read: %v", err)
	}
	if n := pfs.reads.Load(); n != 2 {
		t.Errorf("%d PFS reads, want 2", n)
	}
}

// A demand read holds what it fetched until it returns, for its caller
// to report it: in between, the prefetcher has not seen the sample
// consumed, and a prefetch of it must not read the PFS again.
func TestPrefetchLeavesUnreportedReadsAlone(t *testing.T) {
	pfs := &fakePFS{files: map[string][]byte{"f": data(5000)}}
	fetched, resume := make(chan struct{}), make(chan struct{})
	var pause sync.Once
	st := &fakeStage{m: map[string]ramcache.Block{}, taking: func() {
		// The read takes the block off the stage once its fetch has
		// ended (it reaches the block's end): pause it there.
		if pfs.reads.Load() == 1 {
			pause.Do(func() { fetched <- struct{}{}; <-resume })
		}
	}}
	cfg := DefaultConfig()
	cfg.Stage = st
	l := New(cfg, ramcache.New(ramcache.Config{Capacity: 0}), nil, pfs) // RAM keeps nothing
	e := entry("f", 5000)
	read := make(chan error, 1)
	go func() {
		_, err := l.ReadAt(context.Background(), e, make([]byte, 5000), 0)
		read <- err
	}()
	<-fetched // fetched, not yet returned
	if n, err := l.Prefetch(context.Background(), e, st.keep); err != nil || n != 0 {
		t.Errorf("prefetch during an unreported read: %d staged, %v; want 0", n, err)
	}
	close(resume)
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	if n := pfs.reads.Load(); n != 1 {
		t.Errorf("%d PFS reads, want 1: the prefetch read the sample again", n)
	}
	// Returned, the hold ends.
	if n, err := l.Prefetch(context.Background(), e, st.keep); err != nil || n != 1 {
		t.Errorf("prefetch after the read was reported: %d staged, %v; want 1", n, err)
	}
}

// TestDamagedPeerBlock: a block a peer sends with bytes that do not match
// its sum under this node's tag is never served or cached: the read goes
// on to the PFS and returns SOURCE's bytes.
func TestDamagedPeerBlock(t *testing.T) {
	file := data(3000)
	pfs := &fakePFS{files: map[string][]byte{"f": file}}
	ssd := &fakeSSD{m: map[string]ssdstore.Block{}}
	r := &fakeRemote{files: pfs.files, bs: 1 << 20, damage: true}
	l := New(Config{BlockSize: 1 << 20, Remote: r}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), ssd, pfs)
	e := entry("f", 3000)
	got, err := l.ReadAt(context.Background(), e, make([]byte, 3000), 0)
	if err != nil || !bytes.Equal(got, file) {
		t.Fatalf("read: %v (bytes equal %v)", err, bytes.Equal(got, file))
	}
	if r.fetches.Load() != 1 || pfs.reads.Load() != 1 {
		t.Errorf("%d peer fetches, %d PFS reads; want the damaged answer refused and one PFS read", r.fetches.Load(), pfs.reads.Load())
	}
	if b, ok, _ := ssd.Get(BlockKey("f", 0), l.Tag(e, BlockKey("f", 0))); !ok || !bytes.Equal(b.Data, file) {
		t.Error("the SSD does not hold SOURCE's bytes under a sum that checks")
	}
}
