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
	"fmt"
	"log/slog"
	"maps"
	"math"
	"path"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlfs/dlfs/access"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
	"github.com/dlfs/dlfs/jobs"
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

// pidEntry is what a reading thread's id resolved to.
type pidEntry struct {
	thread  access.Proc // the thread, with its start time
	proc    int         // the thread's process (its thread group)
	stream  access.Proc // the stream's process
	cred    access.Cred
	checked time.Time // when thread's start time was last read
	seen    time.Time
}

// Reader is who made a read: the stream it belongs to and its user. Known
// is false for a read whose process dlfs cannot see (pid 0: another pid
// namespace; or gone from /proc).
type Reader struct {
	Stream access.Proc
	Cred   access.Cred
	Known  bool
}

// stream is one reader process and its workers.
type stream struct {
	key   access.Proc
	cred  access.Cred
	stats StreamStats
	ring  []fileRead // first reads of files, oldest first once full
	next  int        // where the next file goes in ring
	fresh int        // files read since the last judgement
	last  time.Time
	first []*catalog.Entry // its first SearchReads files, for the search of a torch order (mu)

	// The judge's own:
	quiet    int    // new files no job holds to wait before judging them again
	quietDir string // where the files judged then lie: a pass elsewhere is judged at once
	lanes    []*inference
	seq      int  // files judged so far
	searched bool // first was searched
	searches int  // searches run for this stream
}

// maxLanes bounds a stream's inferred jobs: one per dataset it reads in
// turn (a training set and its validation set). A stream that starts on
// another gives up the one it read least recently.
const maxLanes = 2

// inference is an inferred job and where its reader is. Positions are in
// the order the job plans for its rank, epoch after epoch ("unwrapped":
// epoch e's position i is e·length + i).
type inference struct {
	job     string
	line    control.Job
	idx     *indexed
	pattern Pattern
	guess   Guess // for a torch order
	epoch   int
	plan    []int32 // a torch order's index position -> its position in this epoch's order; -1: not the rank's
	next    []int32 // the same for the next epoch, once the reader nears its end
	nearEnd bool    // next is ready
	// A one-rank torch order may be RandomSampler with a generator seeded
	// guess.Seed rather than DistributedSampler: they agree on epoch 0 and
	// differ after. nextRandom is the RandomSampler's next epoch; random
	// says the reader turned out to be one.
	nextRandom []int32
	random     bool
	length     int // positions in an epoch
	high       int // the highest unwrapped position read
	confirmed  int
	ahead      int
	recent     []int // the unwrapped positions of the last History files read
	shown      string
	lastSeq    int       // the stream's seq when it last read one of the job's files
	obs        []posRead // recent reads with their processes, for the loader's shape (shapeOf); at most 2·shapeWindow
	sinceShape int       // reads since the shape was last looked at
}

// planOf is the rank's order in epoch e, as index position -> position
// (4 bytes per sample), for a torch order; nil for a scan, whose positions
// are arithmetic (planned). It is the order the job's line plans
// (jobs.ReadOrder), RandomSampler's once the reader turned out to be one.
func (inf *inference) planOf(e int) []int32 {
	if inf.pattern.Kind != "torch" {
		return nil
	}
	if inf.random {
		return inf.randomPlan(e)
	}
	return positions(jobs.ReadOrder(inf.spec(), inf.idx.n, inf.guess.Rank, e), inf.idx.n)
}

// randomPlan is RandomSampler's order in epoch e, as planOf gives it.
func (inf *inference) randomPlan(e int) []int32 {
	spec := inf.spec()
	spec.Sampler = "random"
	return positions(jobs.ReadOrder(spec, inf.idx.n, inf.guess.Rank, e), inf.idx.n)
}

// spec is the inferred job's line with the defaults filled in.
func (inf *inference) spec() control.Job { return inf.line.Merge(control.DefaultJob()) }

// positions inverts an order of n samples: sample -> its position.
func positions(order []int, n int) []int32 {
	plan := make([]int32, n)
	for i := range plan {
		plan[i] = -1
	}
	for j := len(order) - 1; j >= 0; j-- { // a padded repeat keeps its first position
		plan[order[j]] = int32(j)
	}
	return plan
}

// planned is index position x's position in the rank's order under plan
// (an epoch's planOf), or false if the rank does not read it.
func (inf *inference) planned(plan []int32, x int) (int, bool) {
	switch inf.pattern.Kind {
	case "sequential":
		return x, true
	case "strided":
		if x%inf.pattern.Stride != inf.pattern.Rank {
			return 0, false
		}
		return x / inf.pattern.Stride, true
	}
	if x < len(plan) && plan[x] >= 0 {
		return int(plan[x]), true
	}
	return 0, false // no plan (the next epoch's, before it is made)
}

