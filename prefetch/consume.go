package prefetch

import (
	"time"

	"github.com/dlfs/dlfs/catalog"
)

// rateWindow is the window over which a stream's consumption rate is
// measured.
const rateWindow = time.Second

// ObserveRead records a demand read of e at off by user uid that waited
// this long on the PFS (0 when a tier or the stage had it). It moves only
// the streams of jobs whose Owner.Reads(uid, known): another user's reads
// never move a job's cursor. known is false for a reader without a pid
// (another pid namespace).
func (p *Prefetcher) ObserveRead(uid uint32, known bool, e *catalog.Entry, off int64, waited time.Duration) {
	p.stage.readThrough(e.Ino)
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
	if p.stage.wasPushed(e.Ino) {
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
			s.at.Store(int64(s.cursor))
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
	s.at.Store(int64(s.cursor))
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

// NextUse is the tiers' oracle (see Oracle.NextUse). It takes no lock.
func (p *Prefetcher) NextUse(ino uint64) int64 { return p.oracle.NextUse(ino) }
