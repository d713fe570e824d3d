package loader

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/ramcache"
)

// Read-ahead within a file.
//
// A reader moving forward through a file of more than one block gets the
// blocks after its read fetched ahead of it, in parallel, into a buffer
// of the loader's own. Not into RAM: RAM's policy decides what stays
// there, and a large file read once an epoch must not push out what is
// read again; the buffer only bridges the time between a fetch and the
// read it anticipates.
//
// A stream is one file's reader, kept by path (at most readAheadStreams;
// a new one takes the slot of the least recently read). A read that ends
// at most one block past the stream's furthest read, and starts no more
// than a window behind it, goes on with the stream (the kernel sends a
// reader's requests out of order); any other read turns it away: its
// blocks not yet read are dropped, counted as wasted, and it starts
// again from that read with no window. The window, in blocks, opens at
// one with a read of the file's head or the stream's next read forward,
// doubles with every read forward, and stops at the depth that keeps
// the PFS busy for one reader: 1 + its fitted latency over the time of
// one block at its fitted bandwidth, at least 2, at most
// Config.ReadAhead bytes. So a random reader (HDF5 rows, Parquet row
// groups) wastes at most one block each time two of its reads happen to
// be adjacent, and one per file it opens at the head.
//
// The blocks of the window not held, cached or fetched are fetched each
// by a goroutine of the loader, through the same flights as demand reads
// and prefetches (a block is never fetched twice at once), from whichever
// tier has them. Their bytes, held and in flight, stay within
// Config.ReadAheadTotal: past it a fetch is not started. A read takes a
// block off the buffer when it reaches the block's end, and offers it to
// RAM as a staged block is offered. A block fetched ahead is checked
// against its sum when taken, and its tag binds the file's version: a
// file changed meanwhile misses it and fails or reads anew, never mixes.

// readAheadStreams bounds the files followed at once.
const readAheadStreams = 256

// readAhead is the loader's read-ahead state (see above).
type readAhead struct {
	mu      sync.Mutex
	streams map[string]*stream // by path
	clock   uint64             // (mu) ticks per read, for the least recently read
	held    int64              // (mu) bytes held or reserved for fetches in flight
	closed  bool               // (mu) the loader closed: no fetch starts
	running sync.WaitGroup     // fetch goroutines; Add only under mu, before closed

	fetched, used, wasted atomic.Int64 // bytes
}

// stream is one file's forward reader.
type stream struct {
	gen    uint64          // bumped when turned away: older fetches drop their block
	seen   uint64          // clock of its last read
	at     time.Time       // time of its last read
	end    bool            // a read reached the file's last block
	last   int64           // the furthest block a read reached
	next   int64           // the furthest byte a read reached (its end)
	window int64           // blocks fetched ahead of last; 0 until the stream moves forward
	turned bool            // a read turned it away once: with no window, a random reader
	moved  int             // reads forward since it was last turned away
	ahead  int64           // blocks below it are read, held or being fetched
	flying map[int64]int64 // blocks being fetched for it: their sizes
	blocks map[int64]aheadBlock
}

// aheadBlock is a block fetched ahead, with the tier it came from.
type aheadBlock struct {
	b   ramcache.Block
	src tier
}

// ReadAheadStats counts read-ahead within files, in bytes.
type ReadAheadStats struct {
	Fetched int64 `json:"fetched_bytes"` // fetched ahead of readers
	Used    int64 `json:"used_bytes"`    // of them, read
	Wasted  int64 `json:"wasted_bytes"`  // of them, dropped unread (the reader turned away)
	Held    int64 `json:"held_bytes"`    // held or being fetched now
	Streams int   `json:"streams"`       // files followed now
	// Narrow counts the bytes random readers read from the PFS as their
	// own range, not a block (part of fetched.pfs; narrow.go).
	Narrow int64 `json:"narrow_bytes"`
	// Capacity bounds Held (Config.ReadAheadTotal; 0 with read-ahead off),
	// Stream the bytes ahead of one reader (Config.ReadAhead).
	Capacity int64 `json:"capacity_bytes"`
	Stream   int64 `json:"stream_bytes"`
}

// readAheadDepth is how many blocks one stream keeps in flight at most
// (aheadDepth of the PFS's fit).
func (l *Loader) readAheadDepth() int64 {
	lat, perByte := l.model.Fit(srcPFS)
	return aheadDepth(lat.Seconds(), perByte*float64(l.cfg.BlockSize), max(l.cfg.ReadAhead/l.cfg.BlockSize, 1))
}

