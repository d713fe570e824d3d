// Package readers follows the processes that read the mount without
// announcing a job, and announces for them what their reads show.
//
// # Streams
//
// Every FUSE read carries the caller's pid. A stream is a reader process
// with its workers: a process of the same user whose parent has the same
// command line (a forked DataLoader worker) or that multiprocessing
// started belongs to its parent's stream. The pid → stream map is filled
// from /proc on a pid's first read and bounded. Each stream keeps its
// counters and a ring of the files it read first, most recent last, each
// with the process that read it and whether it waited on the PFS.
//
// # Processes and users
//
// A process is its pid and its start time (access.Proc): a pid's entry is
// checked against /proc again once it is Recheck old, and a pid that a new
// process took is resolved anew, never joined to the stream of the one
// that held it. (The kernel hands pids out cyclically, so a pid comes back
// only after pid_max others: not within Recheck.) A stream ends when its
// process exits, found within ExitCheck, or after Idle without a read.
//
// Streams belong to the user of their process. A full table gives a new
// stream the slot of the least recently read stream of the user holding
// the most, if that user holds more than its share (MaxStreams over the
// users with streams) and the new one's holds less; inferred jobs
// (MaxInferred) are shared the same way. A read whose process dlfs cannot
// see (a pid in another pid namespace arrives as 0) belongs to no stream.
//
// # Inference
//
// A goroutine owned by the Tracker judges the streams off the read path.
// A stream holds an inferred job for each dataset it reads in turn, at
// most maxLanes (a training set and its validation set; a third gives up
// the one read least recently); each job follows the stream's new files
// that its index holds. Files under the root of a job the stream's user
// announced are that job's: nothing is inferred from them, and an
// inferred job over them ends. The rest are judged for a job of their
// own: the judge places them in the ImageFolder index of the deepest
// directory above them whose index holds them (with the extensions the
// stream read), and calls the pattern (Detect):
//   - sequential (SequentialSampler, an evaluation loop, tar, cp -r) or
//     strided (DistributedSampler without shuffle): it registers an
//     inferred job (sampler=sequential, or distributed with shuffle=false,
//     world=stride and the rank), and the prefetcher and the caches follow
//     it as they follow an announced job. A reader that loops starts the
//     next epoch when it wraps around.
//   - anything else: the stream's first files are searched, off the judge
//     too, for the torch order that reads them early (searchDistributed:
//     DistributedSampler with seed+epoch below 2^16, any world up to 1,024
//     and rank; with one rank, RandomSampler with a seeded generator is
//     told apart at its second epoch). A guess found is registered like a
//     scan's. A random verdict makes the stream wait a cooldown before its
//     files are judged again.
//
// # Passes
//
// A stream that moves into a directory it had not read in (newPass: a
// validation pass over val/ after a shuffled epoch over train/) has that
// pass judged apart from the files it read before, as soon as the pass
// holds MinEvidence files, cooldown or not: below the directory holding
// its recent files, the newest ones lie in a branch none of the older
// ones do, and those lie in at most two branches (not a shuffled reader
// of many classes). Whether the training is announced, inferred or
// unpredictable, the pass gets an inferred job of its own, which moves to
// its next epoch at the next pass.
//
// Only files whose first reads waited on the PFS (a quarter of those
// judged or more) are judged: a stream the caches already serve has
// nothing to gain.
//
// # Loader shape
//
// A DataLoader's worker is a process of its own and reads one batch, B
// consecutive positions of the sampler's order; batch k goes to worker
// k % W. Every read carries its thread, so an inferred job tells B and W
// from which process read which positions (shapeOf) and puts batch= and
// workers= in its line once they show; until then the line leaves them
// out, and the registry plans with an assumed shape and shows them as
// unknown (its .batches files are absent). W is 0 when the stream's own
// process reads everything.
//
// # Bounds
//
// An inferred job acts for its stream's user: its index holds only what
// that user may read (Config.Index), so it neither names nor prefetches
// anything else.
//
// An inferred job may fetch only a bounded distance ahead: Ahead starts at
// MinAhead samples and doubles with every confirmed read, so a guess that
// later reads contradict costs at most max(MinAhead, 2×confirmed)
// samples of prefetch; it is ended at the first judgement that contradicts
// it (its files read off its plan). A job whose stream read none of its
// files among the last History (a training epoch between two validation
// passes) may again fetch only MinAhead past where its reader left off,
// and its confirmations start over.
package readers

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlfs/dlfs/access"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
)

// Config configures a Tracker.
type Config struct {
	ProcRoot   string        // default "/proc"
	History    int           // files remembered per stream; default 256
	MaxStreams int           // default 256
	MaxPids    int           // pid → stream entries kept; default 8192
	Interval   time.Duration // how often streams are judged; default 100 ms
	Idle       time.Duration // a stream with no read for this long is dropped; default 2 min
	// Recheck is how long a pid's process is trusted before its start
	// time is read again; default 50 ms.
	Recheck time.Duration
	// ExitCheck is how often the streams' processes are checked for
	// having exited; default 1 s.
	ExitCheck time.Duration
	// Snapshot returns the catalog's current snapshot.
	Snapshot func() *catalog.Snapshot
	// Index builds the ImageFolder index of root (relative to the mount)
	// with the given extensions, as user cred may read it.
	Index func(root string, exts []string, cred access.Cred) ([]folder.Sample, error)
	// Jobs registers, moves and ends inferred jobs.
	Jobs   Jobs
	Logger *slog.Logger // nil: discard
}

