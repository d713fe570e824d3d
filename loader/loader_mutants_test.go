package loader

// Tests written against the mutants gremlins left alive (make mutate,
// docs/mutation.md), on the parts of the loader that stand alone.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"strings"
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

func TestDefaultConfigValues(t *testing.T) {
	d := DefaultConfig()
	if d.BlockSize != 1<<20 || d.DemandPerContainer != 16 || d.PFSTimeout != time.Minute || d.PFSCalls != 256 || d.FailureTTL != 2*time.Second {
		t.Fatalf("DefaultConfig = %+v", d)
	}
}

// TestValidate: zero settings are valid (they take the defaults); a
// negative one is not.
func TestValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero settings: %v", err)
	}
	for _, c := range []Config{{BlockSize: -1}, {PFSTimeout: -1}, {PFSCalls: -1}, {FailureTTL: -1}, {PFSMargin: -0.5}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: valid", c)
		}
	}
}

// TestNewFillsDefaults: New takes the defaults for zero and negative
// settings, and keeps the ones given.
func TestNewFillsDefaults(t *testing.T) {
	d := DefaultConfig()
	for _, v := range []int{0, -1} {
		l := New(Config{BlockSize: int64(v), DemandPerContainer: v, PFSTimeout: time.Duration(v), PFSCalls: v, FailureTTL: time.Duration(v)}, nil, nil, nil)
		c := l.cfg
		if c.BlockSize != d.BlockSize || c.DemandPerContainer != d.DemandPerContainer || c.PFSTimeout != d.PFSTimeout ||
			c.PFSCalls != d.PFSCalls || c.FailureTTL != d.FailureTTL || c.Logger == nil || c.Model == nil {
			t.Fatalf("settings of %d: %+v", v, c)
		}
		if cap(l.pfsSlots) != d.PFSCalls {
			t.Fatalf("settings of %d: %d PFS slots", v, cap(l.pfsSlots))
		}
	}
	l := New(Config{BlockSize: 4096, DemandPerContainer: 3, PFSTimeout: time.Second, PFSCalls: 5, FailureTTL: time.Millisecond}, nil, nil, nil)
	if c := l.cfg; c.BlockSize != 4096 || c.DemandPerContainer != 3 || c.PFSTimeout != time.Second || c.PFSCalls != 5 || c.FailureTTL != time.Millisecond || cap(l.pfsSlots) != 5 {
		t.Fatalf("given settings replaced: %+v", c)
	}
}

// TestStatsTiers: Served has every tier; Fetched only those a block is
// fetched from (the SSD, peers, a moved sample's previous owner, the
// PFS), not RAM or the stage, which hold what was fetched.
func TestStatsTiers(t *testing.T) {
	s := New(Config{}, nil, nil, nil).Stats()
	keys := func(m map[string]Served) string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		return strings.Join(ks, ",")
	}
	if got := keys(s.Served); got != "moved,peer,pfs,ram,ssd,stage" {
		t.Errorf("Served: %s", got)
	}
	if got := keys(s.Fetched); got != "moved,peer,pfs,ssd" {
		t.Errorf("Fetched: %s", got)
	}
}

func failKeyN(i int) failKey {
	return failKey{path: fmt.Sprint("f", i), v: source.Version{Size: int64(i)}}
}

