// Package prefetch reads ahead of training jobs in the exact order their
// samplers will ask, and tells the RAM and SSD tiers which files are needed
// soonest (NextUse).
//
// # Streams
//
// Every local rank of every job is a stream: the files it will read over
// the planned epochs, in sampler order (package jobs). Each stream has a
// cursor (the first sample not yet consumed) and a frontier (the next
// sample to consider fetching, in the order the DataLoader's workers will
// ask for them: see schedule). The scheduler always fetches the next
// needed sample that is not yet staged or in flight, taking it from the
// stream that will need it soonest (the least lead: positions between
// cursor and frontier over the rate its reader consumes at), as long as
// staged and in-flight bytes fit in Config.Staging. So jobs share the PFS
// and the stage by deadline: a fast reader is kept further ahead in
// positions than a slow one, and a job far ahead yields. With
// Config.EvenShare, every stream is kept as many positions ahead.
// Config.Workers fetches run at once, so a high-latency PFS is kept busy.
//
// # Staging
//
// Prefetched blocks wait in the stage until a demand read takes them (the
// loader asks the stage after RAM). The RAM tier then keeps a taken block
// only if its next use warrants it (NextUse drives its Belady eviction);
// otherwise it is dropped once consumed. Samples the cursor passes without
// a read are dropped from the stage and counted as wasted. A fetch stages
// its blocks before its flight ends (loader.Keep), so a read arriving
// just after finds them. When the plans change, staged samples the new
// plans reach only late are offered to RAM (trimStage): otherwise they
// would hold the stage while the new order waits.
//
// A sample larger than Config.Staging is never staged whole: its head is
// fetched, as much as the stage has room for, and its reader reads the
// rest through the tiers.
//
// # Tracking consumption
//
// The daemon reports every demand read through the mount, once per
// request, with its reader's user (ObserveRead): a read counts only for
// the streams of that user's jobs (jobs.Owner.Reads), so another user's
// reads never move a job's cursor or drop what is staged for it. Only a read at
// offset 0 marks a sample consumed, at its earliest pending position in the
// epoch its stream is in (the next epoch only when the stream is about to
// finish), so the interleaving of DataLoader workers (batch k goes to
// worker k % W) and padding duplicates resolve naturally. A second read of
// a sample already consumed this epoch is not taken for its next epoch's
// occurrence. Reads the kernel serves from its page cache never reach
// dlfs: a sample more than a slack (twice the DataLoader's in-flight
// window, prefetch_factor × workers × batch, plus a batch) behind the
// furthest read is taken as consumed.
//
// # Pushing
//
// With a Pusher (the mounted filesystem), samples near their read are
// written into the kernel's page cache, and one in pushTrip is left for a
// read to reach dlfs and move the cursor: see push.go.
//
// # Locking
//
// mu guards all state. Lock order: the RAM tier's lock before mu (the RAM
// tier calls NextUse with its lock held); the Prefetcher never calls the
// RAM tier or the loader with mu held.
package prefetch

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
	"github.com/dlfs/dlfs/jobs"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/loader/runs"
	"github.com/dlfs/dlfs/ramcache"
)

// Config configures a Prefetcher.
type Config struct {
	// Workers is the number of fetches in flight. Reaching a PFS's
	// bandwidth takes latency × bandwidth / sample size of them: 20 ms
	// opens at 300 MB/s with 110 KB samples need about 60.
	Workers int // default 128
	// Staging bounds the bytes of prefetched blocks not yet read, plus
	// fetches in flight.
	Staging int64 // default 256 MiB
	// BlockSize must equal the loader's.
	BlockSize int64 // default loader.DefaultConfig().BlockSize
	// AllRanks makes NextUse also answer for the ranks other nodes run
	// (assumed to be as far as this node's ranks of the same job): in a
	// cluster, this node owns samples that only those ranks read, and its
	// RAM tier must keep them for them.
	AllRanks bool
	// EvenShare shares fetches between streams by positions ahead of
	// their readers, not by time (--allocation even, for comparison).
	EvenShare bool
	// KeepEnded is how long a rank's figures stay in Stats, marked
	// ended, after its job ends or is dropped.
	KeepEnded time.Duration // default 10 minutes
	Logger    *slog.Logger  // nil: discard
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Workers: 128, Staging: 256 << 20, BlockSize: loader.DefaultConfig().BlockSize, KeepEnded: 10 * time.Minute}
}

// Loader is what the prefetcher fetches through.
type Loader interface {
	Prefetch(ctx context.Context, e *catalog.Entry, keep loader.Keep) (int, error)
	// Offer hands RAM a block the stage gives up; RAM keeps it if its next
	// use warrants, and Offer reports whether it did.
	Offer(key string, b ramcache.Block) bool
	// InRAM reports whether RAM holds e (its first block).
	InRAM(e *catalog.Entry) bool
	// Coalesces, Locate, PrefetchRun and RunLimits coalesce neighbouring
	// samples of a packed dataset into one PFS read (see loader.Loader).
	Coalesces() bool
	Locate(e *catalog.Entry) (loader.Span, bool)
	PrefetchRun(ctx context.Context, first *catalog.Entry, neighbours []*catalog.Entry, keep loader.Keep) (map[uint64]bool, error)
	RunLimits() (gap, run int64)
	// Cached returns block i of e if RAM, the stage or the SSD holds it
	// intact (for pushing).
	Cached(e *catalog.Entry, i int64) ([]byte, uint32, bool)
}

// Plans is where jobs come from.
type Plans interface {
	All() []*jobs.Job
	Subscribe() <-chan struct{}
	// Version counts the changes so far (see Follows).
	Version() uint64
}