// Jobs is what the Tracker needs of the job registry.
type Jobs interface {
	// ApplyInferred registers or updates an inferred job for user owner.
	ApplyInferred(owner access.Cred, line control.Job) error
	// End drops a job.
	End(name string) error
	// SetAhead bounds how many samples the prefetcher may fetch ahead of
	// a job's readers (0: no bound).
	SetAhead(name string, n int)
	// AnnouncedRoots returns the dataset roots (relative to the mount;
	// "." is all of it) of the jobs user uid announced (not inferred):
	// that user's reads of files under them are those jobs', and nothing
	// is inferred from them.
	AnnouncedRoots(uid uint32) []string
}

// Defaults of Config.
const (
	DefaultHistory    = 256
	DefaultMaxStreams = 256
	DefaultMaxPids    = 8192
)

// Inference limits.
const (
	// MinAhead is how far an inferred job may fetch ahead at first.
	MinAhead = 64
	// FreeAhead: confirmed reads after which the bound is lifted.
	FreeAhead = 4096
	// MaxInferred bounds the inferred jobs at once (a torch order's costs
	// 8 bytes per sample of the index: 80 MB at 10 M files).
	MaxInferred = 8
	// cooldown: new files a stream must read after a contradicted guess
	// before it is judged again.
	cooldown = 256
	// maxSearches bounds the searches for one stream's torch order (each
	// costs up to a couple of CPU-seconds).
	maxSearches = 4
)

// StreamStats describe one stream, as shown under streams in .dlfs/stats.
type StreamStats struct {
	Pid   int    `json:"pid"`
	Uid   uint32 `json:"uid"`
	Reads int64  `json:"reads"`
	Hits  int64  `json:"hits"` // reads that did not wait on the PFS
	Files int64  `json:"files"`
	// ReadSeconds is the time dlfs took to serve the stream's reads, and
	// Sources splits reads and that time by the tier that served them.
	ReadSeconds float64               `json:"read_seconds"`
	Sources     map[string]SourceTime `json:"sources,omitempty"`
	// LastRead is when dlfs last served it.
	LastRead time.Time `json:"last_read"`
	// Pattern, Job and Root are what its newest reads follow: an
	// inferred job's, or the last verdict on reads no job holds.
	Pattern string `json:"pattern"` // "", "sequential", "strided W+R", "random", "torch ..."
	Job     string `json:"job,omitempty"`
	Root    string `json:"root,omitempty"`
	// Jobs are all its inferred jobs (a training set's and its
	// validation set's).
	Jobs []string `json:"jobs,omitempty"`
}

// SourceTime is the reads a tier served to a stream, and the time they
// took.
type SourceTime struct {
	Reads   int64   `json:"reads"`
	Seconds float64 `json:"seconds"`
}

// maxSources bounds a stream's Sources (the loader's tiers are five).
const maxSources = 8

// Tracker groups reads into streams and infers their jobs.
type Tracker struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	pids    map[int]pidEntry        // by the reading thread's id
	streams map[access.Proc]*stream // by the stream's process
	kick    chan struct{}

	// dropped are streams taken out of streams, whose inferred jobs the
	// judge ends (mu).
	dropped []*stream
	// checkExits asks the judge to look for exited processes now (the
	// table is full).
	checkExits atomic.Bool
	exitsAt    time.Time // the judge's: the last look

	cache []*indexed // recent indexes, most recent first; the judge's own

	searching bool              // the judge's: a search is running
	found     chan searchResult // a search's outcome, to the judge

	cancel context.CancelFunc
	wg     sync.WaitGroup
	judged atomic.Int64 // judgements made (for tests)
	// settled counts the first reads of files the judge has finished
	// judging (for tests: every one observed is, once it equals them).
	settled atomic.Int64
}

// New returns a Tracker; Start runs its judge.
func New(cfg Config) *Tracker {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.History <= 0 {
		cfg.History = DefaultHistory
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	if cfg.MaxPids <= 0 {
		cfg.MaxPids = DefaultMaxPids
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 100 * time.Millisecond
	}
	if cfg.Idle <= 0 {
		cfg.Idle = 2 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Recheck <= 0 {
		cfg.Recheck = 50 * time.Millisecond
	}
	if cfg.ExitCheck <= 0 {
		cfg.ExitCheck = time.Second
	}
	return &Tracker{cfg: cfg, log: cfg.Logger, pids: map[int]pidEntry{}, streams: map[access.Proc]*stream{}, kick: make(chan struct{}, 1),
		found: make(chan searchResult, 1)}
}

// Start runs the judge until Close.
func (t *Tracker) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	t.wg.Add(1)
	go t.judgeLoop(ctx)
}

// Close stops the judge and ends the inferred jobs.
func (t *Tracker) Close() {
	if t.cancel != nil {
		t.cancel()
		t.wg.Wait()
	}
}
