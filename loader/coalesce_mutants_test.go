package loader

// Tests written against the mutants gremlins left alive (make mutate,
// docs/mutation.md) in the coalesced reads: how PrefetchRun and the
// combined demand reads order samples, cut runs at the gap and run limits
// (at their exact values), and what they do when a run fails or returns
// the wrong number of samples.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"syscall"
	"testing"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/perfmodel"
	"github.com/dlfs/dlfs/ramcache"
	"github.com/dlfs/dlfs/source"
)

// packedPFS is a packed SOURCE whose samples lie at the spans given, in
// one container. It records the paths of every ReadRun and ReadAt. A
// ReadRun whose paths are not in offset order fails, as a read from the
// first's start to the last's end would not hold them. A read of
// "blocker" waits for release, then fails: it holds a slot of the
// container as long as a test needs.
type packedPFS struct {
	files   map[string][]byte
	spans   map[string]Span
	release chan struct{}
	runErr  error // if set, every ReadRun fails with it
	short   bool  // every ReadRun returns one sample too few

	mu      sync.Mutex
	runs    [][]string // mu guards runs and singles
	singles []string
}

// newPackedPFS lays out samples of the given sizes at the given offsets
// of container "shard", with a blocker of one byte at offset 0.
func newPackedPFS(layout map[string][2]int64) *packedPFS {
	p := &packedPFS{files: map[string][]byte{}, spans: map[string]Span{"blocker": {Container: "shard", Off: 0, Len: 1}}, release: make(chan struct{})}
	for path, l := range layout {
		p.spans[path] = Span{Container: "shard", Off: l[0], Len: l[1]}
		p.files[path] = data(int(l[1]))
		p.files[path][0] = byte(len(path) + int(l[0])) // unlike the others
	}
	return p
}

func (p *packedPFS) ReadAt(path string, want source.Version, b []byte, off int64) (int, error) {
	p.mu.Lock()
	p.singles = append(p.singles, path)
	p.mu.Unlock()
	if path == "blocker" {
		<-p.release
		return 0, syscall.EIO
	}
	d, ok := p.files[path]
	if !ok {
		return 0, syscall.ENOENT
	}
	return copy(b, d[off:]), nil
}

func (p *packedPFS) Locate(path string) (Span, bool) {
	sp, ok := p.spans[path]
	return sp, ok
}

func (p *packedPFS) ReadRun(paths []string, wants []source.Version) ([][]byte, error) {
	p.mu.Lock()
	p.runs = append(p.runs, slices.Clone(paths))
	p.mu.Unlock()
	if p.runErr != nil {
		return nil, p.runErr
	}
	var out [][]byte
	for i, path := range paths {
		if i > 0 && p.spans[path].Off < p.spans[paths[i-1]].Off {
			return nil, fmt.Errorf("packedPFS: %s lies before %s", path, paths[i-1])
		}
		out = append(out, slices.Clone(p.files[path]))
	}
	if p.short {
		out = out[:len(out)-1]
	}
	return out, nil
}

// reads returns the runs and the single reads so far.
func (p *packedPFS) reads() (runs [][]string, singles []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.runs), slices.Clone(p.singles)
}

func (p *packedPFS) readAlone(path string) bool {
	_, singles := p.reads()
	return slices.Contains(singles, path)
}

// entry of path in p, with inode ino.
func (p *packedPFS) entry(path string, ino uint64) *catalog.Entry {
	e := entry(path, p.spans[path].Len)
	e.Ino = ino
	return e
}

// waiting is how many demand reads wait on container.
func (l *Loader) waiting(container string) int {
	l.combine.mu.Lock()
	defer l.combine.mu.Unlock()
	if q := l.combine.queues[container]; q != nil {
		return len(q.waiting)
	}
	return 0
}

// queues is how many containers have a queue of demand reads.
func (l *Loader) queues() int {
	l.combine.mu.Lock()
	defer l.combine.mu.Unlock()
	return len(l.combine.queues)
}

// packedLoader is a loader over p whose RAM holds ram bytes and that lets
// one demand read of a container run at a time, with a model whose PFS
// costs 1 ms and 1 µs a byte (a gap limit of about 1000 bytes, a run
// limit of ten times that).
func packedLoader(p *packedPFS, bs, ram int64) *Loader {
	m := perfmodel.New(perfmodel.Config{Priors: map[string]perfmodel.Prior{"pfs": {Latency: 1e6, Bandwidth: 1e6}}})
	return New(Config{BlockSize: bs, Model: m, DemandPerContainer: 1}, ramcache.New(ramcache.Config{Capacity: ram}), nil, p)
}

