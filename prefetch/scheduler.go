package prefetch

import (
	"context"
	"math"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/loader/runs"
	"github.com/dlfs/dlfs/ramcache"
)

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
		if p.stage.busy(e.Ino) {
			s.frontier++
			skipped = true // no fetch to finish, so no kick
			continue
		}
		held := p.stage.held()
		if e.Size > p.cfg.Staging {
			// Larger than the stage: fetch its head, as much as the stage
			// has room for; its reader reads the rest through the tiers.
			room := (p.cfg.Staging - held) / p.cfg.BlockSize * p.cfg.BlockSize
			if room <= 0 {
				return nil // wait for reads
			}
			s.frontier++
			p.stage.reserve(e.Ino, room)
			return []*catalog.Entry{e}
		}
		need := e.Size
		if p.cfg.Staged != nil && p.cfg.Backs != nil && p.cfg.Backs(e) {
			// Room for its backing file beside it, and for those of the
			// staged files that have none yet (Config.Staged).
			need *= 2
			held += p.stage.unbacked()
		}
		if held+need > p.cfg.Staging && held > 0 {
			return nil // the stage is full: wait for reads
		}
		s.frontier++
		group := []*catalog.Entry{e}
		if s.packed != nil && s.packed[pos] {
			group = p.neighboursLocked(s, pos, gap, run)
		}
		for _, g := range group {
			p.stage.reserve(g.Ino, g.Size)
		}
		return group
	}
}

// neighboursLocked returns the sample at pos together with its neighbours
// in its container that a plan needs soon (within the caches' horizon)
// and that nothing has fetched: a run read in one request (runs.Grow).
// The run reads through unneeded bytes (samples already cached, staged,
// pushed or consumed) of at most gap in a row and 1/256 of the samples it joined
// in all (the PFS reads each byte once an epoch, within 1%, and other
// causes take some of that), stops at a
// sample needed later than the horizon, spans at most run bytes, and fits
// in what staging has left plus an eighth where a RAM tier can take what
// the stage refuses. The sample at pos comes first;
// the rest follow in offset order.
//
// The horizon is as many samples of this one's size as the stage and
// half the RAM tier hold together (RAM holds more than neighbours: what
// readers read, with its overhead; a horizon of all of it read an HDF5
// file's rows 1.04x with a RAM tier of an eighth of the file). A neighbour needed within what the stage holds
// goes to the stage, which keeps it until it is read; one needed later,
// or with no room on the stage, to RAM, which keeps what is needed
// soonest (keep): one needed within the horizon stays cached until its
// turn, and the stage stays free for the frontier. One needed later would be evicted before it, and the PFS would
// serve it again: a random order over one HDF5 file read its rows 1.67x
// when runs joined every neighbour a plan needed, with a RAM tier of an
// eighth of the file.
func (p *Prefetcher) neighboursLocked(s *stream, pos int, gap, run int64) []*catalog.Entry {
	list := s.runs[s.spans[pos].Container]
	size := max(s.entry(pos).Size, 1)
	// Neighbours the stage has no room for go to RAM, so they may borrow
	// an eighth of staging beyond what is free, if there is a RAM tier.
	budget := p.cfg.Staging - p.stage.held() - size
	if p.cfg.RAM > 0 {
		budget += p.cfg.Staging / 8
	}
	reach := horizon(p.cfg.Staging+p.cfg.RAM/2, size)
	joined, holes := size, int64(0)
	take := func(j int) runs.Take {
		e := s.entry(int(list[j]))
		switch {
		case p.stage.busy(e.Ino) || p.stage.pushBusy(e.Ino) || !p.neededLocked(e.Ino, false):
			// Staged, being fetched, pushed into the page cache (its read
			// will not reach dlfs: fetched again, it would be dropped
			// unread), or not needed.
			if holes+e.Size > joined/256 {
				return runs.Stop // reading through it would cost over 0.4% more bytes
			}
			holes += e.Size
			return runs.Skip // read through it if the next wanted one is near enough
		case !p.soonLocked(e.Ino, reach), e.Size > budget:
			return runs.Stop
		}
		budget -= e.Size
		joined += e.Size
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

// horizon is how many samples of size bytes hold bytes: how many steps
// ahead of the frontier a cache of that many bytes can keep them.
func horizon(bytes, size int64) int {
	return int(min(bytes/max(size, 1), math.MaxInt32))
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
			return p.keep(e, loader.BlockKey(e.Path(), i), b, e != group[0])
		}
		var run map[uint64]bool
		if len(group) > 1 {
			var err error
			if run, err = p.load.PrefetchRun(ctx, group[0], group[1:], keep); err != nil {
				p.log.Warn("prefetch: coalesced read failed; fetching one by one", "samples", len(group), "err", err)
			}
		}
		for _, e := range group {
			staged, err, whole := 0, error(nil), true
			if took, ok := run[e.Ino]; ok {
				if took {
					staged = 1
				}
			} else if head := p.stage.reserved(e.Ino); head < e.Size {
				staged, err = p.fetchHead(ctx, e, head)
				whole = false
			} else {
				staged, err = p.load.Prefetch(ctx, e, keep)
			}
			p.finish(e, staged, err)
			if whole && staged > 0 && err == nil && p.cfg.Staged != nil {
				p.cfg.Staged(e)
			}
		}
		p.kick()
	}
}

// fetchHead fetches the first head bytes of e, a sample larger than the
// stage, into the stage: the fetch stops at the first block past head,
// or at the first the stage refuses (its reader consumed it meanwhile);
// the loader reads at most two blocks more, which are dropped. The
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
		if !p.keep(e, loader.BlockKey(e.Path(), i), b, false) {
			// Consumed or no longer planned meanwhile: no later block of
			// it is kept either, and the reader reads them itself. (A
			// fetch that went on read the whole sample, for nothing.)
			stop()
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

// keep is the loader.Keep of a fetch: it stages block key of e if a plan
// still needs e. A sample fetched as a neighbour in a run may lie past the
// frontier: it is kept if any plan needs it, and if the stage has room
// (its bytes were not reserved).
func (p *Prefetcher) keep(e *catalog.Entry, key string, b ramcache.Block, neighbour bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.neededLocked(e.Ino, !neighbour):
		return false // consumed meanwhile, or no longer planned
	case neighbour && (p.stage.stagedBytes()+int64(len(b.Data)) > p.cfg.Staging ||
		!p.soonLocked(e.Ino, horizon(p.cfg.Staging, e.Size))):
		// Read with a run, and no room on the stage, or needed past what
		// the stage holds (the stage is the frontier's): the loader
		// offers it to RAM, which keeps it if its next use warrants (not
		// counted as wasted: RAM may keep it).
		return false
	case p.stage.add(key, b):
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
	p.stage.release(e.Ino)
	switch {
	case err != nil:
		p.totals.Errors++
		p.log.Warn("prefetch: fetch failed; the read will try again", "path", e.Path(), "err", err)
	case staged > 0:
		p.totals.Fetched++
	}
}