// epochLength is how many positions the rank reads an epoch.
func (inf *inference) epochLength() int {
	n := inf.idx.n
	switch inf.pattern.Kind {
	case "sequential":
		return n
	case "strided":
		return (n - inf.pattern.Rank + inf.pattern.Stride - 1) / inf.pattern.Stride
	}
	return jobs.Distributed(inf.spec(), n).NumSamples()
}

// indexed is an ImageFolder index and its positions by file: 4 bytes per
// inode number of the catalog (40 MB at 10 M files).
type indexed struct {
	snap *catalog.Snapshot
	root string
	exts string
	view string // the user it is an index for
	n    int
	pos  []int32 // by Entry.Ino: the file's first position in the index, or -1
}

// at returns e's position in the index.
func (x *indexed) at(e *catalog.Entry) (int, bool) {
	if e.Ino >= uint64(len(x.pos)) || x.pos[e.Ino] < 0 {
		return 0, false
	}
	return int(x.pos[e.Ino]), true
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

// Observe records a read of e at off by pid, which dlfs served from
// source (the tier) in took; waited says it waited on the PFS. It returns
// who read. It never blocks on more than reading /proc for a pid's first
// read, or once every Recheck.
func (t *Tracker) Observe(pid uint32, e *catalog.Entry, off int64, waited bool, source string, took time.Duration) Reader {
	if pid == 0 || e == nil {
		return Reader{}
	}
	now := time.Now()
	p, ok := t.identify(int(pid), now)
	if !ok {
		return Reader{}
	}
	r := Reader{Stream: p.stream, Cred: p.cred, Known: true}
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.streams[p.stream]
	if s == nil {
		// A stream of another process that held this pid is over.
		for k, o := range t.streams {
			if k.Pid == p.stream.Pid {
				t.forgetLocked(o)
			}
		}
		if len(t.streams) >= t.cfg.MaxStreams && !t.makeRoomLocked(p.cred.Uid) {
			// Until the judge finds a stream whose process exited, this
			// one is not followed.
			t.checkExits.Store(true)
			return r
		}
		s = &stream{key: p.stream, cred: p.cred, ring: make([]fileRead, 0, t.cfg.History),
			stats: StreamStats{Pid: p.stream.Pid, Uid: p.cred.Uid}}
		t.streams[p.stream] = s
	}
	s.last, s.stats.LastRead = now, now
	s.stats.Reads++
	s.stats.ReadSeconds += took.Seconds()
	if s.stats.Sources == nil {
		s.stats.Sources = map[string]SourceTime{}
	}
	if st, ok := s.stats.Sources[source]; ok || len(s.stats.Sources) < maxSources {
		st.Reads++
		st.Seconds += took.Seconds()
		s.stats.Sources[source] = st
	}
	if !waited {
		s.stats.Hits++
	}
	if off != 0 {
		return r
	}
	s.stats.Files++
	if fr := (fileRead{e, p.proc, waited}); len(s.ring) < cap(s.ring) {
		s.ring = append(s.ring, fr)
	} else {
		s.ring[s.next] = fr
		s.next = (s.next + 1) % len(s.ring)
	}
	if len(s.first) < SearchReads {
		s.first = append(s.first, e)
	}
	s.fresh++
	if s.fresh >= MinEvidence {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
	return r
}

// makeRoomLocked frees a slot for a new stream of uid if uid holds less
// than its share of MaxStreams and another user more: that user's least
// recently read stream goes.
func (t *Tracker) makeRoomLocked(uid uint32) bool {
	held := map[uint32][]*stream{}
	for _, s := range t.streams {
		held[s.cred.Uid] = append(held[s.cred.Uid], s)
	}
	victims, ok := overShare(held, uid, t.cfg.MaxStreams)
	if !ok {
		return false
	}
	oldest := victims[0]
	for _, s := range victims {
		if s.last.Before(oldest.last) {
			oldest = s
		}
	}
	t.log.Info("readers: a user over its share of streams gives one up", "uid", oldest.cred.Uid, "pid", oldest.key.Pid, "for_uid", uid)
	t.forgetLocked(oldest)
	return true
}

// overShare returns the streams of the user holding the most of slots, if
// that user holds more than its share and uid less: a share is slots
// over the users holding some, uid included.
func overShare(held map[uint32][]*stream, uid uint32, slots int) ([]*stream, bool) {
	users := len(held)
	if len(held[uid]) == 0 {
		users++
	}
	share := max(slots/users, 1)
	if len(held[uid]) >= share {
		return nil, false
	}
	var most []*stream
	for u, ss := range held {
		if u != uid && len(ss) > len(most) {
			most = ss
		}
	}
	if len(most) <= share {
		return nil, false
	}
	return most, true
}

// Stream returns the figures of the stream whose reading process is pid
// (a stream is keyed by its top process: a DataLoader's main process, not
// its workers).
func (t *Tracker) Stream(pid int) (StreamStats, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, s := range t.streams {
		if k.Pid == pid {
			return s.statsLocked(), true // one stream a pid: a new process's replaces an old one's
		}
	}
	return StreamStats{}, false
}

// statsLocked copies the stream's figures, its map too.
func (s *stream) statsLocked() StreamStats {
	st := s.stats
	st.Sources = maps.Clone(st.Sources)
	st.Jobs = slices.Clone(st.Jobs)
	return st
}

// identify returns what the reading thread pid resolves to: its process's
// stream and user. A pid's entry is trusted for Recheck; then its start
// time is read again, and a pid that another process took is resolved
// anew. ok is false if pid is gone.
func (t *Tracker) identify(pid int, now time.Time) (pidEntry, bool) {
	t.mu.Lock()
	p, ok := t.pids[pid]
	if ok && now.Sub(p.checked) < t.cfg.Recheck {
		p.seen = now
		t.pids[pid] = p
		t.mu.Unlock()
		return p, true
	}
	t.mu.Unlock()
	start, err := access.StartTime(t.cfg.ProcRoot, pid)
	if err == nil && ok && start == p.thread.Start {
		if cred, err := access.CredOf(t.cfg.ProcRoot, pid); err == nil {
			p.cred = cred // a process may change its user (setuid)
		}
	} else if err == nil {
		p, err = t.resolve(pid, start)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		delete(t.pids, pid)
		return pidEntry{}, false
	}
	p.checked, p.seen = now, now
	if len(t.pids) >= t.cfg.MaxPids {
		// Drop the half least recently seen.
		seen := make([]time.Time, 0, len(t.pids))
		for _, p := range t.pids {
			seen = append(seen, p.seen)
		}
		slices.SortFunc(seen, func(a, b time.Time) int { return a.Compare(b) })
		cut := seen[len(seen)/2]
		for k, p := range t.pids {
			if p.seen.Before(cut) {
				delete(t.pids, k)
			}
		}
	}
	t.pids[pid] = p
	return p, true
}

// resolve finds the stream of thread pid, which started at start: its
// process, or the highest ancestor of the same user of which it is a
// worker.
func (t *Tracker) resolve(pid int, start uint64) (pidEntry, error) {
	info, err := readProc(t.cfg.ProcRoot, pid)
	if err != nil {
		return pidEntry{}, err
	}
	p := pidEntry{thread: access.Proc{Pid: pid, Start: start}, proc: info.tgid, cred: info.cred}
	p.stream = p.thread
	if info.tgid != pid { // a thread reads for its process
		ps, err := access.StartTime(t.cfg.ProcRoot, info.tgid)
		if err != nil {
			return pidEntry{}, err
		}
		p.stream = access.Proc{Pid: info.tgid, Start: ps}
	}
	for hops := 0; info.ppid > 1 && hops < 8; hops++ {
		parent, err := readProc(t.cfg.ProcRoot, info.ppid)
		if err != nil || parent.cred.Uid != info.cred.Uid || !isWorkerOf(info.cmdline, parent.cmdline) {
			break
		}
		ps, err := access.StartTime(t.cfg.ProcRoot, parent.tgid)
		if err != nil {
			break
		}
		p.stream, info = access.Proc{Pid: parent.tgid, Start: ps}, parent
	}
	return p, nil
}

// forgetLocked drops s; the judge ends its inferred job (s's inference
// is the judge's).
func (t *Tracker) forgetLocked(s *stream) {
	if t.streams[s.key] == s {
		delete(t.streams, s.key)
		t.dropped = append(t.dropped, s)
	}
}

// endDropped ends the inferred jobs of dropped streams. Only the judge
// calls it.
func (t *Tracker) endDropped() {
	t.mu.Lock()
	dropped := t.dropped
	t.dropped = nil
	t.mu.Unlock()
	for _, s := range dropped {
		for _, inf := range s.lanes {
			if err := t.cfg.Jobs.End(inf.job); err != nil {
				t.log.Debug("readers: ending a dropped stream's job", "job", inf.job, "err", err)
			}
		}
		s.lanes = nil
	}
}

// exited drops the streams whose processes have exited, and the pids that
// led to them.
func (t *Tracker) exited() {
	t.mu.Lock()
	keys := slices.Collect(maps.Keys(t.streams))
	t.mu.Unlock()
	var gone []access.Proc
	for _, k := range keys {
		if !access.Alive(t.cfg.ProcRoot, k) {
			gone = append(gone, k)
		}
	}
	if len(gone) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range gone {
		if s := t.streams[k]; s != nil {
			t.log.Debug("readers: a stream's process exited", "pid", k.Pid)
			t.forgetLocked(s)
		}
	}
	for pid, p := range t.pids {
		if slices.Contains(gone, p.stream) {
			delete(t.pids, pid)
		}
	}
}

// Streams returns every stream's figures, by pid.
func (t *Tracker) Streams() []StreamStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]StreamStats, 0, len(t.streams))
	for _, s := range t.streams {
		out = append(out, s.statsLocked())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return out
}