// TestFailuresBound: at most maxFailures are remembered: past it, the
// expired go first, then any; a TTL of zero remembers nothing.
func TestFailuresBound(t *testing.T) {
	now := time.Unix(1000, 0)
	boom := errors.New("read failed")
	var f failures
	f.put(failKeyN(-1), boom, now, 0)
	if f.len() != 0 {
		t.Fatal("a failure remembered for no time")
	}
	for i := 0; i < maxFailures; i++ {
		ttl := time.Hour
		if i%2 == 0 {
			ttl = time.Second // expired by the time of the next put
		}
		f.put(failKeyN(i), boom, now, ttl)
	}
	if f.len() != maxFailures {
		t.Fatalf("%d remembered, want %d", f.len(), maxFailures)
	}
	later := now.Add(time.Minute)
	f.put(failKeyN(maxFailures), boom, later, time.Hour)
	if f.len() != maxFailures/2+1 {
		t.Fatalf("past the bound: %d remembered, want the %d unexpired and the new one", f.len(), maxFailures/2)
	}
	if f.get(failKeyN(1), later) == nil || f.get(failKeyN(maxFailures), later) == nil {
		t.Fatal("an unexpired failure was forgotten")
	}
	// Full of unexpired ones: any goes, the bound holds.
	for i := maxFailures + 1; f.len() < maxFailures; i++ {
		f.put(failKeyN(i), boom, later, time.Hour)
	}
	f.put(failKeyN(-2), boom, later, time.Hour)
	if f.len() != maxFailures || f.get(failKeyN(-2), later) == nil {
		t.Fatalf("full: %d remembered (want %d), the newest kept: %v", f.len(), maxFailures, f.get(failKeyN(-2), later))
	}
}

// TestFailureExpires: a failure is answered until its TTL ends, and
// forgotten then.
func TestFailureExpires(t *testing.T) {
	now := time.Unix(1000, 0)
	var f failures
	f.put(failKeyN(1), errors.New("read failed"), now, time.Second)
	if err := f.get(failKeyN(1), now.Add(time.Second-1)); err == nil || !strings.Contains(err.Error(), "read failed") {
		t.Fatalf("within the TTL: %v", err)
	}
	if err := f.get(failKeyN(1), now.Add(time.Second)); err != nil || f.len() != 0 {
		t.Fatalf("at the TTL's end: %v, %d remembered", err, f.len())
	}
}

// TestRunLimits: a gap is worth reading through up to latency ×
// bandwidth (at most 8 MiB); a run stops at ten gaps, at least a block,
// at most 32 MiB; a PFS of unmeasurable transfer time coalesces nothing
// beyond a block.
func TestRunLimits(t *testing.T) {
	limits := func(lat time.Duration, bw float64) (int64, int64) {
		m := perfmodel.New(perfmodel.Config{Priors: map[string]perfmodel.Prior{"pfs": {Latency: lat, Bandwidth: bw}}})
		return New(Config{Model: m}, nil, nil, nil).RunLimits()
	}
	bs := DefaultConfig().BlockSize
	for _, c := range []struct {
		lat     time.Duration
		bw      float64
		gap     int64
		run     int64
		approx  bool
		comment string
	}{
		{time.Millisecond, 1e9, 1_000_000, 10_000_000, true, "1 ms at 1 GB/s"},
		{time.Second, 1e9, 8 << 20, 32 << 20, false, "both capped"},
		{time.Microsecond, 1e9, 1000, bs, true, "a run of at least a block"},
		{time.Millisecond, math.Inf(1), 0, bs, false, "no transfer time"},
	} {
		gap, run := limits(c.lat, c.bw)
		if c.approx {
			if gap < c.gap-1 || gap > c.gap+1 || run < c.run-10 || run > c.run+10 {
				t.Errorf("%s: gap %d, run %d; want about %d and %d", c.comment, gap, run, c.gap, c.run)
			}
			continue
		}
		if gap != c.gap || run != c.run {
			t.Errorf("%s: gap %d, run %d; want %d and %d", c.comment, gap, run, c.gap, c.run)
		}
	}
}

// TestReadAtEOF: a read at or past the end, at a negative offset, or into
// nothing, returns no bytes and touches no tier.
func TestReadAtEOF(t *testing.T) {
	l := New(Config{}, nil, nil, nil) // no tiers: touching one would panic
	e := &catalog.Entry{Name: "f", Mode: syscall.S_IFREG | 0o644, Size: 10}
	for _, c := range []struct {
		off int64
		n   int
	}{{10, 5}, {11, 5}, {-1, 5}, {0, 0}, {math.MaxInt64, 1}} {
		b, err := l.ReadAt(context.Background(), e, make([]byte, c.n), c.off)
		if err != nil || len(b) != 0 {
			t.Errorf("%d bytes at %d of 10: %d bytes, %v", c.n, c.off, len(b), err)
		}
	}
}

