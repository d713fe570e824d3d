package readers

import (
	"context"
	"fmt"
	"path"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/dlfs/dlfs/access"
	"github.com/dlfs/dlfs/catalog"
)

// The judge: the goroutine that looks at the streams' new files off the
// read path, hands them to their inferred jobs, and judges the rest (a
// pattern, or a search for a torch order) in the index that holds them.

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
