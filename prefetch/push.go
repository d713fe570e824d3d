package prefetch

import (
	"context"

	"github.com/dlfs/dlfs/catalog"
)

// # Pushing
//
// With a Pusher (Config.Pusher: the filesystem), once StartPushing is
// called (the daemon calls it once the filesystem is mounted), the
// prefetcher writes the samples it holds into the kernel's page cache
// ahead of their reads, in
// the order the reader will ask for them: a pushed sample is read at
// page-cache speed, with no round trip to the daemon. A pushed sample
// leaves the stage (the kernel has its bytes; RAM keeps it if its next use
// warrants), but its bytes stay counted against Config.Staging until the
// stream's cursor passes it, so the stage and what was pushed ahead of the
// reader together never exceed Staging. Samples the RAM tier holds are
// pushed too, under the same bound.
//
// Only announced jobs are pushed for: package readers infers a job, and
// keeps following it, from the reads that reach dlfs. Only samples of one
// block are pushed: pushing saves a round trip per read, which is what a
// small sample's read costs, while a larger one is read at bandwidth from
// the stage and read-ahead. Pushed, a larger one was copied once more and
// its reads came back to the PFS: announced scans of 32 MiB samples (zoo
// suite) took 3.7 s and read 1.64x their bytes from the PFS with pushing,
// 2.4 s and 1.10x without; .npz files of 1 MiB + 498 B, 1.07 s and 0.85 s.
//
// Reads the page cache serves never reach the daemon, so the cursor would
// stall and, with it, the bound. One sample in every pushTrip steps is
// therefore never pushed: the reader's read of it reaches the daemon (it is
// staged or in RAM, so it is fast), and moves the stream's furthest read,
// from which the cursor follows (see Tracking consumption).
//
// If the kernel evicts a pushed sample before it is read, or refuses a
// store, the read finds the RAM tier, the SSD or the PFS as it would
// without pushing.
//
// A push first asks the kernel whether the page cache holds the file
// whole (an open through the mount and cachestat), and stores nothing if
// so. A file found so is not asked about again until a read of it reaches
// dlfs: in a warm epoch the asking took a third of dlfs's CPU.

// pushTrip: every pushTrip-th step of a stream's schedule is not pushed.
const pushTrip = 32

// pushBatch is how many samples a push loop takes per round.
const pushBatch = 64

// pushWorkers is how many push loops run: a store copies the sample into
// freshly allocated pages, and one loop on one core falls behind a reader
// of the page cache.
const pushWorkers = 2

// Pusher writes a file's bytes into the kernel's page cache (fusefs.FS).
type Pusher interface {
	// Push stores e's bytes: block i (of blockSize bytes) comes from
	// block(i). It returns the bytes stored, 0 if the page cache held e
	// whole already; an error if the kernel refused.
	Push(e *catalog.Entry, blockSize int64, block func(i int64) ([]byte, bool)) (int64, error)
}

// StartPushing starts pushing through Config.Pusher: a push before the
// filesystem is mounted would only fail. Without a Pusher it does
// nothing. Safe to call while the prefetcher runs, and twice; it does not
// block.
func (p *Prefetcher) StartPushing() {
	if p.cfg.Pusher == nil || p.pushing.Swap(true) {
		return
	}
	p.kick()
}

// push runs a push loop until ctx ends.
func (p *Prefetcher) push(ctx context.Context) {
	defer p.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.pushWake:
		}
		for ctx.Err() == nil {
			if !p.pushing.Load() {
				break
			}
			batch := p.pushable(pushBatch)
			if len(batch) == 0 {
				break
			}
			if len(batch) == pushBatch {
				select { // there may be more: wake another loop
				case p.pushWake <- struct{}{}:
				default:
				}
			}
			for _, e := range batch {
				block := func(i int64) ([]byte, bool) {
					b, _, ok := p.load.Cached(e, i)
					return b, ok
				}
				n, err := p.cfg.Pusher.Push(e, p.cfg.BlockSize, block)
				for _, b := range p.pushed(e, n, err) {
					p.load.Offer(b.key, b.Block)
				}
			}
		}
	}
}