// recSSD records what the loader deletes from the SSD tier.
type recSSD struct {
	SSD
	deleted  []string
	prefixes []string
}

func (s *recSSD) Delete(key string)          { s.deleted = append(s.deleted, key) }
func (s *recSSD) DeletePrefix(prefix string) { s.prefixes = append(s.prefixes, prefix) }

// TestInvalidateBlocks: a file's blocks are deleted one by one, each once,
// up to walkBlocks of them; past that the tiers are walked instead.
func TestInvalidateBlocks(t *testing.T) {
	const bs = 4096
	for _, c := range []struct {
		blocks int64
		walked bool
	}{{1, false}, {3, false}, {walkBlocks, false}, {walkBlocks + 1, true}} {
		ssd := &recSSD{}
		l := New(Config{BlockSize: bs}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), ssd, nil)
		e := &catalog.Entry{Name: "f", Mode: syscall.S_IFREG | 0o644, Size: c.blocks * bs, Ino: 7}
		l.Invalidate(e)
		if c.walked {
			if len(ssd.prefixes) != 1 || ssd.prefixes[0] != blockPrefix(e.Path()) || len(ssd.deleted) != 0 {
				t.Errorf("%d blocks: prefixes %q, %d keys deleted; want the file's prefix alone", c.blocks, ssd.prefixes, len(ssd.deleted))
			}
			continue
		}
		if len(ssd.prefixes) != 0 || int64(len(ssd.deleted)) != c.blocks {
			t.Errorf("%d blocks: %d keys deleted, prefixes %q", c.blocks, len(ssd.deleted), ssd.prefixes)
			continue
		}
		for i, k := range ssd.deleted {
			if k != BlockKey(e.Path(), int64(i)) {
				t.Errorf("%d blocks: key %d is %q", c.blocks, i, k)
				break
			}
		}
	}
}

// TestFlightReadFlag: a fetch started for a reader is marked read; one
// started ahead of any reader is not.
func TestFlightReadFlag(t *testing.T) {
	var f flight
	f.stop = make(chan struct{})
	ok := func(context.Context) (fetch, error) { return fetch{}, nil }
	c, shared, err := f.do(context.Background(), "k", 1, forReader, ok)
	if err != nil || shared || !c.read {
		t.Fatalf("a reader's fetch: read %v, shared %v, %v", c.read, shared, err)
	}
	c, _, _ = f.do(context.Background(), "k", 1, forPrefetch, ok)
	if c.read {
		t.Fatal("a prefetch nobody read is marked read")
	}
}

// TestFlightHolds: a key is held while any demand read holds it, and
// forgotten when the last lets go.
func TestFlightHolds(t *testing.T) {
	var f flight
	f.hold("k")
	f.hold("k")
	f.release("k")
	if !f.held("k") {
		t.Fatal("released by one of two holders")
	}
	f.release("k")
	if f.held("k") || len(f.unreported) != 0 {
		t.Fatalf("after the last release: held %v, %d keys remembered", f.held("k"), len(f.unreported))
	}
}

// tick returns once the clock has moved on: a wait a test can count on
// being longer than zero.
func tick() {
	for t0 := time.Now(); !time.Now().After(t0); {
	}
}

// tickPFS and tickSSD take some time, however little, over every read.
type tickPFS struct{ *fakePFS }

func (p tickPFS) ReadAt(path string, want source.Version, b []byte, off int64) (int, error) {
	tick()
	return p.fakePFS.ReadAt(path, want, b, off)
}

type tickSSD struct{ *fakeSSD }

func (s tickSSD) Get(key string, tag uint64) (ssdstore.Block, bool, error) {
	tick()
	return s.fakeSSD.Get(key, tag)
}