// recentLocked copies the ring, oldest first.
func (s *stream) recentLocked() []fileRead {
	return append(append([]fileRead(nil), s.ring[s.next:]...), s.ring[:s.next]...)
}

// judgeLoop judges the streams with fresh reads every Interval, or sooner
// when a stream has enough, until ctx ends. On the way out it ends the
// inferred jobs.
func (t *Tracker) judgeLoop(ctx context.Context) {
	defer t.wg.Done()
	tick := time.NewTicker(t.cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			t.mu.Lock()
			for _, s := range t.streams {
				t.forgetLocked(s)
			}
			t.mu.Unlock()
			t.endDropped()
			return
		case <-tick.C:
		case <-t.kick:
		case r := <-t.found:
			t.searching = false
			t.searched(r)
		}
		t.judgeAll(ctx)
	}
}

// judgeAll judges every stream with fresh files, and drops idle ones.
func (t *Tracker) judgeAll(ctx context.Context) {
	type work struct {
		s     *stream
		files []fileRead // the ring, oldest first
		fresh int
	}
	var todo []work
	now := time.Now()
	if now.Sub(t.exitsAt) >= t.cfg.ExitCheck || t.checkExits.Swap(false) {
		t.exitsAt = now
		t.exited()
	}
	t.mu.Lock()
	for _, s := range t.streams {
		if now.Sub(s.last) > t.cfg.Idle {
			t.forgetLocked(s)
			continue
		}
		if s.fresh == 0 || (len(s.lanes) == 0 && s.fresh < MinEvidence && len(s.ring) < MinEvidence) {
			continue
		}
		todo = append(todo, work{s, s.recentLocked(), s.fresh})
		s.fresh = 0
	}
	t.mu.Unlock()
	t.endDropped()
	for _, w := range todo {
		t.judge(ctx, w.s, w.files, w.fresh)
		t.settled.Add(int64(w.fresh))
	}
}