// Prefetcher is safe for concurrent use. It owns its scheduler and worker
// goroutines; Close stops them.
type Prefetcher struct {
	cfg   Config
	log   *slog.Logger
	load  Loader
	plans Plans

	tasks    chan []*catalog.Entry
	wake     chan struct{} // capacity 1
	pushWake chan struct{} // capacity 1
	pusher   atomic.Pointer[pusherBox]
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	// builtMu guards built, the plans' version the streams were last
	// built from, and closed; builtCond signals either changing.
	builtMu   sync.Mutex
	builtCond *sync.Cond
	built     uint64
	closed    bool

	mu sync.Mutex
	// mu guards the following.
	// INVARIANT: stagedBytes == sum of len(staged[k].Data); inflightBytes == sum of inflight.
	streams       []*stream
	others        []*stream                 // ranks other nodes run (AllRanks): for NextUse only
	history       map[streamID]*rankHistory // per (job, rank), surviving plan changes, and kept a while after it ends
	staged        map[string]ramcache.Block
	stagedIno     map[uint64]int // blocks staged per file
	stagedBytes   int64
	inflight      map[uint64]int64
	inflightBytes int64
	// INVARIANT: pushedBytes == sum of pushedIno + sum of pushing.
	pushedIno   map[uint64]int64 // pushed samples not yet behind their cursor: bytes each
	pushing     map[uint64]int64 // pushes under way: bytes reserved (0 if staged)
	pushedBytes int64
	totals      Totals
}

type streamID struct {
	job  string
	rank int
}

// stream is one local rank's planned reads.
type stream struct {
	id       streamID
	job      *jobs.Job                       // for its Ahead bound and owner (mu: replaced by a new version of the job)
	samples  atomic.Pointer[[]folder.Sample] // the job's Samples, read without mu (trimStage): a new version of the job replaces them
	plan     planKey                         // what the order was drawn from: a stream is reused only for the same
	epochs   []int
	starts   []int              // position where each epoch begins
	orders   [][]int32          // each epoch's order, shared with the job: the index in job.Samples of the sample at each position
	index    []uint64           // ino<<32 | pos for every position with a file, sorted: each file's positions in order
	consumed bitset             // a position without a file (a dangling link) is consumed from the start
	cursor   int                // first position not consumed
	maxSeen  int                // furthest position consumed by a read; -1 before any
	spans    []loader.Span      // where each position's sample lies in a packed container
	packed   []bool             // whether spans[pos] is known
	runs     map[string][]int32 // container -> one position per file in it, by offset
	runIdx   []int32            // runIdx[pos]: the index of pos's file in runs[its container]
	order    *schedule          // the order the DataLoader will ask for positions in
	frontier int                // next step of order to consider fetching
	pushStep int                // next step of order to consider pushing
	slack    int
	hist     *rankHistory // the rank's, shared with the streams before and after a plan change
	stats    *Stats       // &hist.Stats
	// epochReads counts the reads matched to each epoch's positions
	// (Stats.Consumed is the cursor's epoch's).
	epochReads []int64
	// rate is how fast the cursor moves, in positions per second: a mean
	// over windows of rateWindow, each weighing half; 0 until the first
	// window closes. rateAt and rateFrom open the current window.
	rate     float64
	rateAt   time.Time
	rateFrom int
}

// rateWindow is the window over which a stream's consumption rate is
// measured.
const rateWindow = time.Second

// Stats are one rank's figures, as shown under jobs in .dlfs/stats. Epoch,
// Predicted, Consumed and Cursor are the present epoch's; the counters
// below them add up over the job's life (they are exported as Prometheus
// counters). A rank's figures stay, marked Ended, for Config.KeepEnded
// after its job ends or is dropped.
type Stats struct {
	Epoch     int   `json:"epoch"`     // the epoch the reader is in
	Predicted int64 `json:"predicted"` // that epoch's samples
	Consumed  int64 `json:"consumed"`  // of them, the reads so far
	// Epochs counts the epochs the rank has read in, and ConsumedTotal
	// its reads of planned samples in all of them.
	Epochs        int     `json:"epochs"`
	ConsumedTotal int64   `json:"consumed_total"`
	Inferred      int64   `json:"inferred"`
	Hits          int64   `json:"hits"`
	Late          int64   `json:"late"`
	Misses        int64   `json:"misses"`
	StallSeconds  float64 `json:"stall_seconds"`
	Wasted        int64   `json:"wasted"`
	Pushed        int64   `json:"pushed"`
	Cursor        int     `json:"cursor"`
	// Rate is how fast the reader consumes, in samples per second, and
	// LeadSeconds how long it takes to reach the frontier at that rate:
	// how far ahead of it the prefetcher is, in time.
	Rate        float64 `json:"samples_per_second"`
	LeadSeconds float64 `json:"lead_seconds"`
	// Ended is set once the job has ended or been dropped, EndedSeconds
	// ago; the figures are then its last.
	Ended        bool    `json:"ended,omitempty"`
	EndedSeconds float64 `json:"ended_seconds_ago,omitempty"`
}

// rankHistory is a rank's Stats over its job's life, and what is needed
// to keep them.
type rankHistory struct {
	Stats
	lastEpoch int       // the last epoch counted in Epochs; -1 before
	ended     time.Time // zero while the job runs
}

// maxEnded bounds the ended ranks whose figures are kept.
const maxEnded = 1024

// Totals are the node-wide figures, shown as prefetch in .dlfs/stats.
type Totals struct {
	Workers         int   `json:"workers"`
	StagingCapacity int64 `json:"staging_capacity_bytes"`
	StagedBytes     int64 `json:"staged_bytes"`
	StagedBlocks    int   `json:"staged_blocks"`
	InFlight        int   `json:"in_flight"`
	Fetched         int64 `json:"fetched"`
	FetchedBytes    int64 `json:"fetched_bytes"`
	Wasted          int64 `json:"wasted"`
	WastedBytes     int64 `json:"wasted_bytes"`
	Unpredicted     int64 `json:"unpredicted_reads"`
	Errors          int64 `json:"errors"`
	// Pushing into the page cache: samples pushed and their bytes, samples
	// found cached already, pushes that failed, reads that reached dlfs
	// for a sample pushed (the kernel had evicted it), and the bytes
	// pushed and not yet behind their cursor (counted in Staging).
	Pushed         int64 `json:"pushed"`
	PushedBytes    int64 `json:"pushed_bytes"`
	PushCached     int64 `json:"push_cached"`
	PushFailed     int64 `json:"push_failed"`
	PushedThenRead int64 `json:"pushed_then_read"`
	PushedHeld     int64 `json:"pushed_held_bytes"`
}