// pushable returns up to limit samples to push next, in each stream's
// schedule order from its cursor, and reserves their bytes. A stream stops
// at a sample still being fetched, and at the staging bound.
func (p *Prefetcher) pushable(limit int) []*catalog.Entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*catalog.Entry
	for _, s := range p.streams {
		if s.cursor >= s.len() || s.job.Inferred {
			continue // an inferred job is followed by the reads it makes: they must reach dlfs
		}
		s.pushStep = max(s.pushStep, s.order.step(s.cursor))
		for ; s.pushStep < s.frontier && len(out) < limit; s.pushStep++ {
			pos := s.order.at(s.pushStep)
			if s.pushStep%pushTrip == pushTrip-1 || s.consumed.get(pos) {
				continue
			}
			e := s.entry(pos)
			if e == nil || e.Size <= 0 || e.Size > p.cfg.BlockSize || p.stage.pushBusy(e.Ino) || s.pending(e.Ino) != pos {
				// Nothing to push; more than a block (see Pushing);
				// pushed or being pushed; or read earlier at a position
				// still to come, perhaps a trip (the window reaches into
				// the next epoch).
				continue
			}
			if p.tripLocked(e.Ino) || p.stage.isPageCached(e.Ino) {
				// A trip; or found in the page cache by an earlier push,
				// and read from it since (a read through dlfs forgets it):
				// a warm epoch opens no file to probe it again.
				continue
			}
			if p.stage.reserved(e.Ino) > 0 {
				break // wait for its fetch
			}
			var reserve int64
			if !p.stage.has(e.Ino) { // from RAM or the SSD: new bytes against the bound
				if p.stage.held()+e.Size > p.cfg.Staging {
					break
				}
				reserve = e.Size
			}
			p.stage.reservePush(e.Ino, reserve)
			out = append(out, e)
		}
	}
	return out
}

// tripLocked reports whether ino is a trip sample of some stream: the
// next read of it that stream expects falls on a trip step. Another
// stream (another rank, or the same one in another epoch) must not push
// it either, or that read would be a page-cache hit and the stream would
// never see where its reader is.
func (p *Prefetcher) tripLocked(ino uint64) bool {
	for _, t := range p.streams {
		if q := t.pending(ino); q >= 0 && t.order.step(q)%pushTrip == pushTrip-1 {
			return true
		}
	}
	return false
}

// pushed records the outcome of pushing e (n bytes stored, or err) and
// returns the blocks it took off the stage, for the caller to offer RAM
// without mu.
func (p *Prefetcher) pushed(e *catalog.Entry, n int64, err error) []stagedBlock {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stage.pushDone(e.Ino)
	if err != nil {
		if p.totals.PushFailed++; p.totals.PushFailed == 1 {
			p.log.Info("prefetch: a push into the page cache failed; its read goes through dlfs (logged once)", "err", err)
		}
		return nil
	}
	if !p.neededLocked(e.Ino, false) {
		return nil // read meanwhile
	}
	if n == 0 {
		p.totals.PushCached++
		p.stage.markPageCached(e.Ino)
	} else {
		p.totals.Pushed++
		p.totals.PushedBytes += n
	}
	out := p.stage.removeFile(e, p.cfg.BlockSize)
	p.stage.markPushed(e.Ino, e.Size)
	if st := p.statsOfLocked(e.Ino, nil); st != nil {
		st.Pushed++
	}
	return out
}

// releasePushedLocked stops counting e's pushed bytes: its read is behind
// the cursor.
func (p *Prefetcher) releasePushedLocked(e *catalog.Entry) {
	if e == nil {
		return
	}
	p.stage.releasePushed(e.Ino)
}

// dropUnneededPushedLocked stops counting what was pushed for samples no
// stream will read soon (the plans changed): a stream that kept its plan
// keeps its pushes counted until its cursor passes them; a new plan, which
// may need a sample only late, does not inherit them. The kernel's page
// cache may hold them a while longer; it is the kernel's to reclaim.
func (p *Prefetcher) dropUnneededPushedLocked() {
	p.stage.dropPushedIf(func(ino uint64) bool { return !p.neededLocked(ino, true) })
}