// readQueued reads es while the blocker holds the container's one slot,
// each queued after the one before; then it frees the slot, so that one
// of them serves them all in one batch. It returns each read's error and
// checks the bytes of those that succeed.
func readQueued(t *testing.T, l *Loader, p *packedPFS, es []*catalog.Entry) map[string]error {
	t.Helper()
	blocked := make(chan error, 1)
	go func() {
		_, err := l.ReadAt(context.Background(), p.entry("blocker", 0), make([]byte, 1), 0)
		blocked <- err
	}()
	waitFor(t, "the blocker to hold the slot", func() bool { return p.readAlone("blocker") })
	type result struct {
		path string
		b    []byte
		err  error
	}
	results := make(chan result, len(es))
	for i, e := range es {
		go func() {
			b, err := l.ReadAt(context.Background(), e, make([]byte, e.Size), 0)
			results <- result{e.Path(), b, err}
		}()
		waitFor(t, fmt.Sprintf("%s to queue or read", e.Path()), func() bool { return l.waiting("shard") == i+1 || p.readAlone(e.Path()) })
		if p.readAlone(e.Path()) {
			close(p.release)
			t.Fatalf("%s (%d bytes, a block of %d) was read alone while its container was busy; it should wait", e.Path(), e.Size, l.BlockSize())
		}
	}
	close(p.release)
	if err := <-blocked; !errors.Is(err, syscall.EIO) {
		t.Errorf("the blocker: %v", err)
	}
	errs := map[string]error{}
	for range es {
		r := <-results
		errs[r.path] = r.err
		if r.err == nil && !bytes.Equal(r.b, p.files[r.path]) {
			t.Errorf("%s: wrong bytes", r.path)
		}
	}
	return errs
}

// TestCombinedRunsCutAtLimits: a batch of waiting demand reads is read in
// offset order, in runs: a hole of exactly the gap limit is read through,
// one byte more splits the run; a run may reach exactly the run limit
// from its first sample's start, and stops before a sample past it. A
// container's queue is dropped when it is idle.
func TestCombinedRunsCutAtLimits(t *testing.T) {
	const bs = 8192
	gap, run := packedLoader(&packedPFS{}, bs, 0).RunLimits()
	long := (run - gap + 1) / 2 // two of these, and a hole of at most gap, make a run of run
	if gap < 100 || long > bs {
		t.Fatalf("limits gap %d, run %d: the layout needs a gap of 100 or more and a run of two blocks", gap, run)
	}
	base := run // not at 0: a run's length is measured from its own start
	s1 := base + 100 + gap
	s2 := s1 + 100 + gap + 1
	s3 := s2 + run - long
	s4 := s3 + long
	p := newPackedPFS(map[string][2]int64{
		"s0": {base, 100},
		"s1": {s1, 100},  // a hole of gap: read through
		"s2": {s2, long}, // a hole of gap+1: a new run
		"s3": {s3, long}, // ends exactly run past s2's start
		"s4": {s4, 100},  // past it: read alone
	})
	l := packedLoader(p, bs, 0)
	var es []*catalog.Entry
	for i, path := range []string{"s4", "s3", "s2", "s1", "s0"} { // queued backwards
		es = append(es, p.entry(path, uint64(i+1)))
	}
	for path, err := range readQueued(t, l, p, es) {
		if err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
	runs, singles := p.reads()
	if want := [][]string{{"s0", "s1"}, {"s2", "s3"}}; !slices.EqualFunc(runs, want, slices.Equal) {
		t.Errorf("runs %q, want %q (gap limit %d, run limit %d)", runs, want, gap, run)
	}
	if want := []string{"blocker", "s4"}; !slices.Equal(singles, want) {
		t.Errorf("single reads %q, want %q", singles, want)
	}
	if n := l.queues(); n != 0 {
		t.Errorf("%d queues left after the batch", n)
	}
	// An uncontested read leaves no queue behind either.
	if _, err := l.ReadAt(context.Background(), es[4], make([]byte, 100), 0); err != nil {
		t.Fatal(err)
	}
	if n := l.queues(); n != 0 {
		t.Errorf("%d queues left after a read that went at once", n)
	}
}

// TestCombinedRunFails: a run that fails on a record, or returns the
// wrong number of samples, is read again sample by sample, and each
// reader gets its bytes; one past the PFS's deadline fails every reader
// of the run at once, without another try of each.
func TestCombinedRunFails(t *testing.T) {
	for _, c := range []struct {
		name   string
		runErr error
		short  bool
		fail   error // every reader's error; nil: all read one by one
	}{
		{name: "a bad record", runErr: errors.New("record 2 fails its checksum")},
		{name: "too few samples", short: true},
		{name: "past the deadline", runErr: ErrPFSTimeout, fail: ErrPFSTimeout},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPackedPFS(map[string][2]int64{"a": {100, 100}, "b": {200, 100}, "c": {300, 100}})
			p.runErr, p.short = c.runErr, c.short
			l := packedLoader(p, 8192, 0)
			es := []*catalog.Entry{p.entry("a", 1), p.entry("b", 2), p.entry("c", 3)}
			errs := readQueued(t, l, p, es)
			for path, err := range errs {
				if c.fail == nil && err != nil || c.fail != nil && !errors.Is(err, c.fail) {
					t.Errorf("%s: %v, want %v", path, err, c.fail)
				}
			}
			runs, singles := p.reads()
			want := []string{"blocker", "a", "b", "c"}
			if c.fail != nil {
				want = want[:1]
			}
			if len(runs) != 1 || !slices.Equal(singles, want) {
				t.Errorf("%d runs and single reads %q, want 1 and %q", len(runs), singles, want)
			}
		})
	}
}

