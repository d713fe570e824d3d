// Package readers follows the processes that read the mount without
// announcing a job, and announces for them what their reads show.
//
// # Streams
//
// Every FUSE read carries the caller's pid. A stream is a reader process
// with its workers: a process whose parent has the same command line (a
// forked DataLoader worker) or that multiprocessing started belongs to its
// parent's stream. The pid → stream map is filled from /proc on a pid's
// first read and bounded. Each stream keeps its counters and a ring of the
// files it read first, most recent last.
//
// # Inference
//
// A goroutine owned by the Tracker judges the streams off the read path.
// It places a stream's recent files in the ImageFolder index of the
// deepest directory above them whose index holds them (with the
// extensions the stream read), and calls the pattern (Detect):
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
//     scan's.
//
// Only streams whose reads wait on the PFS (a quarter of them or more) are
// judged: a stream the caches already serve has nothing to gain.
//
// An inferred job may fetch only a bounded distance ahead: Ahead starts at
// MinAhead samples and doubles with every confirmed read, so a guess that
// later reads contradict costs at most max(MinAhead, 2×confirmed)
// samples of prefetch; it is ended at the first judgement that contradicts
// it. While any job has been announced, nothing is inferred.
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

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
	"github.com/dlfs/dlfs/sampler"
)

// Config configures a Tracker.
type Config struct {
	ProcRoot   string        // default "/proc"
	History    int           // files remembered per stream; default 64
	MaxStreams int           // default 256
	MaxPids    int           // pid → stream entries kept; default 8192
	Interval   time.Duration // how often streams are judged; default 100 ms
	Idle       time.Duration // a stream with no read for this long is dropped; default 2 min
	// Snapshot returns the catalog's current snapshot.
	Snapshot func() *catalog.Snapshot
	// Index builds the ImageFolder index of root (relative to the mount)
	// with the given extensions.
	Index func(root string, exts []string) ([]folder.Sample, error)
	// Jobs registers, moves and ends inferred jobs.
	Jobs   Jobs
	Logger *slog.Logger // nil: discard
}

// Jobs is what the Tracker needs of the job registry.
type Jobs interface {
	// ApplyInferred registers or updates an inferred job.
	ApplyInferred(line control.Job) error
	// End drops a job.
	End(name string) error
	// SetAhead bounds how many samples the prefetcher may fetch ahead of
	// a job's readers (0: no bound).
	SetAhead(name string, n int)
	// Announced reports whether any job was announced (not inferred).
	Announced() bool
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
	Pid   int   `json:"pid"`
	Reads int64 `json:"reads"`
	Hits  int64 `json:"hits"` // reads that did not wait on the PFS
	Files int64 `json:"files"`
	// ReadSeconds is the time dlfs took to serve the stream's reads, and
	// Sources splits reads and that time by the tier that served them.
	ReadSeconds float64               `json:"read_seconds"`
	Sources     map[string]SourceTime `json:"sources,omitempty"`
	// LastRead is when dlfs last served it.
	LastRead time.Time `json:"last_read"`
	Pattern  string    `json:"pattern"` // "", "sequential", "strided W+R", "random"
	Job      string    `json:"job,omitempty"`
	Root     string    `json:"root,omitempty"`
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
	pids    map[int]pidEntry
	streams map[int]*stream
	kick    chan struct{}

	ending []string // inferred jobs of dropped streams, ended by the judge (mu)

	cache []*indexed // recent indexes, most recent first; the judge's own

	searching bool              // the judge's: a search is running
	found     chan searchResult // a search's outcome, to the judge

	cancel context.CancelFunc
	wg     sync.WaitGroup
	judged atomic.Int64 // judgements made (for tests)
}

type pidEntry struct {
	stream int
	seen   time.Time
}

// stream is one reader process and its workers.
type stream struct {
	pid      int
	stats    StreamStats
	ring     []*catalog.Entry // first reads of files, oldest first once full
	next     int              // where the next file goes in ring
	fresh    int              // files read since the last judgement
	last     time.Time
	quiet    int // new files to wait before judging again
	inferred *inference
	first    []*catalog.Entry // its first SearchReads files, for the search of a torch order (mu)
	searched bool             // the judge's: first was searched
	searches int              // the judge's: searches run for this stream
}

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
}

// planOf is the rank's order in epoch e, as index position -> position
// (4 bytes per sample), for a torch order; nil for a scan, whose positions
// are arithmetic (planned).
func (inf *inference) planOf(e int) []int32 {
	if inf.pattern.Kind != "torch" {
		return nil
	}
	n := inf.idx.n
	g := inf.guess
	order := sampler.Distributed{N: n, World: g.World, Rank: g.Rank, Shuffle: true, Seed: g.Seed}.Epoch(e)
	if inf.random {
		order = sampler.Random{N: n, Seed: g.Seed}.Epoch(e)
	}
	return positions(order, n)
}