// TestWaitedOnPFSOnly: a read says how long it waited on the PFS: some
// time for a read from it, none for one from the SSD, however long that
// took.
func TestWaitedOnPFSOnly(t *testing.T) {
	files := map[string][]byte{"f": data(100), "g": data(100)}
	ssd := &fakeSSD{m: map[string]ssdstore.Block{}}
	l := New(Config{}, ramcache.New(ramcache.Config{Capacity: 0}), tickSSD{ssd}, tickPFS{&fakePFS{files: files}})
	f, key := entry("f", 100), BlockKey("f", 0)
	tag := l.Tag(f, key)
	ssd.m[key] = ssdstore.Block{Data: files["f"], Tag: tag, Sum: integrity.Sum(tag, files["f"])}
	for _, c := range []struct {
		e    *catalog.Entry
		tier string
	}{{f, "ssd"}, {entry("g", 100), "pfs"}} {
		_, from, waited, err := l.ReadAtWaited(context.Background(), c.e, make([]byte, 100), 0)
		if err != nil || from != c.tier || (waited > 0) != (c.tier == "pfs") {
			t.Errorf("%s: from %s, waited %s, %v; want from %s, and a wait only on the PFS", c.e.Path(), from, waited, err, c.tier)
		}
	}
}

// TestOnSSD: OnSSD says whether the SSD holds a file's first block; with
// no SSD tier, never.
func TestOnSSD(t *testing.T) {
	pfs := &fakePFS{files: map[string][]byte{"f": data(100)}}
	e := entry("f", 100)
	if New(Config{}, ramcache.New(ramcache.Config{Capacity: 0}), nil, pfs).OnSSD(e) {
		t.Error("on the SSD of a loader without one")
	}
	l := New(Config{}, ramcache.New(ramcache.Config{Capacity: 0}), &fakeSSD{m: map[string]ssdstore.Block{}}, pfs)
	if l.OnSSD(e) {
		t.Error("on the SSD before it was read")
	}
	if _, err := l.ReadAt(context.Background(), e, make([]byte, 100), 0); err != nil {
		t.Fatal(err)
	}
	if !l.OnSSD(e) {
		t.Error("not on the SSD after a read from the PFS")
	}
}

// TestFetchedCountsSuccesses: Stats.Fetched counts the blocks brought in,
// not the fetches that failed.
func TestFetchedCountsSuccesses(t *testing.T) {
	l := New(Config{}, ramcache.New(ramcache.Config{Capacity: 0}), nil, &fakePFS{files: map[string][]byte{"f": data(100)}})
	if _, err := l.ReadAt(context.Background(), entry("gone", 10), make([]byte, 10), 0); err == nil {
		t.Fatal("a read of a missing file succeeded")
	}
	if _, err := l.ReadAt(context.Background(), entry("f", 100), make([]byte, 100), 0); err != nil {
		t.Fatal(err)
	}
	if got := l.Stats().Fetched["pfs"]; got != (Served{Reads: 1, Bytes: 100}) {
		t.Errorf("fetched from the PFS: %+v, want the one block that came", got)
	}
}

// TestPeerBlocksMarked: a block fetched from a peer is marked as a peer's
// (RAM does not keep it: it holds this node's share); one from the PFS is
// not.
func TestPeerBlocksMarked(t *testing.T) {
	files := map[string][]byte{"f": data(100)}
	for _, peer := range []bool{false, true} {
		var cfg Config
		if peer {
			cfg.Remote = &fakeRemote{files: files, bs: DefaultConfig().BlockSize}
		}
		l := New(cfg, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, &fakePFS{files: files})
		var got ramcache.Block
		if _, err := l.Prefetch(context.Background(), entry("f", 100), func(_ *catalog.Entry, _ int64, b ramcache.Block) bool { got = b; return true }); err != nil {
			t.Fatal(err)
		}
		if got.Peer != peer || l.Offer(BlockKey("f", 0), got) == peer {
			t.Errorf("from a peer %v: marked a peer's %v", peer, got.Peer)
		}
	}
}

// failingSSD fails every write with err.
type failingSSD struct {
	*fakeSSD
	err error
}

func (s failingSSD) Put(string, ssdstore.Block) error { return s.err }