// judge looks at a stream's files (oldest first; the last fresh of them
// are new since the last judgement): each of its inferred jobs follows
// the new files its index holds; the files no job holds, but those of the
// jobs its user announced, are judged for a job of their own. Only the
// judge goroutine calls it; s's inference fields are its own, and only
// stats and ring are shared with Observe.
func (t *Tracker) judge(ctx context.Context, s *stream, files []fileRead, fresh int) {
	defer t.judged.Add(1)
	news := files[max(len(files)-fresh, 0):]
	// Files the ring dropped before the judge saw them let a reader move
	// that much further.
	unseen := max(fresh-len(files), 0)
	s.seq += fresh
	roots := t.cfg.Jobs.AnnouncedRoots(s.cred.Uid)
	for _, inf := range slices.Clone(s.lanes) {
		if overlapsAny(roots, inf.idx.root) {
			t.drop(s, inf, "a job its user announced plans its files", false)
		}
	}
	lanes := slices.Clone(s.lanes)
	mine := make([][]fileRead, len(lanes))
	own, newest := 0, fileRead{} // new files no job holds, and the last of them
	for _, r := range news {
		if i := laneOf(lanes, r.e); i >= 0 {
			mine[i] = append(mine[i], r)
		} else if !coveredBy(roots, r.e) {
			own, newest = own+1, r
		}
	}
	for i, inf := range lanes {
		switch {
		case len(mine[i]) > 0:
			inf.lastSeq = s.seq
			t.follow(s, inf, mine[i], unseen)
		case s.seq-inf.lastSeq > t.cfg.History:
			t.idle(inf)
		}
	}
	if len(news) > 0 {
		if i := laneOf(s.lanes, news[len(news)-1].e); i >= 0 {
			t.show(s, s.lanes[i])
		}
	}
	if own == 0 {
		return
	}
	s.quiet = max(s.quiet-own, 0)
	if s.quiet > 0 && under(newest.e.Path(), s.quietDir) {
		return // still where the cooldown began
	}
	var rs []fileRead // the recent files no job holds
	for _, r := range files {
		if laneOf(s.lanes, r.e) < 0 && !coveredBy(roots, r.e) {
			rs = append(rs, r)
		}
	}
	// A pass into a directory the stream had not read (a validation
	// pass after a training epoch) is judged apart from the files before
	// it, as soon as it has enough, whatever the verdict on those.
	pass, moved := newPass(rs)
	if moved && len(pass) < MinEvidence {
		return
	}
	if s.quiet > 0 && !(moved && !under(commonDir(pass), s.quietDir)) {
		return
	}
	rs = pass
	// A stream whose reads rarely wait on the PFS has nothing to gain:
	// leave it (and the CPU a search costs) alone.
	waited := 0
	for _, r := range rs {
		if r.waited {
			waited++
		}
	}
	if 4*waited < len(rs) {
		return
	}
	entries := make([]*catalog.Entry, len(rs))
	for i, r := range rs {
		entries[i] = r.e
	}
	idx, positions := t.place(entries, s.cred)
	if idx == nil {
		return
	}
	p, ok := Detect(positions, idx.n)
	if ok {
		t.setPattern(s, p.String(), idx.root, "")
		if p.Kind != "random" {
			t.infer(s, idx, p, Guess{}, rs)
			return
		}
		s.quiet, s.quietDir = cooldown, commonDir(rs)
	}
	t.search(ctx, s, roots)
}