// aheadDepth is 1 + a source's latency over the time of one block from
// it (seconds each), so that the next block is asked for before the one
// in flight arrives; at least 2, at most most.
func aheadDepth(latency, perBlock float64, most int64) int64 {
	d := most
	if perBlock > 0 {
		d = 1 + int64(math.Ceil(latency/perBlock))
	}
	return min(max(d, 2), most)
}

// readAheadFor moves e's stream with a read of [off, end) and starts the
// fetches its window lacks. It reports whether the reader is random: it
// turned away from where it read before and has not moved forward since
// (narrow.go).
func (l *Loader) readAheadFor(e *catalog.Entry, off, end int64) (random bool) {
	bs := l.cfg.BlockSize
	n := Blocks(e.Size, bs)
	first, last := off/bs, (end-1)/bs
	if n < 2 || l.cfg.NoReadAhead {
		return false
	}
	depth := l.readAheadDepth()
	ra := &l.ahead
	ra.mu.Lock()
	if ra.closed {
		ra.mu.Unlock()
		return false
	}
	ra.clock++
	s := ra.streams[e.Path()]
	switch {
	case s == nil:
		s = ra.newStreamLocked(e.Path())
		s.last, s.ahead, s.next = last, last+1, end
	case last <= s.last+2 && first >= s.last-max(s.window, 1):
		// Onwards (a read may overtake the one before it by a block).
		// A reader turned away once opens no window on one move forward,
		// only on a second in a row, each starting where the reads
		// before it ended (no gap): a random reader's read that crosses
		// into the next block (an HDF5 row across a block boundary, or
		// split by the kernel into two requests), or two rows that
		// happen to lie a block apart, would waste the block fetched
		// after them.
		if last > s.last {
			if s.turned && s.window == 0 && off > s.next {
				s.moved = 0 // a gap: a random reader's rows, not a stream
			}
			s.moved++
			if !s.turned || s.window > 0 || s.moved >= 2 {
				s.window = min(max(2*s.window, 1), depth)
			}
		}
		s.last = max(s.last, last)
		s.ahead = max(s.ahead, s.last+1)
		s.next = max(s.next, end)
		ra.dropBehindLocked(s)
	default:
		// The reader jumped: start again from here. A stream reader
		// (never turned away, or moving forward again) that comes back
		// to the head reads the file anew, a later epoch's pass: it is
		// not taken for a random reader.
		again := off == 0 && (!s.turned || s.window > 0)
		ra.turnLocked(s)
		s.last, s.ahead, s.next = last, last+1, end
		if again {
			s.turned, s.end = false, false
		}
	}
	if off == 0 && s.window == 0 && !s.turned {
		// A read of the head: most readers go on. Not a random reader
		// that comes back to a row at the head, nor one whose read only
		// lies in the first block.
		s.window = 1
	}
	random = s.turned && s.window == 0
	s.seen, s.at = ra.clock, time.Now()
	s.end = s.end || last == n-1
	var want []int64
	ahead := s.aheadLocked()
	for ; s.ahead <= min(s.last+s.window, n-1); s.ahead++ {
		j := s.ahead
		size := blockEnd(e.Size, bs, j) - j*bs
		if ra.held+size > l.cfg.ReadAheadTotal || ahead+size > l.cfg.ReadAhead {
			break // at a bound: a later read tries again
		}
		if _, ok := s.blocks[j]; ok || l.mergedTail(e, j) {
			continue // held, or read with the block before it
		}
		ra.held += size
		ahead += size
		s.flying[j] = size
		ra.running.Add(1)
		want = append(want, j)
	}
	gen := s.gen
	ra.mu.Unlock()
	for _, j := range want {
		key := BlockKey(e.Path(), j)
		tag := l.Tag(e, key)
		size := blockEnd(e.Size, bs, j) - j*bs
		_, staged := l.staged(key, tag, e)
		if staged || l.ram.Contains(key) || l.flight.held(key) {
			l.unreserveAhead(s, j, size) // cached, or a demand read has it
			ra.running.Done()
			continue
		}
		go l.fetchAhead(e, s, gen, j, key, tag, size)
	}
	return random
}