// TestSSDWriteFailureLogged: a write to the SSD that fails is logged; one
// that succeeds, or that a full queue or a closing store drops, is not.
func TestSSDWriteFailureLogged(t *testing.T) {
	for _, c := range []struct {
		err    error
		logged bool
	}{{nil, false}, {errors.New("no space left on device"), true}, {ssdstore.ErrBusy, false}, {ssdstore.ErrClosed, false}} {
		var log bytes.Buffer
		ssd := failingSSD{&fakeSSD{m: map[string]ssdstore.Block{}}, c.err}
		l := New(Config{Logger: slog.New(slog.NewTextHandler(&log, nil))}, ramcache.New(ramcache.Config{Capacity: 0}), ssd, &fakePFS{files: map[string][]byte{"f": data(100)}})
		if _, err := l.ReadAt(context.Background(), entry("f", 100), make([]byte, 100), 0); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(log.String(), "SSD write failed"); got != c.logged {
			t.Errorf("a write that returned %v: logged %v, want %v (log %q)", c.err, got, c.logged, log.String())
		}
	}
}

// movedRemote is a fakeRemote whose owner and previous owner are given
// ("": none), and whose caches serve every block.
type movedRemote struct {
	*fakeRemote
	owner, previous string
	cached          atomic.Int64 // FetchCached calls
}

func (r *movedRemote) Owner(*catalog.Entry) (string, bool)    { return r.owner, r.owner != "" }
func (r *movedRemote) Previous(*catalog.Entry) (string, bool) { return r.previous, r.previous != "" }

func (r *movedRemote) FetchCached(ctx context.Context, peer string, e *catalog.Entry, i int64) ([]byte, uint32, error) {
	r.cached.Add(1)
	return r.fakeRemote.Fetch(ctx, peer, e, i)
}

// TestSourceChoiceRules: the choice of source at the edges of its rules.
// No copy to weigh against the PFS with a margin set: the PFS. A copy
// expected exactly margin times slower than the PFS (margin 1: as fast):
// still the copy. A copy expected slower than that but never measured:
// tried first, to see whether it recovered; one that failed lately: not.
// A moved sample's previous owner is asked before the PFS, unless it is
// the owner itself; a damaged block from it is refused.
func TestSourceChoiceRules(t *testing.T) {
	const size = 1000
	same := perfmodel.Prior{Latency: time.Millisecond, Bandwidth: 1e8}
	for _, c := range []struct {
		name         string
		priors       map[string]perfmodel.Prior
		measure      bool // both measured alike just before the read
		fail         bool // the peer failed lately
		margin       float64
		remote       *movedRemote
		lacks        bool  // the owner lacks the block
		ssd          bool  // an SSD tier, without the block; measured fast, the peer slow
		damaged      bool  // the peers send it damaged
		peer, cached int64 // fetches from the owner and the previous owner's caches
		pfs          int64
		tier         string
	}{
		{name: "margin without copies", margin: 2, pfs: 1, tier: "pfs"},
		{name: "copy exactly margin times slower", priors: map[string]perfmodel.Prior{"pfs": same, "peer": same}, measure: true, margin: 1,
			remote: &movedRemote{owner: "b"}, peer: 1, tier: "peer"},
		{name: "slower copy never measured", priors: map[string]perfmodel.Prior{"pfs": same, "peer": {Latency: time.Second, Bandwidth: 1e8}}, margin: 2,
			remote: &movedRemote{owner: "b"}, peer: 1, tier: "peer"},
		{name: "failed copy not probed", fail: true, margin: 2, remote: &movedRemote{owner: "b"}, pfs: 1, tier: "pfs"},
		// The margin weighs each copy, not only the fastest: an SSD that
		// lacks the block does not put a slow peer before the PFS.
		{name: "slow copy behind a fast SSD", priors: map[string]perfmodel.Prior{"pfs": same, "ssd": same, "peer": {Latency: time.Second, Bandwidth: 1e8}},
			measure: true, ssd: true, margin: 2, remote: &movedRemote{owner: "b"}, pfs: 1, tier: "pfs"},
		{name: "previous owner", remote: &movedRemote{previous: "c"}, cached: 1, tier: "moved"},
		{name: "previous owner's block damaged", remote: &movedRemote{previous: "c"}, damaged: true, cached: 1, pfs: 1, tier: "pfs"},
		{name: "previous owner is the owner", remote: &movedRemote{owner: "b", previous: "b"}, lacks: true, peer: 1, pfs: 1, tier: "pfs"},
	} {
		t.Run(c.name, func(t *testing.T) {
			files := map[string][]byte{"f": data(size)}
			m := perfmodel.New(perfmodel.Config{Priors: c.priors})
			pfs := &fakePFS{files: files}
			var ssd SSD
			if c.ssd {
				ssd = &fakeSSD{m: map[string]ssdstore.Block{}}
			}
			cfg := Config{Model: m, PFSMargin: c.margin}
			if r := c.remote; r != nil {
				r.fakeRemote = &fakeRemote{files: files, bs: DefaultConfig().BlockSize}
				if c.lacks {
					r.err = ErrNoBlock
				}
				r.damage = c.damaged
				cfg.Remote = r
			}
			l := New(cfg, ramcache.New(ramcache.Config{Capacity: 0}), ssd, pfs)
			if c.measure {
				for _, src := range []string{"pfs", "peer:b"} {
					m.Observe(src, size, 2*time.Millisecond)
				}
				if c.ssd {
					m.Observe("ssd", size, time.Millisecond)
					m.Observe("peer:b", size, time.Second)
				}
			}
			if c.fail {
				m.Fail("peer:b")
			}
			b, from, _, err := l.ReadAtWaited(context.Background(), entry("f", size), make([]byte, size), 0)
			if err != nil || !bytes.Equal(b, files["f"]) {
				t.Fatalf("read: %v (the file's bytes: %v)", err, bytes.Equal(b, files["f"]))
			}
			var peer, cached int64
			if r := c.remote; r != nil {
				cached = r.cached.Load()
				peer = r.fetches.Load() - cached
			}
			if from != c.tier || peer != c.peer || cached != c.cached || pfs.reads.Load() != c.pfs {
				t.Errorf("from %s after %d fetches from the owner, %d from the previous owner's caches, %d PFS reads; want from %s after %d, %d and %d",
					from, peer, cached, pfs.reads.Load(), c.tier, c.peer, c.cached, c.pfs)
			}
			// A peer that sent a damaged block is skipped for a while;
			// one that served it, or only lacked it, is not.
			if failed := l.Stats().Sources["peer:c"].Failures > 0; failed != c.damaged {
				t.Errorf("the previous owner counted as failed: %v", failed)
			}
		})
	}
}