// laneOf returns the index of the first of lanes whose index holds e, or
// −1.
func laneOf(lanes []*inference, e *catalog.Entry) int {
	for i, inf := range lanes {
		if _, ok := inf.idx.at(e); ok {
			return i
		}
	}
	return -1
}

// coveredBy reports whether e lies under one of roots.
func coveredBy(roots []string, e *catalog.Entry) bool {
	return slices.ContainsFunc(roots, func(r string) bool { return under(e.Path(), r) })
}

// overlapsAny reports whether an index of root would hold files under one
// of roots, or one of them files under root.
func overlapsAny(roots []string, root string) bool {
	return slices.ContainsFunc(roots, func(r string) bool { return under(root, r) || under(r, root) })
}

// searchResult is a search's outcome for a stream.
type searchResult struct {
	s     *stream
	idx   *indexed
	guess Guess
	ok    bool
}

// search starts, once per stream and one at a time, the search for the
// torch order that explains the stream's first files (none of which a
// job, announced under roots or inferred, holds).
func (t *Tracker) search(ctx context.Context, s *stream, roots []string) {
	t.mu.Lock()
	first := slices.DeleteFunc(slices.Clone(s.first), func(e *catalog.Entry) bool {
		return laneOf(s.lanes, e) >= 0 || coveredBy(roots, e)
	})
	t.mu.Unlock()
	if s.searched || t.searching || len(first) < SearchReads || s.searches >= maxSearches {
		return
	}
	idx, positions := t.place(first, s.cred)
	if idx == nil || slices.Contains(positions, -1) {
		return
	}
	s.searched, t.searching = true, true
	s.searches++
	workers := max(runtime.GOMAXPROCS(0)/2, 1)
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		start := time.Now()
		g, ok := searchDistributed(ctx, positions, idx.n, workers, MaxSeed)
		t.log.Debug("readers: searched a torch order", "stream", s.key.Pid, "found", ok, "seconds", time.Since(start).Seconds())
		select {
		case t.found <- searchResult{s, idx, g, ok}:
		case <-ctx.Done():
		}
	}()
}

// searched infers the job a search found, if its stream still reads and
// no job, announced or inferred, holds its index's files.
func (t *Tracker) searched(r searchResult) {
	t.mu.Lock()
	alive := t.streams[r.s.key] == r.s
	files := r.s.recentLocked()
	t.mu.Unlock()
	if !r.ok || !alive || r.idx.snap != t.cfg.Snapshot() {
		return
	}
	t.infer(r.s, r.idx, Pattern{Kind: "torch", Stride: 1}, r.guess, files)
}

func (t *Tracker) setPattern(s *stream, pattern, root, job string) {
	jobs := jobNames(s.lanes)
	t.mu.Lock()
	s.stats.Pattern, s.stats.Root, s.stats.Job, s.stats.Jobs = pattern, root, job, jobs
	t.mu.Unlock()
}

// jobNames are the names of lanes' jobs.
func jobNames(lanes []*inference) []string {
	var out []string
	for _, inf := range lanes {
		out = append(out, inf.job)
	}
	return out
}

// show makes inf what s's stats say its reads follow.
func (t *Tracker) show(s *stream, inf *inference) { t.setPattern(s, inf.shown, inf.idx.root, inf.job) }