// New starts a prefetcher over plans.
func New(cfg Config, load Loader, plans Plans) *Prefetcher {
	def := DefaultConfig()
	if cfg.Workers <= 0 {
		cfg.Workers = def.Workers
	}
	if cfg.Staging <= 0 {
		cfg.Staging = def.Staging
	}
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = def.BlockSize
	}
	if cfg.KeepEnded <= 0 {
		cfg.KeepEnded = def.KeepEnded
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Prefetcher{
		cfg: cfg, log: cfg.Logger, load: load, plans: plans,
		tasks: make(chan []*catalog.Entry), wake: make(chan struct{}, 1), pushWake: make(chan struct{}, 1), cancel: cancel,
		history: map[streamID]*rankHistory{}, staged: map[string]ramcache.Block{}, stagedIno: map[uint64]int{},
		inflight: map[uint64]int64{}, pushedIno: map[uint64]int64{}, pushing: map[uint64]int64{},
	}
	p.builtCond = sync.NewCond(&p.builtMu)
	changes := plans.Subscribe()
	p.wg.Add(2 + pushWorkers + cfg.Workers)
	go p.watch(ctx, changes)
	go p.schedule(ctx)
	for i := 0; i < pushWorkers; i++ {
		go p.push(ctx)
	}
	for i := 0; i < cfg.Workers; i++ {
		go p.work(ctx)
	}
	return p
}

// Close stops every goroutine and drops the stage. Safe to call twice.
func (p *Prefetcher) Close() {
	p.cancel()
	p.wg.Wait()
	p.builtMu.Lock()
	p.closed = true
	p.builtCond.Broadcast() // Follows returns
	p.builtMu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.staged, p.stagedIno, p.stagedBytes = map[string]ramcache.Block{}, map[uint64]int{}, 0
}

// Follows waits, up to timeout, until the streams are built from the
// plans' version v or a later one, so that reads after it are tracked
// (the control plane waits so after a job line: the reader's first reads
// come right after it). It reports whether they are.
func (p *Prefetcher) Follows(v uint64, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	t := time.AfterFunc(timeout, func() {
		p.builtMu.Lock()
		p.builtCond.Broadcast()
		p.builtMu.Unlock()
	})
	defer t.Stop()
	p.builtMu.Lock()
	defer p.builtMu.Unlock()
	for p.built < v && !p.closed && time.Now().Before(deadline) {
		p.builtCond.Wait()
	}
	return p.built >= v
}

// kick wakes the scheduler and the push loop.
func (p *Prefetcher) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
	select {
	case p.pushWake <- struct{}{}:
	default:
	}
}

// watch rebuilds the streams whenever the jobs change.
func (p *Prefetcher) watch(ctx context.Context, changes <-chan struct{}) {
	defer p.wg.Done()
	p.rebuild()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changes:
			p.rebuild()
		}
	}
}

// rebuild computes the streams of every job (outside the lock: plans of
// large datasets take a while), swaps them in, and offers RAM what the
// new plans no longer want staged. A stream whose job and first epoch did
// not change keeps its progress.
func (p *Prefetcher) rebuild() {
	v := p.plans.Version() // before swap reads the plans
	p.swap()
	p.builtMu.Lock()
	p.built = max(p.built, v)
	p.builtCond.Broadcast()
	p.builtMu.Unlock()
	trimmed := p.trimStage()
	for _, b := range trimmed {
		if !p.load.Offer(b.key, b.Block) {
			p.mu.Lock()
			p.totals.Wasted++
			p.totals.WastedBytes += int64(len(b.Data))
			p.mu.Unlock()
		}
	}
	if len(trimmed) > 0 {
		p.kick() // the stage has room again
	}
}