// randomPlan is RandomSampler's order in epoch e, as planOf gives it.
func (inf *inference) randomPlan(e int) []int32 {
	return positions(sampler.Random{N: inf.idx.n, Seed: inf.guess.Seed}.Epoch(e), inf.idx.n)
}

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
	g := inf.guess
	return sampler.Distributed{N: n, World: g.World, Shuffle: true}.NumSamples()
}

// indexed is an ImageFolder index and its positions by file: 4 bytes per
// inode number of the catalog (40 MB at 10 M files).
type indexed struct {
	snap *catalog.Snapshot
	root string
	exts string
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
	return &Tracker{cfg: cfg, log: cfg.Logger, pids: map[int]pidEntry{}, streams: map[int]*stream{}, kick: make(chan struct{}, 1),
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
// source (the tier) in took; waited says it waited on the PFS. It never
// blocks on more than reading /proc for a pid's first read.
func (t *Tracker) Observe(pid uint32, e *catalog.Entry, off int64, waited bool, source string, took time.Duration) {
	if pid == 0 || e == nil {
		return
	}
	key := t.streamOf(int(pid))
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.streams[key]
	if s == nil {
		if len(t.streams) >= t.cfg.MaxStreams {
			return // the judge drops idle streams; until then, this one is not followed
		}
		s = &stream{pid: key, ring: make([]*catalog.Entry, 0, t.cfg.History), stats: StreamStats{Pid: key}}
		t.streams[key] = s
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
		return
	}
	s.stats.Files++
	if len(s.ring) < cap(s.ring) {
		s.ring = append(s.ring, e)
	} else {
		s.ring[s.next] = e
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
}

// Stream returns the figures of the stream whose reading process is pid
// (a stream is keyed by its top process: a DataLoader's main process, not
// its workers).
func (t *Tracker) Stream(pid int) (StreamStats, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.streams[pid]
	if s == nil {
		return StreamStats{}, false
	}
	return s.statsLocked(), true
}

// statsLocked copies the stream's figures, its map too.
func (s *stream) statsLocked() StreamStats {
	st := s.stats
	st.Sources = maps.Clone(st.Sources)
	return st
}

// streamOf returns the stream a pid reads for: the pid of the highest
// ancestor of which it is a worker.
func (t *Tracker) streamOf(pid int) int {
	now := time.Now()
	t.mu.Lock()
	if p, ok := t.pids[pid]; ok {
		p.seen = now
		t.pids[pid] = p
		t.mu.Unlock()
		return p.stream
	}
	t.mu.Unlock()
	key := pid
	info, err := readProc(t.cfg.ProcRoot, pid)
	if err == nil {
		key = info.tgid // a thread reads for its process
	}
	for hops := 0; err == nil && info.ppid > 1 && hops < 8; hops++ {
		parent, perr := readProc(t.cfg.ProcRoot, info.ppid)
		if perr != nil || !isWorkerOf(info.cmdline, parent.cmdline) {
			break
		}
		key, info = parent.tgid, parent
	}
	t.mu.Lock()
	defer t.mu.Unlock()
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
	t.pids[pid] = pidEntry{stream: key, seen: now}
	return key
}

// forgetLocked drops s. Only the judge calls it (s's inference is the
// judge's); its inferred job is ended after the lock is released.
func (t *Tracker) forgetLocked(s *stream) {
	delete(t.streams, s.pid)
	if s.inferred != nil {
		t.ending = append(t.ending, s.inferred.job)
	}
}

// endDropped ends the inferred jobs of dropped streams.
func (t *Tracker) endDropped() {
	t.mu.Lock()
	jobs := t.ending
	t.ending = nil
	t.mu.Unlock()
	for _, j := range jobs {
		if err := t.cfg.Jobs.End(j); err != nil {
			t.log.Debug("readers: ending a dropped stream's job", "job", j, "err", err)
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
func (s *stream) recentLocked() []*catalog.Entry {
	return append(append([]*catalog.Entry(nil), s.ring[s.next:]...), s.ring[:s.next]...)
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
		files []*catalog.Entry // the ring, oldest first
		fresh int
	}
	var todo []work
	now := time.Now()
	t.mu.Lock()
	for _, s := range t.streams {
		if now.Sub(s.last) > t.cfg.Idle {
			t.forgetLocked(s)
			continue
		}
		if s.fresh == 0 || (s.inferred == nil && s.fresh < MinEvidence && len(s.ring) < MinEvidence) {
			continue
		}
		todo = append(todo, work{s, s.recentLocked(), s.fresh})
		s.fresh = 0
	}
	t.mu.Unlock()
	t.endDropped()
	for _, w := range todo {
		t.judge(ctx, w.s, w.files, w.fresh)
	}
}

// judge looks at a stream's files (oldest first; the last fresh of them
// are new since the last judgement) and infers, follows or drops its job.
// Only the judge goroutine calls it; s's inference fields are its own, and
// only stats and ring are shared with Observe.
func (t *Tracker) judge(ctx context.Context, s *stream, files []*catalog.Entry, fresh int) {
	defer t.judged.Add(1)
	if inf := s.inferred; inf != nil {
		// Files the ring dropped before the judge saw them let the reader
		// move that much further.
		t.follow(s, inf, files[max(len(files)-fresh, 0):], max(fresh-len(files), 0))
		return
	}
	if s.quiet > 0 {
		s.quiet = max(s.quiet-fresh, 0)
		return
	}
	if t.cfg.Jobs.Announced() {
		return
	}
	// A stream whose reads rarely wait on the PFS has nothing to gain:
	// leave it (and the CPU a search costs) alone.
	t.mu.Lock()
	waiting := 4*(s.stats.Reads-s.stats.Hits) >= s.stats.Reads
	t.mu.Unlock()
	if !waiting {
		return
	}
	idx, positions := t.place(files)
	if idx == nil {
		return
	}
	p, ok := Detect(positions, idx.n)
	if ok {
		t.setPattern(s, p.String(), idx.root, "")
		if p.Kind != "random" {
			t.infer(s, idx, p, Guess{}, files)
			return
		}
		s.quiet = cooldown
	}
	t.search(ctx, s)
}

// searchResult is a search's outcome for a stream.
type searchResult struct {
	s     *stream
	idx   *indexed
	guess Guess
	ok    bool
}

// search starts, once per stream and one at a time, the search for the
// torch order that explains the stream's first files.
func (t *Tracker) search(ctx context.Context, s *stream) {
	t.mu.Lock()
	first := append([]*catalog.Entry(nil), s.first...)
	t.mu.Unlock()
	if s.searched || t.searching || len(first) < SearchReads || s.searches >= maxSearches {
		return
	}
	idx, positions := t.place(first)
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
		t.log.Debug("readers: searched a torch order", "stream", s.pid, "found", ok, "seconds", time.Since(start).Seconds())
		select {
		case t.found <- searchResult{s, idx, g, ok}:
		case <-ctx.Done():
		}
	}()
}

// searched infers the job a search found, if its stream still reads and
// has no other.
func (t *Tracker) searched(r searchResult) {
	t.mu.Lock()
	alive := t.streams[r.s.pid] == r.s
	files := r.s.recentLocked()
	t.mu.Unlock()
	if !r.ok || !alive || r.s.inferred != nil || t.cfg.Jobs.Announced() || r.idx.snap != t.cfg.Snapshot() {
		return
	}
	t.infer(r.s, r.idx, Pattern{Kind: "torch", Stride: 1}, r.guess, files)
}

func (t *Tracker) setPattern(s *stream, pattern, root, job string) {
	t.mu.Lock()
	s.stats.Pattern, s.stats.Root, s.stats.Job = pattern, root, job
	t.mu.Unlock()
}

// infer registers the job that pattern p in idx implies for s.
func (t *Tracker) infer(s *stream, idx *indexed, p Pattern, guess Guess, files []*catalog.Entry) {
	t.mu.Lock()
	n := 0
	for _, o := range t.streams {
		if o.inferred != nil {
			n++
		}
	}
	t.mu.Unlock()
	if n >= MaxInferred || strings.ContainsAny(idx.root+idx.exts, " \t\n") {
		return
	}
	root := idx.root
	if root == "" {
		root = "."
	}
	name := fmt.Sprintf("auto-%d", s.pid)
	text := fmt.Sprintf("job=%s root=%s dataset=imagefolder extensions=%s epoch=0 lookahead=2 batch=32 workers=4", name, root, idx.exts)
	switch p.Kind {
	case "sequential":
		text += " sampler=sequential"
	case "strided":
		text += fmt.Sprintf(" sampler=distributed shuffle=false world=%d ranks=%d", p.Stride, p.Rank)
	default:
		text += fmt.Sprintf(" sampler=distributed shuffle=true seed=%d world=%d ranks=%d", guess.Seed, guess.World, guess.Rank)
	}
	cmds, err := control.Parse([]byte(text))
	if err != nil || len(cmds) != 1 {
		t.log.Warn("readers: cannot express the inferred job", "line", text, "err", err)
		return
	}
	line := cmds[0].(control.Job)
	t.cfg.Jobs.SetAhead(name, MinAhead)
	if err := t.cfg.Jobs.ApplyInferred(line); err != nil {
		t.log.Info("readers: inferred job refused", "stream", s.pid, "line", text, "err", err)
		s.quiet = cooldown
		return
	}
	t.cfg.Jobs.SetAhead(name, MinAhead)
	inf := &inference{job: name, line: line, idx: idx, pattern: p, guess: guess, ahead: MinAhead, high: -1}
	inf.plan, inf.length = inf.planOf(0), inf.epochLength()
	for _, e := range files {
		if x, ok := idx.at(e); ok {
			if q, ok := inf.planned(inf.plan, x); ok {
				inf.high = max(inf.high, q)
				inf.recent = append(inf.recent, q)
			}
		}
	}
	s.inferred = inf
	pattern := p.String()
	if p.Kind == "torch" {
		pattern = fmt.Sprintf("torch seed=%d world=%d rank=%d", guess.Seed, guess.World, guess.Rank)
	}
	t.setPattern(s, pattern, idx.root, name)
	t.log.Info("readers: inferred a job", "stream", s.pid, "pattern", pattern, "root", root, "job", name)
}

// follow checks an inferred job against the stream's new files (unseen
// more were read before them that the ring no longer holds): a file
// outside the plan's window ends it; a reader that reaches the next
// epoch's first samples moves it to the next epoch; confirmed reads widen
// how far it may fetch ahead.
func (t *Tracker) follow(s *stream, inf *inference, files []*catalog.Entry, unseen int) {
	if inf.idx.snap != t.cfg.Snapshot() {
		t.drop(s, inf, "the catalog changed")
		return
	}
	bad := 0
	w := min(maxWindow, max(inf.length/4, 1))
	for _, e := range files {
		x, ok := inf.idx.at(e)
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
				inf.line = next
			}
			if err := t.cfg.Jobs.ApplyInferred(next); err != nil {
				t.drop(s, inf, "moving it to the next epoch failed: "+err.Error())
				return
			}
		}
		// Within reach of the furthest read so far.
		if u < 0 || u < inf.high-w || u > inf.high+w+unseen {
			bad++
			continue
		}
		inf.high = max(inf.high, u)
		inf.confirmed++
		inf.recent = append(inf.recent, u)
	}
	if over := len(inf.recent) - t.cfg.History; over > 0 {
		inf.recent = append(inf.recent[:0], inf.recent[over:]...)
	}
	if 4*bad > len(files) && bad > 2 {
		t.drop(s, inf, fmt.Sprintf("%d of %d new files are off the plan", bad, len(files)))
		return
	}
	if len(inf.recent) >= t.cfg.History/2 {
		// Unwrapped positions run on past the epoch: no index bounds them.
		if p, ok := Detect(inf.recent, math.MaxInt32); ok && p.Kind != "sequential" {
			t.drop(s, inf, "the recent reads are "+p.String()+" in the plan's order")
			return
		}
	}
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

// drop ends s's inferred job.
func (t *Tracker) drop(s *stream, inf *inference, why string) {
	if err := t.cfg.Jobs.End(inf.job); err != nil {
		t.log.Debug("readers: ending an inferred job", "job", inf.job, "err", err)
	}
	s.inferred = nil
	s.quiet = cooldown
	// The files after a wrong guess may start an epoch of another order
	// (a RandomSampler's next epoch, a new seed): search them too.
	s.searched = false
	t.mu.Lock()
	s.first = s.first[:0]
	t.mu.Unlock()
	t.setPattern(s, "random", inf.idx.root, "")
	t.log.Info("readers: dropped an inferred job", "stream", s.pid, "job", inf.job, "why", why)
}

// place finds the index that holds files: the ImageFolder index, with the
// extensions the files have, of the deepest directory above them that
// holds three quarters of them; and returns each file's position in it
// (−1: not there).
func (t *Tracker) place(files []*catalog.Entry) (*indexed, []int) {
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
		if idx := t.index(snap, root, exts); idx != nil {
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

// index returns the ImageFolder index of root with exts, from a small
// cache; nil if root is not an ImageFolder.
func (t *Tracker) index(snap *catalog.Snapshot, root string, exts []string) *indexed {
	key := strings.Join(exts, ",")
	for i, c := range t.cache {
		if c.snap == snap && c.root == root && c.exts == key {
			t.cache = append(append([]*indexed{c}, t.cache[:i]...), t.cache[i+1:]...)
			return c
		}
	}
	samples, err := t.cfg.Index(root, exts)
	if err != nil || len(samples) == 0 {
		return nil
	}
	var top uint64
	for _, s := range samples {
		if s.Entry != nil {
			top = max(top, s.Entry.Ino)
		}
	}
	c := &indexed{snap: snap, root: root, exts: key, n: len(samples), pos: make([]int32, top+1)}
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