// TestReadToBlockEndTakesStaged: a read of several blocks takes each it
// reads to its end off the stage, the last one too when the read ends
// exactly where it does.
func TestReadToBlockEndTakesStaged(t *testing.T) {
	const bs = 100
	file := data(3 * bs)
	st := &fakeStage{m: map[string]ramcache.Block{}}
	l := New(Config{BlockSize: bs, Stage: st}, ramcache.New(ramcache.Config{Capacity: 0}), nil, &fakePFS{files: map[string][]byte{"f": file}})
	e := entry("f", 3*bs)
	if n, err := l.Prefetch(context.Background(), e, st.keep); err != nil || n != 3 {
		t.Fatalf("prefetch: %d blocks staged, %v", n, err)
	}
	b, from, _, err := l.ReadAtWaited(context.Background(), e, make([]byte, 150), 50) // to the end of block 1
	if err != nil || from != "stage" || !bytes.Equal(b, file[50:200]) {
		t.Fatalf("read: from %s, %v", from, err)
	}
	if _, ok := st.m[BlockKey("f", 2)]; !ok || st.len() != 1 {
		t.Errorf("%d blocks left on the stage, want block 2 alone: the read took blocks 0 and 1 to their ends", st.len())
	}
}

// lateStage is a fakeStage that misses a number of looks first, as if
// the block were staged just after them, and counts Holds.
type lateStage struct {
	*fakeStage
	misses, holds int
}

func (s *lateStage) Take(key string, tag uint64, done bool) (ramcache.Block, bool) {
	if s.misses > 0 {
		s.misses--
		return ramcache.Block{}, false
	}
	return s.fakeStage.Take(key, tag, done)
}