// infer registers the job that pattern p in idx implies for s, read as
// files (the files idx does not hold are left out).
func (t *Tracker) infer(s *stream, idx *indexed, p Pattern, guess Guess, files []fileRead) {
	if strings.ContainsAny(idx.root+idx.exts, " \t\n") {
		return
	}
	// No two jobs plan the same files.
	if overlapsAny(t.cfg.Jobs.AnnouncedRoots(s.cred.Uid), idx.root) ||
		slices.ContainsFunc(s.lanes, func(o *inference) bool { return overlapsAny([]string{o.idx.root}, idx.root) }) {
		return
	}
	t.mu.Lock()
	held := map[uint32][]*stream{} // a stream once per job
	n := 0
	for _, o := range t.streams {
		for range o.lanes {
			held[o.cred.Uid] = append(held[o.cred.Uid], o)
			n++
		}
	}
	t.mu.Unlock()
	if n >= MaxInferred {
		// Inferred jobs are shared per user: a user over its share gives
		// up its least recently read one to a user under it.
		victims, ok := overShare(held, s.cred.Uid, MaxInferred)
		if !ok {
			return
		}
		oldest := victims[0]
		t.mu.Lock()
		for _, o := range victims {
			if o.last.Before(oldest.last) {
				oldest = o
			}
		}
		t.mu.Unlock()
		t.drop(oldest, leastRecent(oldest.lanes), fmt.Sprintf("uid %d holds more than its share of inferred jobs, and uid %d less", oldest.cred.Uid, s.cred.Uid), false)
	}
	if len(s.lanes) >= maxLanes {
		t.drop(s, leastRecent(s.lanes), "its stream reads another dataset", false)
	}
	root := idx.root
	if root == "" {
		root = "."
	}
	name := laneName(s)
	line, err := inferredLine(name, root, idx.exts, p, guess)
	if err != nil {
		t.log.Warn("readers: cannot express the inferred job", "job", name, "root", root, "pattern", p.String(), "err", err)
		return
	}
	inf := &inference{job: name, line: line, idx: idx, pattern: p, guess: guess, ahead: MinAhead, high: -1, lastSeq: s.seq}
	inf.plan, inf.length = inf.planOf(0), inf.epochLength()
	for _, r := range files {
		if x, ok := idx.at(r.e); ok {
			if q, ok := inf.planned(inf.plan, x); ok {
				inf.high = max(inf.high, q)
				inf.recent = append(inf.recent, q)
				inf.obs = append(inf.obs, posRead{q, r.proc})
			}
		}
	}
	inf.line = withShape(inf.line, inf.obs, inf.length, s.key.Pid)
	t.cfg.Jobs.SetAhead(name, MinAhead)
	if err := t.cfg.Jobs.ApplyInferred(s.cred, inf.line); err != nil {
		t.log.Info("readers: inferred job refused", "stream", s.key.Pid, "job", name, "root", root, "pattern", p.String(), "err", err)
		s.quiet, s.quietDir = cooldown, commonDir(files)
		return
	}
	t.cfg.Jobs.SetAhead(name, MinAhead)
	s.lanes = append(s.lanes, inf)
	t.mu.Lock()
	alive := t.streams[s.key] == s
	t.mu.Unlock()
	if !alive { // dropped meanwhile, after the judge ended its dropped streams' jobs
		t.drop(s, inf, "its stream ended", false)
		return
	}
	inf.shown = p.String()
	if p.Kind == "torch" {
		inf.shown = fmt.Sprintf("torch seed=%d world=%d rank=%d", guess.Seed, guess.World, guess.Rank)
	}
	t.show(s, inf)
	t.log.Info("readers: inferred a job", "stream", s.key.Pid, "uid", s.cred.Uid, "pattern", inf.shown, "root", root, "job", name,
		"batch", shapeKey(inf.line, "batch", inf.line.Batch), "workers", shapeKey(inf.line, "workers", inf.line.Workers))
}

// inferredLine is the job line of an inferred job called name that reads
// root's files with extensions exts (a comma list) in pattern p (guess
// for a torch order). The loader's batch size and workers go in once the
// reads show them (withShape); until then the line leaves them out.
func inferredLine(name, root, exts string, p Pattern, guess Guess) (control.Job, error) {
	line := control.Job{Name: name, Root: root, Dataset: "imagefolder", Extensions: strings.Split(exts, ","), Epoch: 0, Lookahead: 2,
		Set: map[string]bool{"job": true, "root": true, "dataset": true, "extensions": true, "epoch": true, "lookahead": true, "sampler": true}}
	switch p.Kind {
	case "sequential":
		line.Sampler = "sequential"
	case "strided":
		line.Sampler, line.Shuffle, line.World, line.Ranks = "distributed", false, p.Stride, []int{p.Rank}
		line.Set["shuffle"], line.Set["world"], line.Set["ranks"] = true, true, true
	default:
		line.Sampler, line.Shuffle, line.Seed, line.World, line.Ranks = "distributed", true, guess.Seed, guess.World, []int{guess.Rank}
		line.Set["shuffle"], line.Set["seed"], line.Set["world"], line.Set["ranks"] = true, true, true, true
	}
	return line, line.Validate()
}

// shapeKey is a line's value of key, or "unknown" if the line leaves it
// out (for logs).
func shapeKey(line control.Job, key string, v int) string {
	if !line.Set[key] {
		return "unknown"
	}
	return fmt.Sprint(v)
}

// leastRecent returns the lane read least recently.
func leastRecent(lanes []*inference) *inference {
	return slices.MinFunc(lanes, func(a, b *inference) int { return a.lastSeq - b.lastSeq })
}

// laneName names a new job of s: auto-PID, or auto-PID-N for its Nth at
// once.
func laneName(s *stream) string {
	for n := 1; ; n++ {
		name := fmt.Sprintf("auto-%d", s.key.Pid)
		if n > 1 {
			name += fmt.Sprintf("-%d", n)
		}
		if !slices.ContainsFunc(s.lanes, func(o *inference) bool { return o.job == name }) {
			return name
		}
	}
}