// TestWholeBlockSampleCombined: a sample of exactly one block is a
// single-block sample: it waits for a busy container like the others.
func TestWholeBlockSampleCombined(t *testing.T) {
	const bs = 1000
	p := newPackedPFS(map[string][2]int64{"f": {100, bs}})
	l := packedLoader(p, bs, 0)
	if errs := readQueued(t, l, p, []*catalog.Entry{p.entry("f", 1)}); errs["f"] != nil {
		t.Fatal(errs["f"])
	}
}

// prefetchLayout lays out a first sample and three neighbours for
// PrefetchRun: n1 a hole of exactly the gap limit after first, n2 one
// byte more after n1, n3 right after n2 and exactly one block long.
func prefetchLayout(t *testing.T, bs, ram int64) (*packedPFS, *Loader, []*catalog.Entry) {
	t.Helper()
	gap, _ := packedLoader(&packedPFS{}, bs, 0).RunLimits()
	if gap < 100 {
		t.Fatalf("gap limit %d: the layout needs 100 or more", gap)
	}
	first := int64(1000)
	n1 := first + 100 + gap
	n2 := n1 + 100 + gap + 1
	p := newPackedPFS(map[string][2]int64{"first": {first, 100}, "n1": {n1, 100}, "n2": {n2, 100}, "n3": {n2 + 100, bs}})
	l := packedLoader(p, bs, ram)
	es := []*catalog.Entry{p.entry("first", 1), p.entry("n1", 2), p.entry("n2", 3), p.entry("n3", 4)}
	return p, l, es
}

// TestPrefetchRunCutsAtGap: PrefetchRun reads first and its neighbours
// in offset order, whatever order they come in, through a hole of
// exactly the gap limit, splitting at one byte more; a neighbour of
// exactly one block is one of them.
func TestPrefetchRunCutsAtGap(t *testing.T) {
	const bs = 4096
	p, l, es := prefetchLayout(t, bs, 0)
	staged := map[string][]byte{}
	keep := func(e *catalog.Entry, i int64, b ramcache.Block) bool {
		staged[e.Path()] = b.Data
		return true
	}
	out, err := l.PrefetchRun(context.Background(), es[0], []*catalog.Entry{es[3], es[1], es[2]}, keep)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[uint64]bool{1: true, 2: true, 3: true, 4: true}; !maps.Equal(out, want) {
		t.Errorf("PrefetchRun fetched %v, want %v", out, want)
	}
	for _, e := range es {
		if !bytes.Equal(staged[e.Path()], p.files[e.Path()]) {
			t.Errorf("%s: staged the wrong bytes", e.Path())
		}
	}
	runs, singles := p.reads()
	if want := [][]string{{"first", "n1"}, {"n2", "n3"}}; !slices.EqualFunc(runs, want, slices.Equal) || len(singles) != 0 {
		t.Errorf("runs %q and single reads %q, want %q and none", runs, singles, want)
	}
	if st := l.Stats(); st.Runs != 2 || st.RunSamples != 4 || st.Sources["pfs"].Reads != 2 {
		t.Errorf("stats: %d coalesced reads of %d samples, %d reads measured; want 2, 4 and 2", st.Runs, st.RunSamples, st.Sources["pfs"].Reads)
	}
}

