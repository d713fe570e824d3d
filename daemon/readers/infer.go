package readers

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/jobs"
)

// Inferred jobs: the job line a pattern implies, registered and followed
// as the reader moves through its plan (next epochs, the loader's shape,
// how far it may fetch ahead), and dropped when reads contradict it.

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
	// back says its reader left it idle (idle) and has not been followed
	// since: it may come back at the next epoch's start (a validation
	// pass after a training epoch) without having been seen near the end
	// of this one, whose last reads the stream's ring may have lost.
	back bool
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
	inf.confirmed, inf.back = 0, true
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
	w := window(inf.length, inf.line)
	for _, r := range files {
		x, ok := inf.idx.at(r.e)
		if !ok {
			bad++
			continue
		}
		base := inf.epoch * inf.length
		if (inf.high-base >= inf.length-w || inf.back) && !inf.nearEnd {
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
			// The reader has passed the last epoch's end, whether or not
			// its last reads were seen (back from idle).
			inf.high = max(inf.high, inf.epoch*inf.length-1)
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
	inf.back = false
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

// window is how far, in positions, a read of an inferred job with an
// epoch of length positions may land from the furthest read so far: a
// quarter of the epoch, at most maxWindow, and at least what its loader
// (once its shape is known) has in flight: prefetch_factor (2) batches
// per worker and the batch being read. A validation pass of 200 files
// read by 2 workers in batches of 16 has 64 in flight, more than its
// quarter: its job was dropped, its files "off the plan".
func window(length int, line control.Job) int {
	w := min(maxWindow, max(length/4, 1))
	if line.Set["batch"] && line.Batch > 0 {
		w = max(w, min(maxWindow, (2*max(line.Workers, 1)+1)*line.Batch))
	}
	return w
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