// withShape returns line with batch= and workers= as the reads obs show
// them (shapeOf), and the line's own where they do not.
func withShape(line control.Job, obs []posRead, length, main int) control.Job {
	b, w := shapeOf(obs, length, main)
	line.Set = maps.Clone(line.Set)
	if b > 0 {
		line.Batch, line.Set["batch"] = b, true
	}
	if w >= 0 {
		line.Workers, line.Set["workers"] = w, true
	}
	return line
}

// reshape looks at inf's loader's shape again, every shapeEvery reads,
// and updates the job if the reads show a new one.
func (t *Tracker) reshape(s *stream, inf *inference) {
	if inf.sinceShape < shapeEvery {
		return
	}
	inf.sinceShape = 0
	line := withShape(inf.line, inf.obs, inf.length, s.key.Pid)
	if line.Set["batch"] == inf.line.Set["batch"] && line.Batch == inf.line.Batch &&
		line.Set["workers"] == inf.line.Set["workers"] && line.Workers == inf.line.Workers {
		return
	}
	if err := t.cfg.Jobs.ApplyInferred(s.cred, line); err != nil {
		t.log.Info("readers: an inferred job's loader shape refused", "job", inf.job, "err", err)
		return
	}
	inf.line = line
	t.log.Info("readers: an inferred job's loader", "job", inf.job,
		"batch", shapeKey(line, "batch", line.Batch), "workers", shapeKey(line, "workers", line.Workers))
}

// idle: s reads none of inf's files now (a training epoch between two
// validation passes). Its job may fetch only MinAhead past where its
// reader left off, and its confirmations start over when it comes back.
func (t *Tracker) idle(inf *inference) {
	inf.confirmed = 0
	if inf.ahead != MinAhead {
		inf.ahead = MinAhead
		t.cfg.Jobs.SetAhead(inf.job, MinAhead)
	}
}

// follow checks an inferred job against the stream's new files in its
// index (unseen more were read before them that the ring no longer
// holds): a file outside the plan's window ends it; a reader that reaches
// the next epoch's first samples moves it to the next epoch; confirmed
// reads widen how far it may fetch ahead and show the loader's shape.
func (t *Tracker) follow(s *stream, inf *inference, files []fileRead, unseen int) {
	if inf.idx.snap != t.cfg.Snapshot() {
		t.drop(s, inf, "the catalog changed", false)
		return
	}
	bad := 0
	w := min(maxWindow, max(inf.length/4, 1))
	for _, r := range files {
		x, ok := inf.idx.at(r.e)
		if !ok {
			bad++
			continue
		}
		base := inf.epoch * inf.length
		if inf.high-base >= inf.length-w && !inf.nearEnd {
			inf.next, inf.nearEnd = inf.planOf(inf.epoch+1), true
			if inf.pattern.Kind == "torch" && inf.guess.World == 1 && !inf.random {
				inf.nextRandom = inf.randomPlan(inf.epoch + 1)
			}
		}
		u := -1
		if q, ok := inf.planned(inf.plan, x); ok {
			u = base + q
		}
		// The next epoch's first samples: the reader has wrapped around.
		// If they are not DistributedSampler's but RandomSampler's, it is
		// one.
		q, ok := inf.planned(inf.next, x)
		if r, rok := inf.planned(inf.nextRandom, x); inf.nextRandom != nil && inf.nearEnd && rok && r < w && (u < 0 || u < inf.high-w) {
			if ok && q < w {
				continue // either order's start: wait for a read that tells them apart
			}
			inf.random, inf.next, q, ok = true, inf.nextRandom, r, true
		}
		if inf.nearEnd && ok && q < w && (u < 0 || u < inf.high-w) {
			inf.epoch++
			inf.plan, inf.next, inf.nextRandom, inf.nearEnd = inf.next, nil, nil, false
			u = inf.epoch*inf.length + q
			next := inf.line
			next.Epoch = inf.epoch
			next.Set = maps.Clone(inf.line.Set)
			if inf.random {
				next.Sampler = "random"
				next.Set["sampler"] = true
			}
			if err := t.cfg.Jobs.ApplyInferred(s.cred, next); err != nil {
				t.drop(s, inf, "moving it to the next epoch failed: "+err.Error(), true)
				return
			}
			inf.line = next
		}
		// Within reach of the furthest read so far.
		if u < 0 || u < inf.high-w || u > inf.high+w+unseen {
			bad++
			continue
		}
		inf.high = max(inf.high, u)
		inf.confirmed++
		inf.recent = append(inf.recent, u)
		inf.obs = append(inf.obs, posRead{u, r.proc})
		inf.sinceShape++
	}
	if over := len(inf.recent) - t.cfg.History; over > 0 {
		inf.recent = append(inf.recent[:0], inf.recent[over:]...)
	}
	if len(inf.obs) > 2*shapeWindow {
		inf.obs = append(inf.obs[:0], inf.obs[len(inf.obs)-shapeWindow:]...)
	}
	if 4*bad > len(files) && bad > 2 {
		t.drop(s, inf, fmt.Sprintf("%d of %d new files are off the plan", bad, len(files)), true)
		return
	}
	if len(inf.recent) >= t.cfg.History/2 {
		// Unwrapped positions run on past the epoch: no index bounds them.
		if p, ok := Detect(inf.recent, math.MaxInt32); ok && p.Kind != "sequential" {
			t.drop(s, inf, "the recent reads are "+p.String()+" in the plan's order", true)
			return
		}
	}
	t.reshape(s, inf)
	ahead := 0 // no bound
	if inf.confirmed < FreeAhead {
		ahead = max(MinAhead, 2*inf.confirmed)
	}
	if ahead != inf.ahead {
		inf.ahead = ahead
		t.cfg.Jobs.SetAhead(inf.job, ahead)
	}
}