func (s *lateStage) Hold(key string, b ramcache.Block) {
	s.holds++
	s.fakeStage.Hold(key, b)
}

// TestStagedDuringMiss: a block staged between a read's first look and
// its fetch is served from the stage as it is: not read again, not
// staged again.
func TestStagedDuringMiss(t *testing.T) {
	pfs := &fakePFS{files: map[string][]byte{"f": data(1000)}}
	st := &lateStage{fakeStage: &fakeStage{m: map[string]ramcache.Block{}}}
	l := New(Config{Stage: st}, ramcache.New(ramcache.Config{Capacity: 0}), nil, pfs)
	e := entry("f", 1000)
	if n, err := l.Prefetch(context.Background(), e, st.keep); err != nil || n != 1 {
		t.Fatalf("prefetch: %d blocks staged, %v", n, err)
	}
	st.misses = 1
	_, from, _, err := l.ReadAtWaited(context.Background(), e, make([]byte, 10), 0) // a part: the block stays staged
	if err != nil || from != "stage" {
		t.Fatalf("read: from %s, %v", from, err)
	}
	if st.holds != 0 || st.len() != 1 || pfs.reads.Load() != 1 {
		t.Errorf("%d holds, %d blocks staged, %d PFS reads; want none, the one, and the prefetch's", st.holds, st.len(), pfs.reads.Load())
	}
}

// heldRemote is a fakeRemote whose fetches wait for release.
type heldRemote struct {
	*fakeRemote
	release chan struct{}
	inside  atomic.Int64
}

func (r *heldRemote) Fetch(ctx context.Context, peer string, e *catalog.Entry, i int64) ([]byte, uint32, error) {
	r.inside.Add(1)
	<-r.release
	return r.fakeRemote.Fetch(ctx, peer, e, i)
}

// joined reports whether a demand read runs or shares c.
func (f *flight) joined(c *call) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return c.read
}

// TestSharedPrefetchOfferedToRAM: a read that shares a prefetch's fetch
// offers the block to RAM itself (the prefetch only staged it), unless it
// came from a peer: RAM holds this node's share.
func TestSharedPrefetchOfferedToRAM(t *testing.T) {
	for _, peer := range []bool{false, true} {
		files := map[string][]byte{"f": data(1000)}
		release := make(chan struct{})
		pfs := &fakePFS{files: files, gate: release}
		ram := ramcache.New(ramcache.Config{Capacity: 1 << 20})
		st := &fakeStage{m: map[string]ramcache.Block{}}
		cfg := Config{Stage: st}
		r := &heldRemote{fakeRemote: &fakeRemote{files: files, bs: DefaultConfig().BlockSize}, release: release}
		if peer {
			cfg.Remote = r
		}
		l := New(cfg, ram, nil, pfs)
		e, key := entry("f", 1000), BlockKey("f", 0)
		prefetched := make(chan error, 1)
		go func() {
			_, err := l.Prefetch(context.Background(), e, st.keep)
			prefetched <- err
		}()
		waitFor(t, "the prefetch's fetch", func() bool { return pfs.reads.Load()+r.inside.Load() == 1 })
		c := func() *call {
			l.flight.mu.Lock()
			defer l.flight.mu.Unlock()
			return l.flight.calls[flightKey{key, l.Tag(e, key)}]
		}()
		read := make(chan error, 1)
		go func() {
			_, err := l.ReadAt(context.Background(), e, make([]byte, 1000), 0)
			read <- err
		}()
		waitFor(t, "the read to share the fetch", func() bool { return l.flight.joined(c) })
		close(release)
		if err := <-read; err != nil {
			t.Fatal(err)
		}
		if err := <-prefetched; err != nil {
			t.Fatal(err)
		}
		if ram.Contains(key) == peer {
			t.Errorf("from a peer %v: in RAM %v", peer, ram.Contains(key))
		}
	}
}

