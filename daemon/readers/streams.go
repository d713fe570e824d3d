package readers

import (
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/dlfs/dlfs/access"
	"github.com/dlfs/dlfs/catalog"
)

// Process tracking: which stream a read's thread belongs to (from /proc,
// rechecked), each stream's counters and ring of first reads, a full
// table shared between users, and the streams whose processes exited.

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