// maxWindow is how far, in samples of the stream, a read may land from
// the furthest so far and still follow an inferred pattern (a DataLoader's
// workers read batches side by side, prefetch_factor batches each); at
// most a quarter of an epoch.
const maxWindow = 2048

// drop ends s's inferred job inf. If the stream's reads contradicted it,
// the files it reads next are judged only after a cooldown.
func (t *Tracker) drop(s *stream, inf *inference, why string, contradicted bool) {
	if err := t.cfg.Jobs.End(inf.job); err != nil {
		t.log.Debug("readers: ending an inferred job", "job", inf.job, "err", err)
	}
	s.lanes = slices.DeleteFunc(s.lanes, func(o *inference) bool { return o == inf })
	if contradicted {
		s.quiet, s.quietDir = cooldown, inf.idx.root
		// The files after a wrong guess may start an epoch of another
		// order (a RandomSampler's next epoch, a new seed): search them
		// too.
		s.searched = false
		t.mu.Lock()
		s.first = s.first[:0]
		t.mu.Unlock()
		t.setPattern(s, "random", inf.idx.root, "")
	} else {
		t.mu.Lock()
		if s.stats.Job == inf.job {
			s.stats.Job = ""
		}
		s.stats.Jobs = jobNames(s.lanes)
		t.mu.Unlock()
	}
	t.log.Info("readers: dropped an inferred job", "stream", s.key.Pid, "job", inf.job, "why", why)
}

// place finds the index that holds files: the ImageFolder index, with the
// extensions the files have, of the deepest directory above them that
// holds three quarters of them; and returns each file's position in it
// (−1: not there).
func (t *Tracker) place(files []*catalog.Entry, cred access.Cred) (*indexed, []int) {
	if len(files) == 0 {
		return nil, nil
	}
	extSet := map[string]bool{}
	dir := path.Dir(files[0].Path())
	for _, e := range files {
		extSet[strings.ToLower(path.Ext(e.Name))] = true
		for dir != "." && !strings.HasPrefix(e.Path(), dir+"/") {
			dir = path.Dir(dir)
		}
	}
	if extSet[""] {
		return nil, nil // ImageFolder cannot select files without an extension
	}
	exts := make([]string, 0, len(extSet))
	for x := range extSet {
		exts = append(exts, x)
	}
	sort.Strings(exts)
	snap := t.cfg.Snapshot()
	for {
		root := dir
		if root == "." {
			root = ""
		}
		if idx := t.index(snap, root, exts, cred); idx != nil {
			positions := make([]int, len(files))
			in := 0
			for i, e := range files {
				positions[i] = -1
				if x, ok := idx.at(e); ok {
					positions[i] = int(x)
					in++
				}
			}
			if 4*in >= 3*len(files) {
				return idx, positions
			}
		}
		if root == "" {
			return nil, nil
		}
		dir = path.Dir(dir)
	}
}

// index returns the ImageFolder index of root with exts as cred may read
// it, from a small cache; nil if root is not an ImageFolder.
func (t *Tracker) index(snap *catalog.Snapshot, root string, exts []string, cred access.Cred) *indexed {
	key := strings.Join(exts, ",")
	view := fmt.Sprint(cred.Uid, cred.Gid, cred.Groups)
	for i, c := range t.cache {
		if c.snap == snap && c.root == root && c.exts == key && c.view == view {
			t.cache = append(append([]*indexed{c}, t.cache[:i]...), t.cache[i+1:]...)
			return c
		}
	}
	samples, err := t.cfg.Index(root, exts, cred)
	if err != nil || len(samples) == 0 {
		return nil
	}
	var top uint64
	for _, s := range samples {
		if s.Entry != nil {
			top = max(top, s.Entry.Ino)
		}
	}
	c := &indexed{snap: snap, root: root, exts: key, view: view, n: len(samples), pos: make([]int32, top+1)}
	for i := range c.pos {
		c.pos[i] = -1
	}
	for i, s := range samples {
		if s.Entry != nil && c.pos[s.Entry.Ino] < 0 {
			c.pos[s.Entry.Ino] = int32(i)
		}
	}
	t.cache = append([]*indexed{c}, t.cache...)
	if len(t.cache) > 4 {
		t.cache = t.cache[:4]
	}
	return c
}