// TestSharedCancelledFetchRetried: a read that shared a fetch whose
// starter gave up (a warm-up stopped in the middle of a coalesced read)
// fetches again, and may share the next fetch; after three such, it gives
// up with the starters' error rather than wait on for ever.
func TestSharedCancelledFetchRetried(t *testing.T) {
	l := New(Config{}, ramcache.New(ramcache.Config{Capacity: 0}), nil, &fakePFS{files: map[string][]byte{"f": data(100)}})
	e, key := entry("f", 100), BlockKey("f", 0)
	fk := flightKey{key, l.Tag(e, key)}
	// The test plays the starters: each gives up just as the next starts.
	c := l.flight.claim([]string{key}, []uint64{fk.tag})[0]
	read := make(chan error, 1)
	go func() {
		_, err := l.ReadAt(context.Background(), e, make([]byte, 100), 0)
		read <- err
	}()
	for n := 1; n <= 3; n++ {
		waitFor(t, fmt.Sprintf("the read to share fetch %d", n), func() bool { return l.flight.joined(c) })
		next := &call{done: make(chan struct{})}
		l.flight.mu.Lock()
		c.err = context.Canceled
		l.flight.calls[fk] = next
		l.flight.mu.Unlock()
		close(c.done)
		c = next
	}
	waitFor(t, "the read to give up or share a fourth fetch", func() bool { return len(read) > 0 || l.flight.joined(c) })
	if l.flight.joined(c) {
		t.Error("the read shared a fourth fetch after three were cancelled under it")
	}
	l.flight.finish(key, fk.tag, c, fetch{}, errors.New("the test is over"))
	if err := <-read; !errors.Is(err, context.Canceled) {
		t.Errorf("the read: %v, want context.Canceled", err)
	}
}

// TestFlightGiveUp: a fetch that failed after its caller gave up reports
// the caller's error (the fetch's own may say only that it was cut
// short); one that succeeded all the same reports success; one that
// failed while its caller waited leaves its error in the call alone.
func TestFlightGiveUp(t *testing.T) {
	cut := errors.New("the read was cut short")
	for _, c := range []struct {
		name   string
		giveUp bool
		err    error
		want   error
	}{
		{"gave up, failed", true, cut, context.Canceled},
		{"gave up, succeeded", true, nil, nil},
		{"failed", false, cut, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var f flight
			f.stop = make(chan struct{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			call, _, err := f.do(ctx, "k", 1, forReader, func(context.Context) (fetch, error) {
				if c.giveUp {
					cancel()
				}
				return fetch{}, c.err
			})
			if !errors.Is(err, c.want) || call.err != c.err {
				t.Errorf("do: %v, the call's error %v; want %v and %v", err, call.err, c.want, c.err)
			}
		})
	}
}

// lateCtx is a context that its read cancels; Err, called once the wait
// for the read has ended on the cancellation, first tells the read to
// return (entered), then waits until the read's goroutine has let go of
// its slot: the read finished just as its wait ended.
type lateCtx struct {
	context.Context
	done, entered chan struct{}
	once          sync.Once
	slots         chan struct{}
}

func (c *lateCtx) Done() <-chan struct{} { return c.done }

func (c *lateCtx) Err() error {
	c.once.Do(func() { close(c.entered) })
	for deadline := time.Now().Add(10 * time.Second); len(c.slots) > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	return context.Canceled
}

// TestReadEndingAsWaitEnds: a read of SOURCE that finishes just as its
// wait ends (here, its reader gave up) is not counted as stuck, and its
// answer is used.
func TestReadEndingAsWaitEnds(t *testing.T) {
	l := New(Config{PFSTimeout: time.Hour}, nil, nil, nil)
	ctx := &lateCtx{Context: context.Background(), done: make(chan struct{}), entered: make(chan struct{}), slots: l.pfsSlots}
	got, err := pfsCall(ctx, l, "f", func() (int, error) {
		close(ctx.done)
		<-ctx.entered
		return 7, nil
	})
	if got != 7 || err != nil {
		t.Errorf("pfsCall: %d, %v; want the read's answer", got, err)
	}
	if n := l.Stats().PFSStuck; n != 0 {
		t.Errorf("%d reads of SOURCE counted as stuck, want none", n)
	}
}