// swap builds and swaps in the streams.
func (p *Prefetcher) swap() {
	var fresh, others []*stream
	for _, j := range p.plans.All() {
		local := map[int]bool{}
		for _, r := range j.Spec.Ranks {
			local[r] = true
			s := build(j, r, j.Epochs(r))
			p.locate(s)
			fresh = append(fresh, s)
		}
		for r := 0; p.cfg.AllRanks && r < j.Spec.World; r++ {
			if !local[r] {
				// Assumed to be in the epoch of this node's first rank.
				others = append(others, build(j, r, j.Epochs(j.Spec.Ranks[0])))
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.others = others
	old := map[streamID]*stream{}
	for _, s := range p.streams {
		old[s.id] = s
		s.epochStatsLocked() // the last figures of a rank whose job ends now
	}
	for i, s := range fresh {
		if o := old[s.id]; o != nil && o.plan == s.plan {
			o.job = s.job // same plan: keep the progress; the job's bound and owner are the new version's
			o.samples.Store(&s.job.Samples)
			fresh[i] = o
			continue
		}
		// Counters are cumulative over the job's life (they are exported
		// as Prometheus counters); Epoch, Predicted, Consumed and Cursor
		// describe the present (statsLocked). A job that ended starts
		// afresh.
		h := p.history[s.id]
		if h == nil || !h.ended.IsZero() {
			h = &rankHistory{lastEpoch: -1}
			p.history[s.id] = h
		}
		h.Cursor = 0
		s.hist, s.stats = h, &h.Stats
	}
	live := map[streamID]bool{}
	for _, s := range fresh {
		live[s.id] = true
	}
	now := time.Now()
	for id, h := range p.history {
		if !live[id] && h.ended.IsZero() {
			h.ended = now // its last figures stay for KeepEnded
			h.Rate, h.LeadSeconds = 0, 0
		}
	}
	p.pruneEndedLocked(now)
	p.streams = fresh
	p.dropUnneededPushedLocked()
	p.dropUnneededLocked()
	p.kick()
}

// stagedBlock is a block with its key.
type stagedBlock struct {
	key string
	ramcache.Block
}

// trimStage takes off the stage the blocks that no stream would stage
// soon: each stream's window is the first 2×Staging bytes, in the order
// its reads will come from its cursor, of the samples RAM does not hold
// (twice, because RAM has changed since the prefetcher passed them). After
// a plan change (a resumed job announces epoch 0 when its sampler is made,
// and its real epoch only later) the stage can be full of samples the new
// order needs late; bound by staging, the prefetcher could then fetch
// nothing ahead of the reader until the reader happened on them. The
// caller offers them to RAM, which keeps them if their next use warrants.
// RAM is asked without mu (see Locking); the plans' orders do not change
// once built.
func (p *Prefetcher) trimStage() []stagedBlock {
	type view struct {
		s    *stream
		from int // the cursor's step
	}
	p.mu.Lock()
	var views []view
	for _, s := range p.streams {
		if s.cursor < s.len() {
			views = append(views, view{s, s.order.step(s.cursor)})
		}
	}
	staged := make(map[uint64]bool, len(p.stagedIno))
	for ino := range p.stagedIno {
		staged[ino] = true
	}
	p.mu.Unlock()
	if len(staged) == 0 {
		return nil
	}
	window := map[uint64]bool{}
	for _, v := range views {
		var bytes int64
		seen := 0 // staged samples met: once all are, the rest cannot matter
		for k := v.from; k < v.s.len() && bytes < 2*p.cfg.Staging && seen < len(staged); k++ {
			e := v.s.entry(v.s.order.at(k))
			if e == nil || window[e.Ino] || p.load.InRAM(e) {
				continue
			}
			window[e.Ino] = true
			bytes = catalog.AddSize(bytes, e.Size)
			if staged[e.Ino] {
				seen++
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []stagedBlock
	for key, b := range p.staged {
		if staged[b.ID] && !window[b.ID] {
			p.unstageLocked(key, b)
			out = append(out, stagedBlock{key, b})
		}
	}
	return out
}

// planKey is everything a stream's order is drawn from: the dataset index
// (by identity: a refresh or a new root makes a new one), the keys of the
// job that decide its plans and the DataLoader's shape, the rank and the
// epochs.
type planKey struct {
	samples *folder.Sample
	n       int
	spec    string // control.FacetPlans and control.FacetLoader
	rank    int
	epochs  string
	layouts string // balance=: the layout ID of each epoch's plan
}

func keyOf(j *jobs.Job, rank int, epochs []int) planKey {
	k := planKey{n: len(j.Samples), spec: j.Spec.Key(control.FacetPlans | control.FacetLoader), rank: rank, epochs: fmt.Sprint(epochs)}
	if len(j.Samples) > 0 {
		k.samples = &j.Samples[0]
	}
	if j.Spec.Balance != "" {
		ids := make([]uint64, len(epochs))
		for i, e := range epochs {
			ids[i] = j.PlanID(e)
		}
		k.layouts = fmt.Sprint(ids)
	}
	return k
}

func build(j *jobs.Job, rank int, epochs []int) *stream {
	s := &stream{id: streamID{j.Spec.Name, rank}, job: j, plan: keyOf(j, rank, epochs), epochs: epochs, maxSeen: -1,
		epochReads: make([]int64, len(epochs))}
	s.samples.Store(&j.Samples)
	var sizes [][]int // each epoch's batch sizes
	n := 0
	for _, e := range s.epochs {
		n += len(j.Order(rank, e))
	}
	s.index = make([]uint64, 0, n)
	s.consumed = newBitset(n)
	pos := 0
	for _, e := range s.epochs {
		if j.Spec.Balance != "" {
			sizes = append(sizes, j.Batches(rank, e))
		} else {
			sizes = append(sizes, nil) // every batch full but the last
		}
		s.starts = append(s.starts, pos)
		order := j.Order(rank, e)
		s.orders = append(s.orders, order)
		for _, i := range order {
			if ent := j.Samples[i].Entry; ent != nil && ent.Ino < 1<<32 {
				s.index = append(s.index, ent.Ino<<32|uint64(pos))
			} else {
				// A dangling symlink, or one leaving the dataset: torchvision
				// lists it, but there is nothing to fetch, and its read fails.
				// (No catalog numbers 2^32 inodes.)
				s.consumed.set(pos)
			}
			pos++
		}
	}
	slices.Sort(s.index)
	s.starts = append(s.starts, pos)
	s.order = newSchedule(s.starts, j.Spec.Workers, j.Spec.Batch, sizes)
	// The DataLoader has up to prefetch_factor (2) batches per worker in
	// flight; reads arrive out of order within that window.
	window := 2 * max(j.Spec.Workers, 1) * j.Spec.Batch
	s.slack = 2*window + j.Spec.Batch + 16
	return s
}

// entry returns the file at position pos.
// (nil for a dangling link: such a position is consumed from the start).
func (s *stream) entry(pos int) *catalog.Entry {
	e := s.epochOf(pos)
	return (*s.samples.Load())[s.orders[e][pos-s.starts[e]]].Entry
}

// len is the number of positions.
func (s *stream) len() int { return s.starts[len(s.starts)-1] }

// positions returns ino's entries of the index, in position order.
func (s *stream) positions(ino uint64) []uint64 {
	if ino >= 1<<32 {
		return nil // never planned (build skips it), and ino<<32 would wrap
	}
	lo, _ := slices.BinarySearch(s.index, ino<<32)
	hi, _ := slices.BinarySearch(s.index, (ino+1)<<32)
	return s.index[lo:hi]
}

// has reports whether ino is planned at all.
func (s *stream) has(ino uint64) bool { return len(s.positions(ino)) > 0 }

// bitset is one bit per position.
type bitset []uint64

func newBitset(n int) bitset    { return make(bitset, (n+63)/64) }
func (b bitset) get(i int) bool { return b[i/64]&(1<<(i%64)) != 0 }
func (b bitset) set(i int)      { b[i/64] |= 1 << (i % 64) }

// locate records where each sample of s lies, when SOURCE is packed, so
// that next can coalesce neighbours without calling out under mu.
func (p *Prefetcher) locate(s *stream) {
	if !p.load.Coalesces() {
		return // not a packed dataset: nothing to hold
	}
	s.spans, s.packed = make([]loader.Span, s.len()), make([]bool, s.len())
	s.runs, s.runIdx = map[string][]int32{}, make([]int32, s.len())
	spans := map[uint64]int{} // ino -> first position located
	for pos := range s.len() {
		e := s.entry(pos)
		if e == nil || s.consumed.get(pos) {
			continue // a dangling link: nothing to locate
		}
		if q, ok := spans[e.Ino]; ok {
			s.spans[pos], s.packed[pos] = s.spans[q], s.packed[q]
			continue
		}
		s.spans[pos], s.packed[pos] = p.load.Locate(e)
		spans[e.Ino] = pos
		if s.packed[pos] {
			c := s.spans[pos].Container
			s.runs[c] = append(s.runs[c], int32(pos))
		}
	}
	for _, list := range s.runs {
		sort.Slice(list, func(i, j int) bool { return s.spans[list[i]].Off < s.spans[list[j]].Off })
	}
	for pos := range s.len() {
		if s.packed[pos] {
			e := s.entry(pos)
			list := s.runs[s.spans[pos].Container]
			first := spans[e.Ino]
			s.runIdx[pos] = int32(sort.Search(len(list), func(i int) bool { return s.spans[list[i]].Off >= s.spans[first].Off }))
		}
	}
}

// ahead is how far the scheduler has gone past the cursor, in schedule
// steps.
func (s *stream) ahead() int {
	if s.cursor >= s.len() {
		return s.frontier
	}
	return s.frontier - s.order.step(s.cursor)
}

// bounded reports whether s is as far ahead of its reader's furthest read
// as its job allows (an inferred job, until its guess is confirmed).
func (s *stream) bounded() bool {
	a := s.job.Ahead()
	if a <= 0 {
		return false
	}
	from := 0
	if s.maxSeen >= 0 {
		from = s.order.step(s.maxSeen)
	}
	return s.frontier-from >= a
}

// epochOf returns the index into s.epochs of position pos.
func (s *stream) epochOf(pos int) int {
	return sort.SearchInts(s.starts[1:], pos+1)
}

// pending returns the first unconsumed position of ino at or after the
// cursor, or -1.
func (s *stream) pending(ino uint64) int {
	list := s.positions(ino)
	i, _ := slices.BinarySearch(list, ino<<32|uint64(s.cursor))
	for ; i < len(list); i++ {
		if q := int(uint32(list[i])); !s.consumed.get(q) {
			return q
		}
	}
	return -1
}

// consumedThisEpoch reports whether ino was already consumed in the epoch
// the cursor is in.
func (s *stream) consumedThisEpoch(ino uint64) bool {
	ep := s.epochOf(s.cursor)
	for _, k := range s.positions(ino) {
		if q := int(uint32(k)); s.epochOf(q) == ep && s.consumed.get(q) {
			return true
		}
	}
	return false
}

// Observe implements loader.Stage. It records nothing: the loader does
// not know who reads, and a read counts only for its reader's jobs (see
// ObserveRead).
func (p *Prefetcher) Observe(e *catalog.Entry, off int64, waited time.Duration) {}

// ObserveRead records a demand read of e at off by user uid that waited
// this long on the PFS (0 when a tier or the stage had it). It moves only
// the streams of jobs whose Owner.Reads(uid, known): another user's reads
// never move a job's cursor. known is false for a reader without a pid
// (another pid namespace).
func (p *Prefetcher) ObserveRead(uid uint32, known bool, e *catalog.Entry, off int64, waited time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var best *stream
	bestPos, bestRank := -1, 0
	mine := false // a stream of the reader's plans the sample
	for _, s := range p.streams {
		if !s.job.Owner.Reads(uid, known) {
			continue
		}
		mine = true
		q := s.pending(e.Ino)
		if q < 0 {
			continue
		}
		// Match a read to the epoch the stream is in; to the next one only
		// when the stream is about to finish (the next epoch's loader may
		// start early), and never when this epoch's occurrence was already
		// read (a second read is not a next-epoch read).
		rank := s.epochOf(q) - s.epochOf(s.cursor)
		if rank > 1 || rank == 1 && (s.starts[s.epochOf(s.cursor)+1]-s.cursor > s.slack || s.consumedThisEpoch(e.Ino)) {
			continue
		}
		if best == nil || rank < bestRank || rank == bestRank && q-s.cursor < bestPos-best.cursor {
			best, bestPos, bestRank = s, q, rank
		}
	}
	if best == nil {
		if mine && off == 0 {
			p.totals.Unpredicted++
			p.log.Debug("prefetch: read of a sample no plan expects now", "path", e.Path())
			if st := p.statsOfLocked(e.Ino, func(s *stream) bool { return s.job.Owner.Reads(uid, known) }); st != nil {
				st.Misses++ // planned, but read again
			}
		}
		return
	}
	st := best.stats
	st.StallSeconds += waited.Seconds()
	if off != 0 {
		return // later blocks of a sample whose first block counted
	}
	best.consumed.set(bestPos)
	st.ConsumedTotal++
	best.epochReads[best.epochOf(bestPos)]++
	if e := best.epochs[best.epochOf(bestPos)]; e > best.hist.lastEpoch {
		best.hist.lastEpoch = e
		best.hist.Epochs++
	}
	if _, ok := p.pushedIno[e.Ino]; ok {
		p.totals.PushedThenRead++
	}
	if waited > 0 {
		st.Late++
	} else {
		st.Hits++
	}
	placing := best.unplaced()
	best.maxSeen = max(best.maxSeen, bestPos)
	// The frontier never lags far behind the furthest read: a stream
	// built while its reader was already under way (an inferred job)
	// must not fetch what the reader has passed. Its first read places
	// it. Behind that read, within the slack, lie samples read before
	// the job existed and samples the reader's other workers read now:
	// small ones are fetched (little is lost on those read already, and
	// the workers' misses would make the guess look wrong), large ones
	// not (one read again costs the PFS all its bytes: an inferred scan
	// of 32 MiB samples read 1.2x its bytes).
	f := best.order.step(best.maxSeen) - best.slack
	if placing && e.Size > p.cfg.BlockSize {
		f = best.order.step(best.maxSeen) + 1
	}
	if best.frontier < f {
		best.frontier = f
	}
	p.advanceLocked(best)
	p.kick()
}

// advanceLocked moves the cursor past consumed positions, and past
// positions so far behind the furthest read that the kernel must have
// served them from its page cache.
func (p *Prefetcher) advanceLocked(s *stream) {
	for s.cursor < s.len() {
		switch {
		case s.consumed.get(s.cursor):
		case s.cursor < s.maxSeen-s.slack:
			s.consumed.set(s.cursor)
			s.stats.Inferred++
		default:
			s.stats.Cursor = s.cursor
			s.measureLocked(time.Now())
			return
		}
		p.releasePushedLocked(s.entry(s.cursor))
		s.cursor++
		// What is still staged for a sample well behind the cursor (the
		// unread blocks of a read sample, or a sample the page cache
		// served) will not be read now.
		if old := s.cursor - s.slack; old >= 0 {
			p.dropIfUnneededLocked(s.entry(old))
		}
	}
	s.stats.Cursor = s.cursor
	s.measureLocked(time.Now())
}

// measureLocked updates the stream's consumption rate.
func (s *stream) measureLocked(now time.Time) {
	if s.rateAt.IsZero() {
		s.rateAt, s.rateFrom = now, s.cursor
		return
	}
	dt := now.Sub(s.rateAt)
	if dt < rateWindow {
		return
	}
	r := float64(s.cursor-s.rateFrom) / dt.Seconds()
	if s.rate > 0 {
		r = (s.rate + r) / 2
	}
	s.rate, s.rateAt, s.rateFrom = r, now, s.cursor
}

// lead is how long s's reader takes to reach its frontier at its rate,
// or at fallback (samples per second) before its rate is known; with no
// rate at all, the distance in positions.
func (s *stream) lead(fallback float64) float64 {
	r := s.rate
	if r <= 0 {
		r = fallback
	}
	if r <= 0 {
		return float64(s.ahead())
	}
	return float64(s.ahead()) / r
}

// soonest returns the stream that will need its next unfetched sample
// soonest (the least lead, at each reader's own rate), of those with
// samples left to fetch and room to fetch them; or nil.
func soonest(streams []*stream, fallback float64) *stream {
	var s *stream
	var sLead float64
	for _, c := range streams {
		if c.frontier >= c.len() || c.bounded() || c.unplaced() {
			continue
		}
		if l := c.lead(fallback); s == nil || l < sLead {
			s, sLead = c, l
		}
	}
	return s
}

// unplaced reports whether s is an inferred job's stream that no read has
// placed yet. The job was inferred from reads made before it existed, so
// its cursor is not where its reader is until the reader's next read:
// fetching from it would fetch what the reader has read already.
func (s *stream) unplaced() bool { return s.job.Inferred && s.maxSeen < 0 }

// leastAhead returns the stream whose frontier is fewest positions ahead
// of its reader, of those with samples left to fetch and room to fetch
// them; or nil.
func leastAhead(streams []*stream) *stream {
	var s *stream
	for _, c := range streams {
		if c.frontier < c.len() && !c.bounded() && !c.unplaced() && (s == nil || c.ahead() < s.ahead()) {
			s = c
		}
	}
	return s
}

// fallbackRateLocked is the rate assumed for a stream whose own is not
// known yet: the fastest known, so that a new reader is served first
// rather than last.
func (p *Prefetcher) fallbackRateLocked() float64 {
	var r float64
	for _, s := range p.streams {
		r = max(r, s.rate)
	}
	return r
}

// Hold implements loader.Stage.
func (p *Prefetcher) Hold(key string, b ramcache.Block) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.neededLocked(b.ID, false) || p.stagedBytes+int64(len(b.Data)) > p.cfg.Staging {
		return // unplanned (nothing would ever drop it) or no room
	}
	p.stageLocked(key, b)
}

// stageLocked adds b to the stage unless it is there already, and reports
// whether it added it.
func (p *Prefetcher) stageLocked(key string, b ramcache.Block) bool {
	if _, dup := p.staged[key]; dup {
		return false
	}
	p.staged[key] = b
	p.stagedIno[b.ID]++
	p.stagedBytes += int64(len(b.Data))
	return true
}

// Take implements loader.Stage.
func (p *Prefetcher) Take(key string, tag uint64, done bool) (ramcache.Block, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.staged[key]
	if !ok {
		return ramcache.Block{}, false
	}
	stale := b.Tag != tag // another version of the file
	if done || stale {
		p.unstageLocked(key, b)
	}
	if stale {
		return ramcache.Block{}, false
	}
	return b, true
}

func (p *Prefetcher) unstageLocked(key string, b ramcache.Block) {
	delete(p.staged, key)
	p.stagedBytes -= int64(len(b.Data))
	if p.stagedIno[b.ID]--; p.stagedIno[b.ID] <= 0 {
		delete(p.stagedIno, b.ID)
	}
}

// neededLocked reports whether a stream still has ino ahead of its cursor
// within what the scheduler has reached (or anywhere, if !soon).
func (p *Prefetcher) neededLocked(ino uint64, soon bool) bool {
	for _, s := range p.streams {
		if q := s.pending(ino); q >= 0 && (!soon || s.order.step(q) < s.frontier) {
			return true
		}
	}
	return false
}

// dropIfUnneededLocked drops e's staged blocks if no stream will read them
// soon; they count as wasted.
func (p *Prefetcher) dropIfUnneededLocked(e *catalog.Entry) {
	if e == nil || p.stagedIno[e.Ino] == 0 || p.neededLocked(e.Ino, true) {
		return
	}
	for _, b := range p.unstageFileLocked(e) {
		p.totals.WastedBytes += int64(len(b.Data))
	}
	p.totals.Wasted++
	if st := p.statsOfLocked(e.Ino, nil); st != nil {
		st.Wasted++
	}
}

// unstageFileLocked takes every staged block of e off the stage and
// returns them.
func (p *Prefetcher) unstageFileLocked(e *catalog.Entry) []stagedBlock {
	var out []stagedBlock
	n := loader.Blocks(e.Size, p.cfg.BlockSize)
	if n > int64(len(p.staged)) {
		// A file of more blocks than the stage holds (a sparse file may
		// claim 2^43): walk the stage instead, under p.mu either way.
		for key, b := range p.staged {
			if b.ID == e.Ino {
				p.unstageLocked(key, b)
				out = append(out, stagedBlock{key, b})
			}
		}
		return out
	}
	for i := int64(0); i < n && p.stagedIno[e.Ino] > 0; i++ {
		key := loader.BlockKey(e.Path(), i)
		if b, ok := p.staged[key]; ok {
			p.unstageLocked(key, b)
			out = append(out, stagedBlock{key, b})
		}
	}
	return out
}

// statsOfLocked returns the figures of the first stream that plans ino
// (among those of accepts, if not nil), or nil.
func (p *Prefetcher) statsOfLocked(ino uint64, accepts func(*stream) bool) *Stats {
	for _, s := range p.streams {
		if s.has(ino) && (accepts == nil || accepts(s)) {
			return s.stats
		}
	}
	return nil
}

// dropUnneededLocked drops every staged block that no stream will read
// again (after a plan change).
func (p *Prefetcher) dropUnneededLocked() {
	for key, b := range p.staged {
		if !p.neededLocked(b.ID, false) {
			p.unstageLocked(key, b)
			p.totals.Wasted++
			p.totals.WastedBytes += int64(len(b.Data))
		}
	}
}

// NextUse is the RAM tier's oracle: how many positions ahead of its
// stream's cursor file ino is next needed; math.MaxInt64 if no plan has it.
// Ranks of other nodes (AllRanks) count with the cursor of this node's
// furthest-behind rank of the same job.
func (p *Prefetcher) NextUse(ino uint64) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	best := int64(math.MaxInt64)
	for _, s := range p.streams {
		if q := s.pending(ino); q >= 0 {
			best = min(best, int64(q-s.cursor))
		}
	}
	for _, o := range p.others {
		cursor := -1
		for _, s := range p.streams {
			if s.id.job == o.id.job && (cursor < 0 || s.cursor < cursor) {
				cursor = s.cursor
			}
		}
		if cursor < 0 {
			continue
		}
		o.cursor = cursor // others are never consumed: pending skips only what is behind
		if q := o.pending(ino); q >= 0 {
			best = min(best, int64(q-cursor))
		}
	}
	return best
}

// next picks the next file to fetch, with the neighbours in its packed
// container worth reading in the same request, and reserves their bytes;
// or returns nil.
func (p *Prefetcher) next(gap, run int64) []*catalog.Entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	fallback := p.fallbackRateLocked()
	skipped := false
	defer func() {
		if skipped { // pushing stops at the frontier: it may go on now
			select {
			case p.pushWake <- struct{}{}:
			default:
			}
		}
	}()
	for {
		var s *stream
		if p.cfg.EvenShare {
			s = leastAhead(p.streams)
		} else {
			s = soonest(p.streams, fallback)
		}
		if s == nil {
			return nil
		}
		pos := s.order.at(s.frontier)
		if s.consumed.get(pos) {
			s.frontier++
			continue
		}
		e := s.entry(pos)
		if p.stagedIno[e.Ino] > 0 || p.inflight[e.Ino] > 0 {
			s.frontier++
			skipped = true // no fetch to finish, so no kick
			continue
		}
		held := p.stagedBytes + p.inflightBytes + p.pushedBytes
		if e.Size > p.cfg.Staging {
			// Larger than the stage: fetch its head, as much as the stage
			// has room for; its reader reads the rest through the tiers.
			room := (p.cfg.Staging - held) / p.cfg.BlockSize * p.cfg.BlockSize
			if room <= 0 {
				return nil // wait for reads
			}
			s.frontier++
			p.inflight[e.Ino] = room
			p.inflightBytes += room
			return []*catalog.Entry{e}
		}
		if held+e.Size > p.cfg.Staging && held > 0 {
			return nil // the stage is full: wait for reads
		}
		s.frontier++
		group := []*catalog.Entry{e}
		if s.packed != nil && s.packed[pos] {
			group = p.neighboursLocked(s, pos, gap, run)
		}
		for _, g := range group {
			p.inflight[g.Ino] = g.Size
			p.inflightBytes += g.Size
		}
		return group
	}
}

// neighboursLocked returns the sample at pos together with its neighbours
// in its container that a plan still needs and that nothing has fetched:
// a run read in one request (runs.Grow). The run reads through unneeded
// bytes (samples already cached) of at most gap in a row, spans at most
// run bytes, and fits in what staging has left plus an eighth of it.
// The sample at pos comes first; the rest follow in offset order.
func (p *Prefetcher) neighboursLocked(s *stream, pos int, gap, run int64) []*catalog.Entry {
	list := s.runs[s.spans[pos].Container]
	// Neighbours mostly go to RAM, not the stage, so they may borrow an
	// eighth of staging beyond what is free; one that RAM refuses is
	// staged only if the stage has room (finish).
	budget := p.cfg.Staging + p.cfg.Staging/8 - p.stagedBytes - p.inflightBytes - p.pushedBytes - s.entry(pos).Size
	take := func(j int) runs.Take {
		e := s.entry(int(list[j]))
		switch {
		case p.stagedIno[e.Ino] > 0 || p.inflight[e.Ino] > 0 || !p.neededLocked(e.Ino, false):
			return runs.Skip // read through it if the next wanted one is near enough
		case e.Size > budget:
			return runs.Stop
		}
		budget -= e.Size
		return runs.Join
	}
	span := func(j int) runs.Span { return s.spans[list[j]] }
	k := int(s.runIdx[pos])
	group := []*catalog.Entry{s.entry(pos)}
	for _, j := range runs.Grow(len(list), k, span, gap, run, take) {
		if j != k {
			group = append(group, s.entry(int(list[j])))
		}
	}
	return group
}

// schedule hands files to workers until ctx ends.
func (p *Prefetcher) schedule(ctx context.Context) {
	defer p.wg.Done()
	for {
		gap, run := p.load.RunLimits()
		g := p.next(gap, run)
		if g == nil {
			select {
			case <-ctx.Done():
				return
			case <-p.wake:
				continue
			}
		}
		select {
		case p.tasks <- g:
		case <-ctx.Done():
			return
		}
	}
}

// work fetches files into the stage until ctx ends.
func (p *Prefetcher) work(ctx context.Context) {
	defer p.wg.Done()
	for {
		var group []*catalog.Entry
		select {
		case <-ctx.Done():
			return
		case group = <-p.tasks:
		}
		keep := func(e *catalog.Entry, i int64, b ramcache.Block) bool {
			return p.stage(e, loader.BlockKey(e.Path(), i), b, e != group[0])
		}
		var run map[uint64]bool
		if len(group) > 1 {
			var err error
			if run, err = p.load.PrefetchRun(ctx, group[0], group[1:], keep); err != nil {
				p.log.Warn("prefetch: coalesced read failed; fetching one by one", "samples", len(group), "err", err)
			}
		}
		for _, e := range group {
			staged, err := 0, error(nil)
			if took, ok := run[e.Ino]; ok {
				if took {
					staged = 1
				}
			} else if head := p.reserved(e); head < e.Size {
				staged, err = p.fetchHead(ctx, e, head)
			} else {
				staged, err = p.load.Prefetch(ctx, e, keep)
			}
			p.finish(e, staged, err)
		}
		p.kick()
	}
}

// reserved is the stage's room next reserved for a fetch of e.
func (p *Prefetcher) reserved(e *catalog.Entry) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inflight[e.Ino]
}

// fetchHead fetches the first head bytes of e, a sample larger than the
// stage, into the stage: the fetch stops at the first block past head
// (the loader reads at most two blocks more, which are dropped). The
// reader reads the rest through the tiers as it goes, so one sample never
// holds more of the stage than head.
func (p *Prefetcher) fetchHead(ctx context.Context, e *catalog.Entry, head int64) (int, error) {
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	var kept int64
	staged, err := p.load.Prefetch(fctx, e, func(e *catalog.Entry, i int64, b ramcache.Block) bool {
		if kept+int64(len(b.Data)) > head {
			stop()
			return false
		}
		if !p.stage(e, loader.BlockKey(e.Path(), i), b, false) {
			return false
		}
		kept += int64(len(b.Data))
		return true
	})
	if err != nil && fctx.Err() != nil && ctx.Err() == nil {
		err = nil // stopped at head: done
	}
	return staged, err
}

// stage is the loader.Keep of a fetch: it stages block key of e if a plan
// still needs e. A sample fetched as a neighbour in a run may lie past the
// frontier: it is kept if any plan needs it, and if the stage has room
// (its bytes were not reserved).
func (p *Prefetcher) stage(e *catalog.Entry, key string, b ramcache.Block, neighbour bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.neededLocked(e.Ino, !neighbour):
		return false // consumed meanwhile, or no longer planned
	case neighbour && p.stagedBytes+int64(len(b.Data)) > p.cfg.Staging:
		// Read with a run, refused by RAM, and no room on the stage.
		p.totals.Wasted++
		p.totals.WastedBytes += int64(len(b.Data))
		return false
	case p.stageLocked(key, b):
		p.totals.FetchedBytes += int64(len(b.Data))
		return true
	}
	return false
}

// finish releases the reservation of a fetch of e, which staged that many
// blocks.
func (p *Prefetcher) finish(e *catalog.Entry, staged int, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inflightBytes -= p.inflight[e.Ino]
	delete(p.inflight, e.Ino)
	switch {
	case err != nil:
		p.totals.Errors++
		p.log.Warn("prefetch: fetch failed; the read will try again", "path", e.Path(), "err", err)
	case staged > 0:
		p.totals.Fetched++
	}
}

// Stats returns the node-wide totals and the per-stream figures, keyed
// "JOB" then "rank-R".
func (p *Prefetcher) Stats() (Totals, map[string]map[string]Stats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.totals
	t.Workers, t.StagingCapacity = p.cfg.Workers, p.cfg.Staging
	t.StagedBytes, t.StagedBlocks, t.InFlight = p.stagedBytes, len(p.staged), len(p.inflight)
	t.PushedHeld = p.pushedBytes
	fallback := p.fallbackRateLocked()
	for _, s := range p.streams {
		s.stats.Rate, s.stats.LeadSeconds = s.rate, 0
		if s.rate > 0 || fallback > 0 {
			s.stats.LeadSeconds = s.lead(fallback)
		}
		s.epochStatsLocked()
	}
	now := time.Now()
	p.pruneEndedLocked(now)
	per := map[string]map[string]Stats{}
	for id, h := range p.history {
		if per[id.job] == nil {
			per[id.job] = map[string]Stats{}
		}
		st := h.Stats
		if !h.ended.IsZero() {
			st.Ended, st.EndedSeconds = true, now.Sub(h.ended).Seconds()
		}
		per[id.job][rankName(id.rank)] = st
	}
	return t, per
}

// epochStatsLocked sets the stream's present figures: the epoch of its
// furthest read, or of the last position its cursor passed (an epoch
// read to its end is shown, not the next one, still unread), that
// epoch's length and its reads.
func (s *stream) epochStatsLocked() {
	i := min(s.epochOf(max(s.maxSeen, s.cursor-1, 0)), len(s.epochs)-1)
	s.stats.Epoch = s.epochs[i]
	s.stats.Predicted = int64(s.starts[i+1] - s.starts[i])
	s.stats.Consumed = s.epochReads[i]
}

// pruneEndedLocked forgets the figures of ranks whose job ended more
// than KeepEnded ago, and the oldest past maxEnded.
func (p *Prefetcher) pruneEndedLocked(now time.Time) {
	var ended []streamID
	for id, h := range p.history {
		switch {
		case h.ended.IsZero():
		case now.Sub(h.ended) > p.cfg.KeepEnded:
			delete(p.history, id)
		default:
			ended = append(ended, id)
		}
	}
	if len(ended) <= maxEnded {
		return
	}
	slices.SortFunc(ended, func(a, b streamID) int { return p.history[a].ended.Compare(p.history[b].ended) })
	for _, id := range ended[:len(ended)-maxEnded] {
		delete(p.history, id)
	}
}

func rankName(r int) string { return "rank-" + strconv.Itoa(r) }
