package prefetch

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlfs/dlfs/access"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/jobs"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/ramcache"
)

// fakeLoader "fetches" instantly and counts fetches per path. With
// packed set, every file lies in one container, in path order, 1000
// bytes apart, and runs are counted as one request each.
type fakeLoader struct {
	mu         sync.Mutex
	offered    []string // keys given up by the stage (Offer)
	keepOffers bool
	cached     map[uint64]bool           // what RAM holds: Prefetch skips it
	cachedIf   func(*catalog.Entry) bool // if set, what RAM holds, from the start
	fetches    map[string]int
	total      atomic.Int64
	packed     bool
	requests   atomic.Int64
	// With blockSize, Prefetch hands keep a file block by block, stopping
	// when ctx ends, and counts the blocks it read.
	blockSize int64
	blocks    atomic.Int64
	runs      [][]*catalog.Entry   // PrefetchRun's groups, first first
	onFetch   func(*catalog.Entry) // if set, told of every sample fetched
}

func (f *fakeLoader) Coalesces() bool { return f.packed }

func (f *fakeLoader) Locate(e *catalog.Entry) (loader.Span, bool) {
	if !f.packed {
		return loader.Span{}, false
	}
	var i int
	fmt.Sscanf(filepath.Base(e.Path()), "%04d.jpg", &i)
	return loader.Span{Container: "c", Off: int64(i) * 1000, Len: e.Size}, true
}

func (f *fakeLoader) PrefetchRun(ctx context.Context, first *catalog.Entry, rest []*catalog.Entry, keep loader.Keep) (map[uint64]bool, error) {
	f.requests.Add(1)
	es := append([]*catalog.Entry{first}, rest...)
	f.mu.Lock()
	f.runs = append(f.runs, es)
	f.mu.Unlock()
	out := map[uint64]bool{}
	for _, e := range es {
		if f.onFetch != nil {
			f.onFetch(e)
		}
		f.mu.Lock()
		f.fetches[e.Path()]++
		f.mu.Unlock()
		f.total.Add(1)
		out[e.Ino] = keep(e, 0, ramcache.Block{ID: e.Ino, Data: make([]byte, e.Size)})
	}
	return out, nil
}

func (f *fakeLoader) RunLimits() (gap, run int64) { return 2000, 16000 }

func (f *fakeLoader) InRAM(e *catalog.Entry) bool {
	if f.cachedIf != nil {
		return f.cachedIf(e)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cached[e.Ino]
}

// Offer stands in for a RAM tier that keeps what it is offered when
// keepOffers is set.
func (f *fakeLoader) Offer(key string, b ramcache.Block) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.offered = append(f.offered, key)
	return f.keepOffers
}

// Cached stands in for tiers that hold every file intact.
func (f *fakeLoader) Cached(e *catalog.Entry, i int64) ([]byte, uint32, bool) {
	return make([]byte, e.Size), 0, true
}

func (f *fakeLoader) Prefetch(ctx context.Context, e *catalog.Entry, keep loader.Keep) (int, error) {
	if f.InRAM(e) {
		return 0, nil
	}
	if f.onFetch != nil {
		f.onFetch(e)
	}
	f.mu.Lock()
	f.fetches[e.Path()]++
	f.mu.Unlock()
	f.total.Add(1)
	f.requests.Add(1)
	if f.blockSize > 0 {
		staged := 0
		for off := int64(0); off < e.Size; off += f.blockSize {
			if err := ctx.Err(); err != nil {
				return staged, err
			}
			f.blocks.Add(1)
			if keep(e, off/f.blockSize, ramcache.Block{ID: e.Ino, Data: make([]byte, min(f.blockSize, e.Size-off))}) {
				staged++
			}
		}
		return staged, nil
	}
	if keep(e, 0, ramcache.Block{ID: e.Ino, Data: make([]byte, e.Size)}) {
		return 1, nil
	}
	return 0, nil
}

func setup(t *testing.T, files int, line string, cfg Config) (*Prefetcher, *jobs.Registry, *fakeLoader) {
	t.Helper()
	return setupWith(t, files, line, cfg, &fakeLoader{fetches: map[string]int{}})
}

func setupWith(t *testing.T, files int, line string, cfg Config, fl *fakeLoader) (*Prefetcher, *jobs.Registry, *fakeLoader) {
	t.Helper()
	return setupSized(t, files, func(int) int { return 1 }, line, cfg, fl)
}