// unreserveAhead returns the room taken for a fetch of block j (size
// bytes) for s that holds nothing.
func (l *Loader) unreserveAhead(s *stream, j, size int64) {
	l.ahead.mu.Lock()
	l.ahead.held -= size
	delete(s.flying, j)
	l.ahead.mu.Unlock()
}

// aheadLocked is the bytes s holds or fetches past its furthest read:
// what the per-stream bound weighs (a block being read is not ahead).
func (s *stream) aheadLocked() int64 {
	var n int64
	for j, b := range s.blocks {
		if j > s.last {
			n += int64(len(b.b.Data))
		}
	}
	for j, size := range s.flying {
		if j > s.last {
			n += size
		}
	}
	return n
}

// newStreamLocked follows path, dropping the least recently read
// stream if there are readAheadStreams.
func (ra *readAhead) newStreamLocked(path string) *stream {
	if ra.streams == nil {
		ra.streams = make(map[string]*stream)
	}
	if len(ra.streams) >= readAheadStreams {
		var oldest string
		var seen uint64 = math.MaxUint64
		for p, s := range ra.streams {
			if s.seen < seen {
				oldest, seen = p, s.seen
			}
		}
		ra.turnLocked(ra.streams[oldest])
		delete(ra.streams, oldest)
	}
	s := &stream{blocks: make(map[int64]aheadBlock), flying: make(map[int64]int64)}
	ra.streams[path] = s
	return s
}

// turnLocked drops s's blocks as wasted and ends its fetches' claim on
// the buffer.
func (ra *readAhead) turnLocked(s *stream) {
	for j, b := range s.blocks {
		ra.dropLocked(s, j, b, true)
	}
	s.gen++
	s.window, s.moved = 0, 0
	s.turned = true
}

// dropBehindLocked drops the blocks of s more than a window behind its
// furthest read: the reader passed them by.
func (ra *readAhead) dropBehindLocked(s *stream) {
	for j, b := range s.blocks {
		if j < s.last-max(s.window, 1) {
			ra.dropLocked(s, j, b, true)
		}
	}
}

func (ra *readAhead) dropLocked(s *stream, j int64, b aheadBlock, wasted bool) {
	delete(s.blocks, j)
	ra.held -= int64(len(b.b.Data))
	if wasted {
		ra.wasted.Add(int64(len(b.b.Data)))
	}
}

// fetchAhead fetches block j of e (key, tag; size bytes reserved) for
// stream s of generation gen, and holds it unless s turned away.
func (l *Loader) fetchAhead(e *catalog.Entry, s *stream, gen uint64, j int64, key string, tag uint64, size int64) {
	defer l.ahead.running.Done()
	kept := false
	defer func() {
		if !kept {
			l.unreserveAhead(s, j, size)
		}
	}()
	if !l.aheadWanted(e, s, gen, j) {
		return // a read reached the block first: it fetches it
	}
	_, _, _ = l.flight.do(l.aheadCtx, key, tag, forPrefetch, func(ctx context.Context) (fetch, error) {
		if b, ok := l.ram.Get(key, tag); ok {
			return fetch{b.Data, tierRAM, b.Sum}, nil
		}
		if b, ok := l.staged(key, tag, e); ok {
			return fetch{b.Data, tierStage, b.Sum}, nil // a prefetch was first
		}
		f, err := l.load(ctx, e, j, tag, forPrefetch)
		if err != nil {
			return f, err
		}
		l.ahead.fetched.Add(int64(len(f.val)))
		ra := &l.ahead
		ra.mu.Lock()
		defer ra.mu.Unlock()
		if cur := ra.streams[e.Path()]; cur != s || s.gen != gen || j < s.last-max(s.window, 1) || int64(len(f.val)) != size {
			ra.wasted.Add(int64(len(f.val)))
			return f, nil
		}
		s.blocks[j] = aheadBlock{blockOf(e, tag, f), f.src}
		delete(s.flying, j) // its room goes with the block
		kept = true
		return f, nil
	})
}

// aheadWanted says block j of e is still ahead of stream s of
// generation gen.
func (l *Loader) aheadWanted(e *catalog.Entry, s *stream, gen uint64, j int64) bool {
	l.ahead.mu.Lock()
	defer l.ahead.mu.Unlock()
	return l.ahead.streams[e.Path()] == s && s.gen == gen && j > s.last
}

