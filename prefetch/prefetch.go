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
// With a Pusher (Config.Pusher, the mounted filesystem), from
// StartPushing on, samples near their read are written into the kernel's
// page cache, and one in pushTrip is left for a read to reach dlfs and
// move the cursor: see push.go.
//
// # Code
//
// prefetch.go holds the configuration and the Prefetcher's life; plans.go
// the streams, built from the jobs' plans; consume.go consumption
// tracking (ObserveRead, the cursor); oracle.go NextUse, read without a
// lock; scheduler.go the scheduler and its fetch workers; stage.go the
// stage; push.go pushing; stats.go the figures; schedule.go the order a
// DataLoader asks in.
//
// # Locking
//
// mu guards the streams and the figures; the stage has its own lock, so
// that a demand read's Take waits on nothing else (stage.go). Lock order:
// mu before the stage's. NextUse takes no lock: it reads what the streams
// publish (oracle.go), so the tiers ask it under their own locks. The
// Prefetcher never calls the RAM tier or the loader with mu held.
package prefetch

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/jobs"
	"github.com/dlfs/dlfs/loader"
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
	// RAM is the RAM tier's capacity: a coalesced run reads neighbours
	// the plans need within what the stage and half of RAM hold together
	// (see neighboursLocked); 0 counts the stage alone.
	RAM int64
	// BlockSize must equal the loader's.
	BlockSize int64 // default loader.DefaultConfig().BlockSize
	// AllRanks makes NextUse also answer for the ranks other nodes run
	// (assumed to be as far as this node's ranks of the same job): in a
	// cluster, this node owns samples that only those ranks read, and its
	// RAM tier must keep them for them.
	AllRanks bool
	// Oracle is where the prefetcher publishes its streams for NextUse:
	// the tiers that evict by next use are made before the prefetcher,
	// and ask the Oracle they were given (nil: New makes one).
	Oracle *Oracle
	// Stage is where the prefetcher stages what it fetches: the loader
	// takes from it and was given it before the prefetcher was made, so
	// New adopts it (nil: New makes one, which the loader then lacks).
	Stage *Stage
	// Pusher writes samples into the kernel's page cache ahead of their
	// reads, from StartPushing on (see Pushing); nil: nothing is pushed.
	// A nil interface, not a nil pointer.
	Pusher Pusher
	// Staged, if set, is told of each file a fetch of all its blocks
	// staged some of (the rest may be in RAM already), from the fetching
	// worker, without locks: the daemon builds its backing file ahead of
	// its open, and the stage keeps it beside the blocks
	// (Stage.AdoptBacking). It must not block.
	Staged func(e *catalog.Entry)
	// Backs, with Staged, says whether a file staged whole would get a
	// backing file beside it now: the scheduler then fetches it only with
	// room on the stage for it twice. It must not block or call back.
	Backs func(e *catalog.Entry) bool
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
	pushing  atomic.Bool   // StartPushing was called, with a Pusher
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	// builtMu guards built, the plans' version the streams were last
	// built from, and closed; builtCond signals either changing.
	builtMu   sync.Mutex
	builtCond *sync.Cond
	built     uint64
	closed    bool

	stage  *Stage  // its own lock, taken after mu
	oracle *Oracle // the streams as NextUse reads them, without a lock

	mu sync.Mutex
	// mu guards the following.
	streams []*stream
	history map[streamID]*rankHistory // per (job, rank), surviving plan changes, and kept a while after it ends
	totals  Totals
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
	if cfg.Oracle == nil {
		cfg.Oracle = &Oracle{}
	}
	if cfg.Stage == nil {
		cfg.Stage = NewStage()
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Prefetcher{
		cfg: cfg, log: cfg.Logger, load: load, plans: plans,
		tasks: make(chan []*catalog.Entry), wake: make(chan struct{}, 1), pushWake: make(chan struct{}, 1), cancel: cancel,
		history: map[streamID]*rankHistory{}, stage: cfg.Stage, oracle: cfg.Oracle,
	}
	p.builtCond = sync.NewCond(&p.builtMu)
	p.stage.owner.Store(p) // Hold asks p's plans from here on
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
	p.stage.clear()
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