// setupSized is setupWith whose file i has size(i) bytes.
func setupSized(t *testing.T, files int, size func(int) int, line string, cfg Config, fl *fakeLoader) (*Prefetcher, *jobs.Registry, *fakeLoader) {
	t.Helper()
	root := t.TempDir()
	for i := 0; i < files; i++ {
		p := filepath.Join(root, "data", fmt.Sprintf("c%d", i%3), fmt.Sprintf("%04d.jpg", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, bytes.Repeat([]byte("x"), size(i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cat, err := catalog.Open(context.Background(), catalog.DefaultConfig(root))
	if err != nil {
		t.Fatal(err)
	}
	reg := jobs.New(jobs.Config{Snapshot: cat.Snapshot})
	p := New(cfg, fl, reg)
	// Cleanups run last first: Close, then the check.
	t.Cleanup(func() { checkInvariant(t, p) })
	t.Cleanup(p.Close)
	if line == "" {
		return p, reg, fl // no job yet
	}
	cmds, err := control.Parse([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Apply(cmds[0].(control.Job)); err != nil {
		t.Fatal(err)
	}
	return p, reg, fl
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFollowsThePlan: the prefetcher fetches in plan order ahead of the
// reads, each sample once; reads in plan order are hits and take the
// staged blocks; the RAM oracle ranks by next use.
func TestFollowsThePlan(t *testing.T) {
	p, reg, fl := setup(t, 60, "job=j root=data seed=3 epoch=0 world=2 rank=1 lookahead=1", Config{Workers: 4, Staging: 1 << 20})
	j := reg.Get("j")
	order := j.Order(1, 0)
	waitFor(t, "the whole epoch to be staged", func() bool { return fl.total.Load() == int64(len(order)) })
	checkInvariant(t, p)
	if d := p.NextUse(j.Samples[order[5]].Entry.Ino); d != 5 {
		t.Errorf("NextUse of the 6th sample = %d, want 5", d)
	}
	for _, i := range order {
		e := j.Samples[i].Entry
		if _, ok := p.Take(loader.BlockKey(e.Path(), 0), 0, false); !ok {
			t.Fatalf("%s was not staged", e.Path())
		}
		if _, ok := p.Take(loader.BlockKey(e.Path(), 0), 0, true); !ok {
			t.Fatalf("%s was not staged", e.Path())
		}
		p.ObserveRead(0, true, e, 0, 0)
		checkInvariant(t, p)
	}
	tot, per := p.Stats()
	st := per["j"]["rank-1"]
	if st.Hits != int64(len(order)) || st.Consumed != int64(len(order)) || st.Late != 0 || tot.Unpredicted != 0 || tot.Wasted != 0 {
		t.Errorf("stats %+v, totals %+v", st, tot)
	}
	for path, n := range fl.fetches {
		if n != 1 {
			t.Errorf("%s fetched %d times", path, n)
		}
	}
	if tot.StagedBytes != 0 {
		t.Errorf("%d bytes left staged", tot.StagedBytes)
	}
}

// TestCoalescing: over a packed dataset, a shuffled epoch is fetched in
// runs of neighbours: every sample once, in far fewer requests than
// samples. Files are 1000 bytes apart and runs span at most 16000.
func TestCoalescing(t *testing.T) {
	_, reg, fl := setupWith(t, 600, "job=j root=data seed=3 epoch=0 lookahead=1", Config{Workers: 4, Staging: 1 << 20},
		&fakeLoader{fetches: map[string]int{}, packed: true})
	n := int64(len(reg.Get("j").Order(0, 0)))
	waitFor(t, "the whole epoch to be staged", func() bool { return fl.total.Load() == n })
	for path, c := range fl.fetches {
		if c != 1 {
			t.Errorf("%s fetched %d times", path, c)
		}
	}
	if r := fl.requests.Load(); float64(r) > 0.5*float64(n) {
		t.Errorf("%d requests for %d samples, want at most half", r, n)
	} else {
		t.Logf("%d requests for %d samples", r, n)
	}
}

// TestCoalescingWithinHorizon: a run joins only neighbours the plan needs
// within the stage's horizon (as many samples as the stage holds), which
// the stage keeps until they are read; one needed later would wait in
// RAM, be evicted before its turn and be read again. It reads through
// samples it does not join (staged already) only within 1% of its bytes:
// here, with samples of one byte, never.
func TestCoalescingWithinHorizon(t *testing.T) {
	const staging = 200 // samples of 1 byte: a horizon of 200 steps of 600
	for _, ram := range []int64{0, 400} {
		t.Run(fmt.Sprint("RAM ", ram), func(t *testing.T) { coalescingWithinHorizon(t, staging, ram) })
	}
}

func coalescingWithinHorizon(t *testing.T, staging, ram int64) {
	horizon := int(staging + ram/2)
	p, reg, fl := setupWith(t, 600, "job=j root=data seed=3 epoch=0 lookahead=1", Config{Workers: 1, Staging: staging, RAM: ram},
		&fakeLoader{fetches: map[string]int{}, packed: true})
	j := reg.Get("j")
	step := map[uint64]int{}
	order := j.Order(0, 0)
	for k, i := range order {
		step[j.Samples[i].Entry.Ino] = k
	}
	// The reader reads the first 500 in order, each once it is staged:
	// what it read leaves holes among the samples still needed.
	for k := range 500 {
		e := j.Samples[order[k]].Entry
		waitFor(t, "sample "+e.Path()+" staged", func() bool {
			fl.mu.Lock()
			defer fl.mu.Unlock()
			return fl.fetches[e.Path()] > 0
		})
		p.ObserveRead(0, true, e, 0, 0)
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if len(fl.runs) == 0 {
		t.Fatal("no coalesced reads")
	}
	joined, beyondStage := 0, 0
	index := func(e *catalog.Entry) (i int) {
		fmt.Sscanf(filepath.Base(e.Path()), "%04d.jpg", &i)
		return i
	}
	for _, run := range fl.runs {
		in := map[int]bool{}
		lo, hi := index(run[0]), index(run[0])
		for _, e := range run {
			in[index(e)] = true
			lo, hi = min(lo, index(e)), max(hi, index(e))
		}
		for k := lo; k <= hi; k++ {
			if !in[k] {
				t.Errorf("a run of %d samples from %04d to %04d reads through sample %04d", len(run), lo, hi, k)
			}
		}
		first := step[run[0].Ino]
		for _, e := range run[1:] {
			joined++
			if step[e.Ino] > first+horizon {
				t.Errorf("a run from step %d joined %s, needed at step %d: past the horizon of %d", first, e.Path(), step[e.Ino], horizon)
			}
			if step[e.Ino] > first+int(staging) {
				beyondStage++
			}
		}
	}
	if joined == 0 {
		t.Error("no run joined a neighbour")
	}
	if ram > 0 && beyondStage == 0 {
		t.Error("with a RAM tier, no run joined a neighbour needed past the stage's horizon")
	}
}

// TestConsumptionTracking pins the rules that follow a DataLoader's reads:
// out-of-order reads within the window, samples the page cache served
// (never seen, inferred once far enough behind), a second read of a sample
// (not taken for its next-epoch occurrence), unplanned reads.
func TestConsumptionTracking(t *testing.T) {
	p, reg, _ := setup(t, 400, "job=j root=data seed=9 epoch=0 batch=4 workers=2 lookahead=2", Config{Workers: 1, Staging: 1})
	j := reg.Get("j")
	e0 := j.Order(0, 0)
	at := func(i int) *catalog.Entry { return j.Samples[e0[i]].Entry }
	stats := func() Stats { _, per := p.Stats(); return per["j"]["rank-0"] }
	waitFor(t, "the stream", func() bool { return stats().Predicted == 400 })

	// Worker 1's batch (positions 4-7) arrives before worker 0's.
	for _, i := range []int{4, 5, 0, 6, 1, 7, 2, 3} {
		p.ObserveRead(0, true, at(i), 0, 0)
	}
	if st := stats(); st.Consumed != 8 || st.Cursor != 8 {
		t.Fatalf("after two interleaved batches: %+v", st)
	}
	// A read at a later offset of the same file is not a new sample.
	p.ObserveRead(0, true, at(7), 4096, 0)
	// A second read of sample 2 must not consume its epoch-1 occurrence.
	p.ObserveRead(0, true, at(2), 0, 0)
	if st := stats(); st.Consumed != 8 || st.Misses != 1 {
		t.Errorf("after a re-read: %+v", st)
	}
	// The page cache serves 8..199; dlfs sees only 200 onwards.
	for i := 200; i < 260; i++ {
		p.ObserveRead(0, true, at(i), 0, time.Millisecond)
	}
	st := stats()
	if st.Inferred != 192 || st.Cursor != 260 || st.Late != 60 { // 8..199 inferred, 200..259 read
		t.Errorf("after reads far ahead: %+v", st)
	}
}

// TestAllRanks: in a cluster a node's RAM tier keeps samples for the ranks
// other nodes run, by their next use; alone, samples only other ranks read
// have none.
func TestAllRanks(t *testing.T) {
	for _, all := range []bool{false, true} {
		p, reg, _ := setup(t, 40, "job=j root=data seed=1 epoch=0 world=2 rank=0 lookahead=1", Config{Workers: 1, Staging: 1 << 20, AllRanks: all})
		j := reg.Get("j")
		waitFor(t, "the plan", func() bool { _, per := p.Stats(); return per["j"] != nil })
		other := j.Order(1, 0) // rank 1 runs on another node
		mine := map[int32]bool{}
		for _, i := range j.Order(0, 0) {
			mine[i] = true
		}
		for k, i := range other {
			if mine[i] {
				continue
			}
			got := p.NextUse(j.Samples[i].Entry.Ino)
			if all && got != int64(k) || !all && got != math.MaxInt64 {
				t.Fatalf("AllRanks=%v: NextUse of rank 1's sample %d at position %d = %d", all, i, k, got)
			}
		}
	}
}

// TestReplanFreesTheStage: a resumed job's sampler announces epoch 0 when
// it is made, and its real epoch only later. Epoch 0's samples fill the
// stage meanwhile; when the real epoch comes, those it reads late go to
// RAM (here refused, so wasted), and the stage fills with what it reads
// first.
func TestReplanFreesTheStage(t *testing.T) {
	fl := &fakeLoader{fetches: map[string]int{}}
	p, reg, _ := setupWith(t, 400, "job=j root=data seed=3 epoch=0 lookahead=1", Config{Workers: 4, Staging: 40}, fl)
	waitFor(t, "the stage to fill", func() bool { return fl.total.Load() == 40 })
	checkInvariant(t, p)
	cmds, err := control.Parse([]byte("job=j root=data seed=3 epoch=5 lookahead=1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Apply(cmds[0].(control.Job)); err != nil {
		t.Fatal(err)
	}
	j := reg.Get("j")
	first := j.Order(0, 5)[:20]
	staged := func(i int32) bool {
		e := j.Samples[i].Entry
		_, ok := p.Take(loader.BlockKey(e.Path(), 0), 0, false)
		return ok
	}
	waitFor(t, "epoch 5's first 20 samples to be staged", func() bool {
		for _, i := range first {
			if !staged(i) {
				return false
			}
		}
		return true
	})
	fl.mu.Lock()
	offered := len(fl.offered)
	fl.mu.Unlock()
	tot, _ := p.Stats()
	checkInvariant(t, p)
	if offered < 20 || tot.Wasted != int64(offered) || tot.StagedBytes > 40 {
		t.Errorf("%d staged blocks offered to RAM, %d wasted, %d bytes staged; want most of epoch 0's 40 offered and refused",
			offered, tot.Wasted, tot.StagedBytes)
	}
}

// TestReplanKeepsALeadPastRAM: with RAM holding three samples in four,
// the stage holds the next samples RAM lacks, which reach four times as
// far in the order as their bytes; a rebuild that keeps the stream must
// leave them staged.
func TestReplanKeepsALeadPastRAM(t *testing.T) {
	// RAM holds three files in four from the start: set after the job,
	// the prefetcher could stage some of those first.
	fl := &fakeLoader{fetches: map[string]int{}, cachedIf: func(e *catalog.Entry) bool {
		var i int
		fmt.Sscanf(filepath.Base(e.Path()), "%04d.jpg", &i)
		return i%4 != 0
	}}
	line := "job=j root=data seed=3 epoch=0 lookahead=1"
	p, _, _ := setupWith(t, 400, line, Config{Workers: 4, Staging: 40}, fl)
	waitFor(t, "the stage to fill", func() bool { tot, _ := p.Stats(); return tot.StagedBytes == 40 })
	// A rebuild (as any control line causes) keeps j's stream and its
	// progress; called here directly, so that its trim is done on return.
	p.rebuild()
	fl.mu.Lock()
	offered := len(fl.offered)
	fl.mu.Unlock()
	if offered != 0 {
		t.Errorf("%d of j's staged samples were taken off the stage; they are the next ones RAM lacks", offered)
	}
}

// TestReannounceNewOrder: announcing the job again at the same first
// epoch with another seed, shuffle, world, batch or workers replans the
// stream in the new order (the old stream was kept when only the first
// epoch and the length were compared).
func TestReannounceNewOrder(t *testing.T) {
	p, reg, _ := setup(t, 60, "job=j root=data seed=3 epoch=0 lookahead=1", Config{Workers: 4, Staging: 1 << 20})
	for _, line := range []string{
		"job=j seed=4 epoch=0",
		"job=j shuffle=false epoch=0",
		"job=j shuffle=true world=2 rank=1 epoch=0",
		"job=j batch=7 workers=3 epoch=0",
	} {
		cmds, err := control.Parse([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		if err := reg.Apply(cmds[0].(control.Job)); err != nil {
			t.Fatal(err)
		}
		j := reg.Get("j")
		rank := j.Spec.Ranks[len(j.Spec.Ranks)-1]
		order := j.Order(rank, 0)
		waitFor(t, line+" to be planned in its order", func() bool {
			seen := map[uint64]bool{}
			for k, i := range order {
				e := j.Samples[i].Entry
				if seen[e.Ino] {
					continue // a padded repeat: its next use is its first
				}
				seen[e.Ino] = true
				if p.NextUse(e.Ino) > int64(k) {
					return false
				}
			}
			return true
		})
	}
}

// TestSoonest: the prefetcher serves the stream that needs its next
// sample soonest, in time: a fast reader 100 samples ahead (1 s at 100/s)
// before a slow one 20 ahead (2 s at 10/s); a stream with no rate yet is
// taken to be as fast as the fastest; with no rates at all, positions
// decide.
func TestSoonest(t *testing.T) {
	mk := func(name string, cursor, frontier int, rate float64) *stream {
		starts := []int{0, 1000}
		return &stream{id: streamID{job: name}, job: &jobs.Job{}, starts: starts, order: newSchedule(starts, 1, 1, nil),
			cursor: cursor, frontier: frontier, rate: rate, maxSeen: -1}
	}
	fast, slow := mk("fast", 0, 100, 100), mk("slow", 0, 20, 10)
	if s := soonest([]*stream{slow, fast}, 100); s != fast {
		t.Errorf("got %s, want fast (1 s ahead against 2 s)", s.id.job)
	}
	fast.frontier = 300 // 3 s ahead now
	if s := soonest([]*stream{slow, fast}, 100); s != slow {
		t.Errorf("got %s, want slow", s.id.job)
	}
	fresh := mk("fresh", 0, 150, 0) // 1.5 s at the fastest's rate
	if s := soonest([]*stream{slow, fast, fresh}, 100); s != fresh {
		t.Errorf("got %s, want the new reader", s.id.job)
	}
	a, b := mk("a", 0, 30, 0), mk("b", 0, 20, 0)
	if s := soonest([]*stream{a, b}, 0); s != b {
		t.Errorf("no rates: got %s, want b (fewer positions ahead)", s.id.job)
	}
	done := mk("done", 0, 1000, 1)
	if s := soonest([]*stream{done}, 1); s != nil {
		t.Errorf("a stream with nothing left was chosen")
	}
	// Shared evenly, positions decide whatever the rates.
	if s := leastAhead([]*stream{slow, fast, done}); s != slow {
		t.Errorf("even share: got %s, want slow (20 positions ahead)", s.id.job)
	}
}

// TestMeasureRate: the rate follows the cursor over windows of a second,
// each new one weighing half.
func TestMeasureRate(t *testing.T) {
	s := &stream{}
	t0 := time.Unix(100, 0)
	s.measureLocked(t0)
	s.cursor = 50
	s.measureLocked(t0.Add(500 * time.Millisecond)) // window still open
	if s.rate != 0 {
		t.Fatalf("rate %v before the first window closed", s.rate)
	}
	s.cursor = 100
	s.measureLocked(t0.Add(time.Second))
	if s.rate != 100 {
		t.Fatalf("rate %v, want 100", s.rate)
	}
	s.cursor = 120
	s.measureLocked(t0.Add(2 * time.Second)) // 20/s in this window
	if s.rate != 60 {
		t.Fatalf("rate %v, want (100 + 20) / 2", s.rate)
	}
}

// TestFollows: once Follows returns for the plans' version, the streams
// include every job registered before it; after Close it returns at once.
func TestFollows(t *testing.T) {
	p, reg, _ := setup(t, 60, "job=a root=data seed=1 epoch=0 batch=4", Config{Workers: 1, Staging: 1 << 20})
	cmds, err := control.Parse([]byte("job=b root=data seed=2 epoch=0 batch=4"))
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Apply(cmds[0].(control.Job)); err != nil {
		t.Fatal(err)
	}
	if !p.Follows(reg.Version(), 10*time.Second) {
		t.Fatal("the prefetcher did not follow the plans")
	}
	p.mu.Lock()
	jobsSeen := map[string]bool{}
	for _, s := range p.streams {
		jobsSeen[s.id.job] = true
	}
	p.mu.Unlock()
	if !jobsSeen["a"] || !jobsSeen["b"] {
		t.Errorf("streams of %v, want a and b", jobsSeen)
	}
	p.Close()
	start := time.Now()
	if p.Follows(reg.Version()+1, time.Minute) || time.Since(start) > 5*time.Second {
		t.Error("Follows after Close: want false at once")
	}
}

// TestOtherUsersReads: alice's job follows alice's reads only. Bob reads
// a sample that lies late in her plan: her cursor does not move, nothing
// is taken as served by the page cache, nothing staged for her is
// dropped, and his read is not counted against her plan. A reader without
// a pid (another pid namespace) moves only a job announced from one.
// Before, the read by bob marked every sample before it consumed unread.
func TestOtherUsersReads(t *testing.T) {
	p, reg, fl := setup(t, 400, "job=x root=data seed=9 epoch=0 batch=4 workers=2 lookahead=1", Config{Workers: 4, Staging: 1 << 20})
	if err := reg.End("x"); err != nil {
		t.Fatal(err)
	}
	cmds, _ := control.Parse([]byte("job=j root=data seed=9 epoch=0 batch=4 workers=2 lookahead=1"))
	alice := jobs.Owner{Cred: access.Cred{Uid: 1001, Gid: 1001}}
	if err := reg.ApplyAs(alice, cmds[0].(control.Job)); err != nil {
		t.Fatal(err)
	}
	j := reg.Get("j")
	order := j.Order(0, 0)
	at := func(i int) *catalog.Entry { return j.Samples[order[i]].Entry }
	stats := func() Stats { _, per := p.Stats(); return per["j"]["rank-0"] }
	waitFor(t, "alice's stream", func() bool { return stats().Predicted == 400 })
	waitFor(t, "her first samples staged", func() bool { return fl.total.Load() >= 40 })
	for i := 0; i < 10; i++ {
		p.ObserveRead(1001, true, at(i), 0, 0)
	}
	staged, _ := p.Stats()
	for _, r := range []struct {
		uid   uint32
		known bool
	}{{1002, true}, {0, true}, {1001, false}} {
		p.ObserveRead(r.uid, r.known, at(300), 0, time.Millisecond)
		p.ObserveRead(r.uid, r.known, at(12), 0, time.Millisecond)
	}
	st := stats()
	tot, _ := p.Stats()
	if st.Cursor != 10 || st.Consumed != 10 || st.Inferred != 0 || st.Misses != 0 || st.StallSeconds != 0 {
		t.Errorf("other users' reads moved alice's stream: %+v", st)
	}
	if tot.Wasted != staged.Wasted || tot.Unpredicted != 0 {
		t.Errorf("other users' reads dropped %d staged samples, %d unpredicted", tot.Wasted-staged.Wasted, tot.Unpredicted)
	}
	p.ObserveRead(1001, true, at(10), 0, 0)
	if st := stats(); st.Cursor != 11 {
		t.Errorf("alice's own read: cursor %d, want 11", st.Cursor)
	}

	// Announced from a container: reads without a pid are its own.
	k, _ := control.Parse([]byte("job=k root=data seed=4 epoch=0 lookahead=1"))
	if err := reg.ApplyAs(jobs.Owner{Cred: alice.Cred, Foreign: true}, k[0].(control.Job)); err != nil {
		t.Fatal(err)
	}
	kj := reg.Get("k")
	kstats := func() Stats { _, per := p.Stats(); return per["k"]["rank-0"] }
	waitFor(t, "the container's stream", func() bool { return kstats().Predicted == 400 })
	p.ObserveRead(4242, false, kj.Samples[kj.Order(0, 0)[0]].Entry, 0, 0)
	if st := kstats(); st.Cursor != 1 {
		t.Errorf("a read without a pid did not move a job announced without one: %+v", st)
	}
	if st := stats(); st.Cursor != 11 {
		t.Errorf("a read without a pid moved alice's job: %+v", st)
	}
}

// TestSampleLargerThanTheStage: a sample of 1 MiB with a 64 KiB stage is
// streamed through it, not staged whole: the prefetcher fetches its head
// (what the stage has room for), reads at most two blocks more, and the
// stage never holds more than its size; the samples after it are
// prefetched as before. Before, the stage took all of it once empty.
func TestSampleLargerThanTheStage(t *testing.T) {
	reg := sizedSamples(t, 1000, 1000, 1<<20, 1000, 1000, 1000, 1000, 1000)
	const stage, block = 64 << 10, 16 << 10
	fl := &fakeLoader{fetches: map[string]int{}, blockSize: block}
	var p *Prefetcher
	var most atomic.Int64
	watch := func() {
		if tot, _ := p.Stats(); tot.StagedBytes > most.Load() {
			most.Store(tot.StagedBytes)
		}
		if err := p.stage.checkInvariant(); err != nil {
			t.Errorf("INVARIANT broken during a fetch: %v", err)
		}
	}
	p = New(Config{Workers: 1, Staging: stage, BlockSize: block}, &watchingLoader{fl, watch}, reg)
	t.Cleanup(func() { checkInvariant(t, p) })
	t.Cleanup(p.Close)
	cmds, _ := control.Parse([]byte("job=j root=data sampler=sequential epoch=0 lookahead=1"))
	if err := reg.Apply(cmds[0].(control.Job)); err != nil {
		t.Fatal(err)
	}
	j := reg.Get("j")
	at := func(i int) *catalog.Entry { return j.Samples[j.Order(0, 0)[i]].Entry }
	for i := 0; i < 3; i++ {
		waitFor(t, fmt.Sprintf("sample %d", i), func() bool { return fl.total.Load() > int64(i) })
		p.ObserveRead(0, true, at(i), 0, 0)
		for b := int64(0); b < at(i).Size; b += block {
			p.Take(loader.BlockKey(at(i).Path(), b/block), 0, true)
		}
	}
	waitFor(t, "the samples after it", func() bool { return fl.total.Load() == 8 })
	if most.Load() > stage {
		t.Errorf("the stage held %d bytes, more than its %d", most.Load(), stage)
	}
	// Seven small samples, one block each, and the big one's head: as much
	// as the stage had room for when it was scheduled (all of it, if the
	// two before it were taken by then), and one block past it. Whether
	// its reader comes while its head is fetched does not matter: the
	// fetch stops at the first block the stage refuses
	// (TestHeadFetchStopsWhenConsumed).
	if n := fl.blocks.Load(); n > 7+stage/block+1 {
		t.Errorf("%d blocks read for a 1 MiB sample and seven small ones with a %d-byte stage", n, stage)
	}
	if tot, _ := p.Stats(); tot.Errors != 0 {
		t.Errorf("%d fetch errors: stopping at the head is not one", tot.Errors)
	}
}

// TestHeadFetchStopsWhenConsumed: a sample larger than the stage whose
// reader reaches it while its head is fetched is fetched no further: the
// stage refuses its next block, and the fetch stops there instead of
// reading the rest of the sample for nothing.
func TestHeadFetchStopsWhenConsumed(t *testing.T) {
	reg := sizedSamples(t, 1<<20, 1000)
	const stage, block = 64 << 10, 16 << 10
	// No fetch starts before p and big are set.
	ready := make(chan struct{})
	fl := &fakeLoader{fetches: map[string]int{}, blockSize: block, onFetch: func(*catalog.Entry) { <-ready }}
	var p *Prefetcher
	var big *catalog.Entry
	var came atomic.Bool
	watch := func() {
		// The big sample's first block is staged: its reader comes.
		if !came.Load() && p.stage.has(big.Ino) {
			came.Store(true)
			p.ObserveRead(0, true, big, 0, 0)
		}
	}
	p = New(Config{Workers: 1, Staging: stage, BlockSize: block}, &watchingLoader{fl, watch}, reg)
	t.Cleanup(func() { checkInvariant(t, p) })
	t.Cleanup(p.Close)
	cmds, _ := control.Parse([]byte("job=j root=data sampler=sequential epoch=0 lookahead=1"))
	if err := reg.Apply(cmds[0].(control.Job)); err != nil {
		t.Fatal(err)
	}
	j := reg.Get("j")
	big = j.Samples[j.Order(0, 0)[0]].Entry
	close(ready)
	if big.Size != 1<<20 {
		t.Fatalf("the first sample has %d bytes, want the 1 MiB one", big.Size)
	}
	waitFor(t, "the sample after it", func() bool { return fl.total.Load() == 2 })
	if !came.Load() {
		t.Fatal("the big sample's head was never staged")
	}
	// Block 0 staged, block 1 refused (its reader came): the fetch stops.
	if n := fl.blocks.Load(); n != 2+1 {
		t.Errorf("%d blocks read for a 1 MiB sample consumed after its first block, and a small one; want 2 of the big one and the small one", n)
	}
}

// sizedSamples makes data/c/0000.jpg and on, of the sizes given, and
// returns a registry over their catalog.
func sizedSamples(t *testing.T, sizes ...int) *jobs.Registry {
	t.Helper()
	root := t.TempDir()
	for i, size := range sizes {
		p := filepath.Join(root, "data", "c", fmt.Sprintf("%04d.jpg", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cat, err := catalog.Open(context.Background(), catalog.DefaultConfig(root))
	if err != nil {
		t.Fatal(err)
	}
	return jobs.New(jobs.Config{Snapshot: cat.Snapshot})
}

// watchingLoader is a Loader that calls watch after every block it hands
// to keep.
type watchingLoader struct {
	*fakeLoader
	watch func()
}

func (w *watchingLoader) Prefetch(ctx context.Context, e *catalog.Entry, keep loader.Keep) (int, error) {
	return w.fakeLoader.Prefetch(ctx, e, func(e *catalog.Entry, i int64, b ramcache.Block) bool {
		ok := keep(e, i, b)
		w.watch()
		return ok
	})
}

// TestEpochFigures: a rank's epoch, consumed and predicted are those of
// the epoch its reader is in, however many epochs one plan covers (a
// two-epoch run once showed "epoch 0, consumed 800 of 400"); the counters
// add up over the epochs.
func TestEpochFigures(t *testing.T) {
	p, reg, _ := setup(t, 400, "job=j root=data seed=9 epoch=0 lookahead=2", Config{Workers: 1, Staging: 1})
	j := reg.Get("j")
	stats := func() Stats { _, per := p.Stats(); return per["j"]["rank-0"] }
	waitFor(t, "the stream", func() bool { return stats().Predicted == 400 })
	read := func(epoch, from, to int) {
		for _, i := range j.Order(0, epoch)[from:to] {
			p.ObserveRead(0, true, j.Samples[i].Entry, 0, 0)
		}
	}
	read(0, 0, 100)
	if st := stats(); st.Epoch != 0 || st.Consumed != 100 || st.Predicted != 400 || st.Epochs != 1 {
		t.Errorf("a quarter into epoch 0: %+v", st)
	}
	read(0, 100, 400)
	if st := stats(); st.Epoch != 0 || st.Consumed != 400 || st.Epochs != 1 {
		t.Errorf("at the end of epoch 0: %+v", st)
	}
	read(1, 0, 9)
	if st := stats(); st.Epoch != 1 || st.Consumed != 9 || st.Predicted != 400 || st.Epochs != 2 || st.ConsumedTotal != 409 || st.Hits != 409 {
		t.Errorf("9 into epoch 1: %+v", st)
	}
	read(1, 9, 400)
	if st := stats(); st.Epoch != 1 || st.Consumed != 400 || st.Predicted != 400 || st.ConsumedTotal != 800 {
		t.Errorf("at the end of epoch 1: %+v", st)
	}
}

// TestEndedJobKept: a job's last figures stay in Stats, marked ended,
// for KeepEnded after it ends, then go; announced again, it starts afresh.
func TestEndedJobKept(t *testing.T) {
	p, reg, _ := setup(t, 100, "job=j root=data seed=9 epoch=0 lookahead=1", Config{Workers: 1, Staging: 1, KeepEnded: time.Hour})
	j := reg.Get("j")
	stats := func() (Stats, bool) { _, per := p.Stats(); st, ok := per["j"]["rank-0"]; return st, ok }
	waitFor(t, "the stream", func() bool { st, _ := stats(); return st.Predicted == 100 })
	for _, i := range j.Order(0, 0)[:30] {
		p.ObserveRead(0, true, j.Samples[i].Entry, 0, 2*time.Millisecond)
	}
	if err := reg.End("j"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the end", func() bool { st, _ := stats(); return st.Ended })
	if st, _ := stats(); st.Epoch != 0 || st.Consumed != 30 || st.Late != 30 || st.StallSeconds < 0.059 || st.Epochs != 1 {
		t.Errorf("the ended job's figures: %+v", st)
	}
	p.mu.Lock()
	p.cfg.KeepEnded = time.Nanosecond
	p.mu.Unlock()
	if _, ok := stats(); ok {
		t.Errorf("the figures outlived KeepEnded")
	}

	p.mu.Lock()
	p.cfg.KeepEnded = time.Hour
	p.mu.Unlock()
	cmds, err := control.Parse([]byte("job=j root=data seed=9 epoch=0 lookahead=1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"a", "b"} {
		if err := reg.Apply(cmds[0].(control.Job)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the job again", func() bool { st, ok := stats(); return ok && !st.Ended })
		p.ObserveRead(0, true, reg.Get("j").Samples[reg.Get("j").Order(0, 0)[0]].Entry, 0, 0)
		if st, _ := stats(); st.Hits != 1 || st.Late != 0 {
			t.Errorf("run %s of the job announced again: %+v", line, st)
		}
		if err := reg.End("j"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the end", func() bool { st, _ := stats(); return st.Ended })
	}
}

// A job inferred from reads made before it existed starts fetching at its
// reader's next read, past it when its samples are larger than a block:
// what lies behind was read already.
func TestInferredStreamStartsAtItsReader(t *testing.T) {
	fl := &fakeLoader{fetches: map[string]int{}}
	p, reg, _ := setupSized(t, 100, func(int) int { return 3 }, "", Config{Workers: 2, Staging: 60, BlockSize: 2}, fl)
	cmds, err := control.Parse([]byte("job=inf root=data sampler=sequential epoch=0 batch=1 workers=1 lookahead=1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.ApplyInferred(access.Cred{}, cmds[0].(control.Job)); err != nil {
		t.Fatal(err)
	}
	stats := func() Stats { _, per := p.Stats(); return per["inf"]["rank-0"] }
	waitFor(t, "the stream", func() bool { return stats().Predicted == 100 })
	j := reg.Get("inf")
	order := j.Order(0, 0)
	at := func(i int) *catalog.Entry { return j.Samples[order[i]].Entry }
	p.ObserveRead(0, true, at(50), 0, 0)
	for i := 51; i < 60; i++ {
		p.ObserveRead(0, true, at(i), 0, 0)
		waitFor(t, fmt.Sprint("the fetch of position ", i+1), func() bool {
			fl.mu.Lock()
			defer fl.mu.Unlock()
			return fl.fetches[at(i+1).Path()] > 0
		})
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	for i := 0; i <= 50; i++ {
		if n := fl.fetches[at(i).Path()]; n > 0 {
			t.Errorf("position %d, behind the inferred job's first read (50), fetched %d times", i, n)
		}
	}
}

// TestNextUseTakesNoLock: NextUse answers while the prefetcher's lock is
// held (the RAM tier asks it many times per eviction, under its own lock),
// and while reads move the cursors beside it (the race detector watches);
// a rank another node runs counts with this node's rank's cursor.
func TestNextUseTakesNoLock(t *testing.T) {
	p, reg, _ := setup(t, 60, "job=j root=data seed=3 epoch=0 world=2 rank=0 lookahead=1", Config{Workers: 1, Staging: 1 << 20, AllRanks: true})
	j := reg.Get("j")
	mine, other := j.Order(0, 0), j.Order(1, 0)
	ino := func(i int32) uint64 { return j.Samples[i].Entry.Ino }
	waitFor(t, "the plan", func() bool { return p.NextUse(ino(mine[5])) == 5 })

	p.mu.Lock()
	answer := make(chan int64)
	go func() { answer <- p.NextUse(ino(mine[7])) }()
	select {
	case d := <-answer:
		if d != 7 {
			t.Errorf("NextUse of the 8th sample = %d, want 7", d)
		}
	case <-time.After(5 * time.Second):
		t.Error("NextUse waited for the prefetcher's lock")
		defer func() { <-answer }()
	}
	p.mu.Unlock()

	stop := make(chan struct{})
	var asked sync.WaitGroup
	asked.Add(1)
	go func() {
		defer asked.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, i := range other {
				p.NextUse(ino(i))
			}
		}
	}()
	for _, i := range mine[:10] {
		p.ObserveRead(0, true, j.Samples[i].Entry, 0, 0)
	}
	close(stop)
	asked.Wait()
	if d := p.NextUse(ino(mine[15])); d != 5 {
		t.Errorf("after 10 reads, NextUse of the 16th sample = %d, want 5", d)
	}
	own := map[int32]bool{}
	for _, i := range mine {
		own[i] = true
	}
	for k, i := range other {
		if !own[i] && k >= 10 {
			if d := p.NextUse(ino(i)); d != int64(k-10) {
				t.Errorf("rank 1's sample at position %d: NextUse %d, want %d (its cursor is rank 0's)", k, d, k-10)
			}
			break
		}
	}
}

// TestOracleMadeFirst: an Oracle made before the prefetcher (as the tiers
// that ask it are) knows no plan until the prefetcher given it publishes
// its streams.
func TestOracleMadeFirst(t *testing.T) {
	o := &Oracle{}
	if d := o.NextUse(2); d != math.MaxInt64 {
		t.Fatalf("an Oracle without a prefetcher: NextUse %d", d)
	}
	_, reg, _ := setup(t, 20, "job=j root=data seed=3 epoch=0 lookahead=1", Config{Workers: 1, Staging: 1 << 20, Oracle: o})
	j := reg.Get("j")
	e := j.Samples[j.Order(0, 0)[5]].Entry
	waitFor(t, "the plan in the Oracle", func() bool { return o.NextUse(e.Ino) == 5 })
}