// readerIn says whether block i of e is held ahead of its reader, and
// whether a reader is in e now: it read e within readerGone and has not
// reached its end. A prefetch leaves the rest of such a file to the
// reader's read-ahead, which fetches it in order within its bounds: a
// block the prefetch fetched past those bounds, or after the reader
// passed it, would be read again (see keepForReader).
func (l *Loader) readerIn(e *catalog.Entry, i int64) (held, in bool) {
	if e.Size <= l.cfg.BlockSize {
		return false, false // one block: never followed
	}
	l.ahead.mu.Lock()
	defer l.ahead.mu.Unlock()
	s := l.ahead.streams[e.Path()]
	if s == nil {
		return false, false
	}
	_, held = s.blocks[i]
	return held, !s.end && time.Since(s.at) < readerGone
}

// readerGone is how long after its last read a reader that has not
// reached the end of its file is taken to have left it.
const readerGone = 2 * time.Second

// aheadHas reports whether block i of e is held ahead of its reader.
func (l *Loader) aheadHas(e *catalog.Entry, i int64) bool {
	held, _ := l.readerIn(e, i)
	return held
}

// takeAhead returns block key (number i) of e, tagged tag, if it was
// fetched ahead and is intact; a read that reaches its end (done) takes
// it off the buffer.
func (l *Loader) takeAhead(e *catalog.Entry, i int64, key string, tag uint64, done bool, p part) (aheadBlock, bool) {
	if e.Size <= l.cfg.BlockSize {
		return aheadBlock{}, false // one block: never followed, so no lock on the small-file path
	}
	ra := &l.ahead
	ra.mu.Lock()
	defer ra.mu.Unlock()
	s := ra.streams[e.Path()]
	if s == nil {
		return aheadBlock{}, false
	}
	b, ok := s.blocks[i]
	if !ok {
		return aheadBlock{}, false
	}
	if b.b.Tag != tag || !p.intact(tag, b.b) {
		ra.dropLocked(s, i, b, true) // another version, or damaged: a miss
		return aheadBlock{}, false
	}
	if done {
		ra.dropLocked(s, i, b, false)
		ra.used.Add(int64(len(b.b.Data)))
	}
	return b, true
}

// HeldAhead returns block i of e if it is held ahead of a reader (or was
// fetched with the block before it, as a file's short last block is),
// intact under tag, and leaves it there: for a backing file built from
// what dlfs holds.
func (l *Loader) HeldAhead(e *catalog.Entry, i int64, tag uint64) (ramcache.Block, bool) {
	b, ok := l.takeAhead(e, i, BlockKey(e.Path(), i), tag, false, whole)
	return b.b, ok
}

// FromSSD returns block i of e if the SSD tier holds it under tag, as a
// block without segment sums (for a backing file, which checks its sum):
// it never reads the PFS or asks a peer.
func (l *Loader) FromSSD(e *catalog.Entry, i int64, tag uint64) (ramcache.Block, bool) {
	if l.ssd == nil {
		return ramcache.Block{}, false
	}
	b, ok, err := l.ssd.Get(BlockKey(e.Path(), i), tag)
	if err != nil || !ok {
		return ramcache.Block{}, false
	}
	return ramcache.Block{ID: e.Ino, Data: b.Data, Tag: tag, Sum: b.Sum}, true
}

// closeAhead stops read-ahead and waits for its fetches to end.
func (l *Loader) closeAhead() {
	l.ahead.mu.Lock()
	l.ahead.closed = true
	l.ahead.mu.Unlock()
	l.ahead.running.Wait()
}

// forgetAhead drops e's stream (its file changed or is gone).
func (l *Loader) forgetAhead(path string) {
	ra := &l.ahead
	ra.mu.Lock()
	defer ra.mu.Unlock()
	if s := ra.streams[path]; s != nil {
		ra.turnLocked(s)
		delete(ra.streams, path)
	}
}

// ReadAheadStats returns the read-ahead counters.
func (l *Loader) ReadAheadStats() ReadAheadStats {
	ra := &l.ahead
	ra.mu.Lock()
	defer ra.mu.Unlock()
	st := ReadAheadStats{Fetched: ra.fetched.Load(), Used: ra.used.Load(), Wasted: ra.wasted.Load(), Held: ra.held, Streams: len(ra.streams), Narrow: l.narrowed.Load()}
	if !l.cfg.NoReadAhead {
		st.Capacity, st.Stream = l.cfg.ReadAheadTotal, l.cfg.ReadAhead
	}
	return st
}