// TestPrefetchRunFails: a run that fails on a record, or returns the
// wrong number of samples, is read again sample by sample, and each is
// fetched.
func TestPrefetchRunFails(t *testing.T) {
	for _, c := range []struct {
		name   string
		runErr error
		short  bool
	}{
		{name: "a bad record", runErr: errors.New("record 2 fails its checksum")},
		{name: "too few samples", short: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, l, es := prefetchLayout(t, 4096, 0)
			p.runErr, p.short = c.runErr, c.short
			out, err := l.PrefetchRun(context.Background(), es[0], es[1:], func(*catalog.Entry, int64, ramcache.Block) bool { return true })
			if err != nil {
				t.Fatal(err)
			}
			if want := map[uint64]bool{1: true, 2: true, 3: true, 4: true}; !maps.Equal(out, want) {
				t.Errorf("PrefetchRun fetched %v, want %v", out, want)
			}
			if _, singles := p.reads(); len(singles) != len(es) {
				t.Errorf("single reads %q, want each sample once", singles)
			}
			if st := l.Stats(); st.Runs != 0 || st.RunSamples != 0 || st.Sources["pfs"].Reads != 0 {
				t.Errorf("stats: %d coalesced reads of %d samples, %d reads measured; a failed run is none", st.Runs, st.RunSamples, st.Sources["pfs"].Reads)
			}
		})
	}
}

// TestPrefetchRunOffersNeighbours: PrefetchRun hands every sample it
// read to keep (the stage), and offers RAM the neighbours keep refuses,
// never first; a run of one sample is measured but is no coalesced read.
func TestPrefetchRunOffersNeighbours(t *testing.T) {
	_, l, es := prefetchLayout(t, 4096, 1<<20)
	keep := func(e *catalog.Entry, _ int64, _ ramcache.Block) bool { return e.Ino <= 2 }
	out, err := l.PrefetchRun(context.Background(), es[0], es[1:], keep)
	if want := map[uint64]bool{1: true, 2: true, 3: false, 4: false}; err != nil || !maps.Equal(out, want) {
		t.Fatalf("PrefetchRun: %v, %v; want %v", out, err, want)
	}
	for i, e := range es {
		if l.InRAM(e) != (i > 1) {
			t.Errorf("%s in RAM: %v", e.Path(), l.InRAM(e))
		}
	}
	keep = func(*catalog.Entry, int64, ramcache.Block) bool { return true }
	if out, err := l.PrefetchRun(context.Background(), es[0], nil, keep); err != nil || !maps.Equal(out, map[uint64]bool{1: true}) {
		t.Fatalf("PrefetchRun of first alone: %v, %v", out, err)
	}
	if st := l.Stats(); st.Runs != 2 || st.RunSamples != 4 || st.Sources["pfs"].Reads != 3 {
		t.Errorf("stats: %d coalesced reads of %d samples, %d reads measured; want 2, 4 and 3", st.Runs, st.RunSamples, st.Sources["pfs"].Reads)
	}
}

// TestLocate: a sample of a packed dataset is located if it is one block
// at most, and coalescing is on.
func TestLocate(t *testing.T) {
	const bs = 1000
	p := newPackedPFS(map[string][2]int64{"block": {0, bs}, "more": {bs, bs + 1}})
	for _, c := range []struct {
		path       string
		noCoalesce bool
		ok         bool
	}{{"block", false, true}, {"more", false, false}, {"block", true, false}} {
		l := New(Config{BlockSize: bs, NoCoalesce: c.noCoalesce}, nil, nil, p)
		if sp, ok := l.Locate(p.entry(c.path, 1)); ok != c.ok || ok && sp != p.spans[c.path] {
			t.Errorf("%s, no coalescing %v: located %v at %+v", c.path, c.noCoalesce, ok, sp)
		}
	}
}