// tailMerge is the largest last block read with the block before it.
func (l *Loader) tailMerge() int64 { return l.cfg.BlockSize / 8 }

// mergedTail says block j of e is a small last block, which a read of
// the PFS brings in with the block before it.
func (l *Loader) mergedTail(e *catalog.Entry, j int64) bool {
	bs := l.cfg.BlockSize
	return !l.cfg.NoReadAhead && j > 0 && j == Blocks(e.Size, bs)-1 && e.Size-j*bs <= l.tailMerge()
}

// readPFSWithTail reads block i (n bytes) of e from SOURCE and, when the
// file's last block is small and follows it, that block too, in the same
// request (a numpy .npz of 1 MiB and a header is one read, not two). The
// last block goes where a read looks for blocks fetched ahead, queued for
// the SSD, under a flight of its own so that no read fetches it meanwhile.
func (l *Loader) readPFSWithTail(ctx context.Context, e *catalog.Entry, i, n int64) ([]byte, error) {
	j := i + 1
	if !l.mergedTail(e, j) {
		return l.readPFS(ctx, e, i, n)
	}
	key := BlockKey(e.Path(), j)
	tag := l.Tag(e, key)
	size := e.Size - j*l.cfg.BlockSize
	if l.ram.Contains(key) {
		return l.readPFS(ctx, e, i, n)
	}
	c := l.flight.claim([]string{key}, []uint64{tag})[0]
	if c == nil {
		return l.readPFS(ctx, e, i, n) // being fetched already
	}
	buf, err := l.readPFS(ctx, e, i, n+size)
	if err != nil {
		l.flight.finish(key, tag, c, fetch{src: tierPFS}, err)
		return nil, err
	}
	f := fetch{buf[n:], tierPFS, integrity.Sum(tag, buf[n:])}
	l.fetches[tierPFS].Add(1)
	l.fetched[tierPFS].Add(size)
	l.toSSD(e, key, tag, f)
	l.holdAhead(e, j, blockOf(e, tag, f), tierPFS)
	l.flight.finish(key, tag, c, f, nil)
	return buf[:n:n], nil
}

// holdAhead puts block j of e, fetched with another, where reads of
// blocks fetched ahead look, if the bound has room.
func (l *Loader) holdAhead(e *catalog.Entry, j int64, b ramcache.Block, src tier) {
	l.hold(e, j, b, src, true)
}

// keepForReader puts block j of e, which a prefetch fetched but the stage
// refused (its sample's reader has begun it, so no plan needs it any
// more), where that reader looks, if it has not passed j and the bound
// has room: otherwise the reader would read the block again.
func (l *Loader) keepForReader(e *catalog.Entry, j int64, b ramcache.Block, src tier) {
	if e.Size > l.cfg.BlockSize && !l.cfg.NoReadAhead {
		l.hold(e, j, b, src, false)
	}
}

// hold puts block j of e among the blocks fetched ahead of e's stream;
// with start, a stream starts there if e has none.
func (l *Loader) hold(e *catalog.Entry, j int64, b ramcache.Block, src tier, start bool) {
	ra := &l.ahead
	ra.mu.Lock()
	defer ra.mu.Unlock()
	size := int64(len(b.Data))
	if ra.held+size > l.cfg.ReadAheadTotal {
		return
	}
	s := ra.streams[e.Path()]
	switch {
	case s == nil && !start, s != nil && !start && j <= s.last:
		return
	case s == nil:
		s = ra.newStreamLocked(e.Path())
		s.last, s.ahead = j-1, j
	}
	ra.clock++
	if _, ok := s.blocks[j]; ok || s.aheadLocked()+size > l.cfg.ReadAhead {
		return
	}
	s.seen = ra.clock
	s.blocks[j] = aheadBlock{b, src}
	ra.held += size
	ra.fetched.Add(size)
}

// fromAhead takes block i of e (key, tag) from the blocks fetched ahead,
// if there and intact; a read that reaches its end offers it to RAM, which
// keeps it if its next use warrants, as a staged block.
func (l *Loader) fromAhead(e *catalog.Entry, i int64, key string, tag uint64, done bool, p part) (ramcache.Block, bool) {
	b, ok := l.takeAhead(e, i, key, tag, done, p)
	if !ok {
		return ramcache.Block{}, false
	}
	if done && !b.b.Peer {
		l.ram.Put(key, b.b)
	}
	return b.b, true
}
