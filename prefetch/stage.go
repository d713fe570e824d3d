package prefetch

import (
	"sync"
	"sync/atomic"

	"github.com/dlfs/dlfs/backing"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/ramcache"
)

// Stage holds prefetched blocks until a demand read takes them, and counts
// what else holds the staging bound: the bytes reserved by fetches in
// flight, and by pushed samples not yet behind their cursor (see push.go).
// It decides nothing: the Prefetcher asks it, under its own mu, what is
// staged and how much is held, and tells it what to add, reserve and drop.
//
// It is the loader's stage (loader.Stage), made before both: the loader
// is given it at construction (loader.Config.Stage), and the Prefetcher
// adopts it in New (Config.Stage). Until then it is empty and Hold stages
// nothing: only the Prefetcher's plans say what is worth holding. A Stage
// serves one Prefetcher. Safe for concurrent use; nothing blocks but on
// its locks.
//
// It has its own lock, so that a demand read's Take never waits on the
// streams or the scheduler. Every method takes it; none calls out. Lock
// order: Prefetcher.mu before Stage.mu (a predicate given to dropIf runs
// with Stage.mu held and may read the streams under Prefetcher.mu; Hold
// takes its Prefetcher's mu first, before any of the Stage's). Take is
// the only change made without Prefetcher.mu, and it only removes: a
// decision the Prefetcher makes under mu from what is staged and held
// stays sound while a Take runs beside it.
type Stage struct {
	// owner is the Prefetcher that adopted the stage (New); nil before.
	owner atomic.Pointer[Prefetcher]

	mu sync.Mutex
	// mu guards the following.
	// INVARIANT: bytes == sum of len(blocks[k].Data); perIno[i] == the blocks of file i in blocks.
	// INVARIANT: inflightBytes == sum of inflight.
	// INVARIANT: pushedBytes == sum of pushed + sum of pushing.
	// INVARIANT: backedBytes == sum of backed[i].Size(); backedBlockBytes == the bytes of the
	// staged blocks of the files in backed; backed[i] only while perIno[i] > 0.
	blocks        map[string]ramcache.Block
	perIno        map[uint64]int // blocks staged per file
	bytes         int64
	inflight      map[uint64]int64
	inflightBytes int64
	pushed        map[uint64]int64 // pushed samples not yet behind their cursor: bytes each
	pushing       map[uint64]int64 // pushes under way: bytes reserved (0 if staged)
	pushedBytes   int64
	// backed are the backing files built from files staged whole
	// (AdoptBacking), kept beside their blocks until they leave the stage
	// and counted against the bound with them: an announced job's first
	// open of such a file registers it and copies nothing.
	backed           map[uint64]*backing.File
	backedBytes      int64
	backedBlockBytes int64
	// released are backing files let go of under mu, released after it
	// (closing one frees its memory: not while the tiers' NextUse waits
	// on mu).
	released []*backing.File
	// served are the pages of staged blocks that reads have read, for
	// blocks read in part (Serve): bit i of the list is page i.
	served map[string][]uint64
	// pageCached are files a push found whole in the page cache, with no
	// read of them through dlfs since: not probed again (at most
	// maxPageCached).
	pageCached map[uint64]struct{}
}

// maxPageCached bounds Stage.pageCached: about 10 MB of map. Past it,
// files are probed as before.
const maxPageCached = 1 << 18

// The loader's stage.
var _ loader.Stage = (*Stage)(nil)

// stagedBlock is a block with its key.
type stagedBlock struct {
	key string
	ramcache.Block
}

// NewStage returns an empty stage, for a Prefetcher to adopt (Config.Stage).
func NewStage() *Stage {
	st := &Stage{}
	st.clear()
	return st
}

// clear empties the stage (Close).
func (st *Stage) clear() {
	defer st.releaseLetGo()
	st.mu.Lock()
	defer st.mu.Unlock()
	st.blocks, st.perIno, st.bytes = map[string]ramcache.Block{}, map[uint64]int{}, 0
	st.served = map[string][]uint64{}
	for _, f := range st.backed {
		st.released = append(st.released, f)
	}
	st.backed, st.backedBytes, st.backedBlockBytes = map[uint64]*backing.File{}, 0, 0
	if st.inflight == nil {
		st.inflight, st.pushed, st.pushing = map[uint64]int64{}, map[uint64]int64{}, map[uint64]int64{}
	}
	st.pageCached = map[uint64]struct{}{}
}

// held is what counts against the staging bound: staged blocks and their
// backing files, fetches in flight and pushed samples.
func (st *Stage) held() int64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.heldLocked()
}

func (st *Stage) heldLocked() int64 {
	return st.bytes + st.backedBytes + st.inflightBytes + st.pushedBytes
}

// stagedBytes is the bytes of the staged blocks and their backing files.
func (st *Stage) stagedBytes() int64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.bytes + st.backedBytes
}

// unbacked is the bytes of staged blocks whose file has no backing file
// beside them yet, and of fetches in flight: with Config.Staged, room the
// scheduler keeps for the backing files they may get.
func (st *Stage) unbacked() int64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.bytes - st.backedBlockBytes + st.inflightBytes
}

// AdoptBacking keeps f, the backing file built from file ino's blocks, all
// nb of them staged (the first under tag0), beside them until they leave
// the stage, with a reference of its own; f's bytes count against the
// bound (staging bytes) with them. It reports false, keeping nothing, if
// the blocks are no longer all staged, or if there is no room for f.
func (st *Stage) AdoptBacking(ino uint64, nb int, key0 string, tag0 uint64, f *backing.File, bound int64) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if b, ok := st.blocks[key0]; !ok || b.Tag != tag0 || st.perIno[ino] != nb || st.backed[ino] != nil ||
		st.heldLocked()+f.Size() > bound || !f.Acquire() {
		return false
	}
	st.backed[ino] = f
	st.backedBytes += f.Size()
	st.backedBlockBytes += f.Size() // its blocks, all staged
	return true
}

// releaseLetGo releases the backing files let go of under mu. Every
// method that may take blocks off defers it before it locks mu, so that
// it runs after the unlock.
func (st *Stage) releaseLetGo() {
	st.mu.Lock()
	fs := st.released
	st.released = nil
	st.mu.Unlock()
	for _, f := range fs {
		f.Release()
	}
}

// BackedFiles is how many backing files the stage keeps (each holds a
// descriptor).
func (st *Stage) BackedFiles() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.backed)
}

// HasRoom reports whether n more bytes fit under bound: whether a backing
// file of n bytes would be kept (AdoptBacking).
func (st *Stage) HasRoom(n, bound int64) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.heldLocked()+n <= bound
}

// Backing returns the backing file kept beside file ino's staged blocks,
// the first of them under tag0, with a reference for the caller; nil if
// none.
func (st *Stage) Backing(ino uint64, key0 string, tag0 uint64) *backing.File {
	st.mu.Lock()
	defer st.mu.Unlock()
	f := st.backed[ino]
	if b, ok := st.blocks[key0]; f == nil || !ok || b.Tag != tag0 || !f.Acquire() {
		return nil
	}
	return f
}

// has reports whether a block of file ino is staged.
func (st *Stage) has(ino uint64) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.perIno[ino] > 0
}

// busy reports whether a block of file ino is staged or a fetch of it is
// in flight.
func (st *Stage) busy(ino uint64) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.perIno[ino] > 0 || st.inflight[ino] > 0
}

// files returns the files with staged blocks.
func (st *Stage) files() map[uint64]bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make(map[uint64]bool, len(st.perIno))
	for ino := range st.perIno {
		out[ino] = true
	}
	return out
}

// add stages b unless a block is staged under key already, and reports
// whether it added it.
func (st *Stage) add(key string, b ramcache.Block) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, dup := st.blocks[key]; dup {
		return false
	}
	st.blocks[key] = b
	if st.backed[b.ID] != nil {
		st.backedBlockBytes += int64(len(b.Data)) // read again, and held for the rest
	}
	st.perIno[b.ID]++
	st.bytes += int64(len(b.Data))
	return true
}

// Take implements loader.Stage: it returns block key if it is staged with
// tag, and takes it off the stage if done (the reader is past it, or a
// backing file holds it now) or stale (another version of the file). It
// takes only the stage's lock. A block taken off frees room: the owner's
// scheduler is woken, as a taker need not be a read the owner sees.
func (st *Stage) Take(key string, tag uint64, done bool) (ramcache.Block, bool) {
	b, ok, removed := st.take(key, tag, done)
	if removed {
		st.freed()
	}
	return b, ok
}

// freed wakes the owner's scheduler: blocks left the stage.
func (st *Stage) freed() {
	if p := st.owner.Load(); p != nil {
		p.kick()
	}
}

// Serve implements loader.Stage: it returns block key if it is staged
// with tag (one of another version is dropped), counts bytes lo to hi of
// it (hi < 0: to its end) as read, and takes it off once reads have read
// every page of it (gone). A page counts when a read covers it whole:
// the kernel's READs are page-aligned, but for a file's last page.
func (st *Stage) Serve(key string, tag uint64, lo, hi int) (_ ramcache.Block, ok, gone bool) {
	b, ok, gone := st.serve(key, tag, lo, hi)
	if gone {
		st.freed()
	}
	return b, ok, gone
}

func (st *Stage) serve(key string, tag uint64, lo, hi int) (_ ramcache.Block, ok, gone bool) {
	defer st.releaseLetGo()
	st.mu.Lock()
	defer st.mu.Unlock()
	b, ok, dropped := st.findLocked(key, tag)
	if !ok {
		return ramcache.Block{}, false, dropped
	}
	n := len(b.Data)
	if hi < 0 || hi > n {
		hi = n
	}
	pages := (n + servedPage - 1) / servedPage
	m := st.served[key]
	if m == nil {
		m = make([]uint64, (pages+63)/64)
	}
	for p := (max(lo, 0) + servedPage - 1) / servedPage; p < pages && min((p+1)*servedPage, n) <= hi; p++ {
		m[p/64] |= 1 << (p % 64)
	}
	for p := 0; p < pages; p++ {
		if m[p/64]&(1<<(p%64)) == 0 {
			st.served[key] = m
			return b, true, false
		}
	}
	st.removeLocked(key, b)
	return b, true, true
}

// servedPage is the page Serve counts reads in.
const servedPage = 4096

func (st *Stage) take(key string, tag uint64, done bool) (_ ramcache.Block, ok, removed bool) {
	defer st.releaseLetGo()
	st.mu.Lock()
	defer st.mu.Unlock()
	b, ok, dropped := st.findLocked(key, tag)
	if !ok {
		return ramcache.Block{}, false, dropped
	}
	if done {
		st.removeLocked(key, b)
	}
	return b, true, done
}

// findLocked returns block key if it is staged with tag; one of another
// version of the file it takes off (dropped).
func (st *Stage) findLocked(key string, tag uint64) (_ ramcache.Block, ok, dropped bool) {
	b, ok := st.blocks[key]
	if ok && b.Tag != tag {
		st.removeLocked(key, b)
		return ramcache.Block{}, false, true
	}
	return b, ok, false
}

func (st *Stage) removeLocked(key string, b ramcache.Block) {
	delete(st.blocks, key)
	delete(st.served, key)
	st.bytes -= int64(len(b.Data))
	f := st.backed[b.ID]
	if f != nil {
		st.backedBlockBytes -= int64(len(b.Data))
	}
	if st.perIno[b.ID]--; st.perIno[b.ID] <= 0 {
		delete(st.perIno, b.ID)
		if f != nil { // an open holds its own reference
			delete(st.backed, b.ID)
			st.backedBytes -= f.Size()
			st.released = append(st.released, f)
		}
	}
}

// removeFile takes every staged block of e, cached in blocks of bs bytes,
// off the stage and returns them.
func (st *Stage) removeFile(e *catalog.Entry, bs int64) []stagedBlock {
	defer st.releaseLetGo()
	st.mu.Lock()
	defer st.mu.Unlock()
	var out []stagedBlock
	n := loader.Blocks(e.Size, bs)
	if n > int64(len(st.blocks)) {
		// A file of more blocks than the stage holds (a sparse file may
		// claim 2^43): walk the stage instead.
		for key, b := range st.blocks {
			if b.ID == e.Ino {
				st.removeLocked(key, b)
				out = append(out, stagedBlock{key, b})
			}
		}
		return out
	}
	for i := int64(0); i < n && st.perIno[e.Ino] > 0; i++ {
		key := loader.BlockKey(e.Path(), i)
		if b, ok := st.blocks[key]; ok {
			st.removeLocked(key, b)
			out = append(out, stagedBlock{key, b})
		}
	}
	return out
}

// dropIf takes off the stage every block for which drop reports true, and
// returns them. drop runs with st.mu held.
func (st *Stage) dropIf(drop func(ramcache.Block) bool) []stagedBlock {
	defer st.releaseLetGo()
	st.mu.Lock()
	defer st.mu.Unlock()
	var out []stagedBlock
	for key, b := range st.blocks {
		if drop(b) {
			st.removeLocked(key, b)
			out = append(out, stagedBlock{key, b})
		}
	}
	return out
}

// reserve holds n bytes for a fetch of file ino.
func (st *Stage) reserve(ino uint64, n int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.inflight[ino] = n
	st.inflightBytes += n
}

// reserved is the bytes held for a fetch of file ino.
func (st *Stage) reserved(ino uint64) int64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.inflight[ino]
}

// release gives back what a fetch of file ino held.
func (st *Stage) release(ino uint64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.inflightBytes -= takeOut(st.inflight, ino)
}

// takeOut deletes m[ino] and returns what it held.
func takeOut(m map[uint64]int64, ino uint64) int64 {
	n := m[ino]
	delete(m, ino)
	return n
}

// wasPushed reports whether file ino was pushed and is not yet behind
// its cursor.
func (st *Stage) wasPushed(ino uint64) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	_, ok := st.pushed[ino]
	return ok
}

// pushBusy reports whether file ino is pushed, or a push of it is under
// way.
func (st *Stage) pushBusy(ino uint64) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	_, busy := st.pushing[ino]
	return busy || st.pushed[ino] > 0
}

// reservePush holds n bytes for a push of file ino (0 when its blocks
// are staged: they are counted already).
func (st *Stage) reservePush(ino uint64, n int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.pushing[ino] = n
	st.pushedBytes += n
}

// pushDone gives back what a push of file ino held.
func (st *Stage) pushDone(ino uint64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.pushedBytes -= takeOut(st.pushing, ino)
}

// markPushed counts n bytes pushed for file ino until releasePushed.
func (st *Stage) markPushed(ino uint64, n int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.pushed[ino] = n
	st.pushedBytes += n
}

// releasePushed stops counting file ino's pushed bytes.
func (st *Stage) releasePushed(ino uint64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.pushedBytes -= takeOut(st.pushed, ino)
}

// markPageCached records that a push found file ino whole in the page
// cache.
func (st *Stage) markPageCached(ino uint64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.pageCached) < maxPageCached {
		st.pageCached[ino] = struct{}{}
	}
}

// isPageCached reports whether a push found file ino whole in the page
// cache, and no read of it has reached dlfs since.
func (st *Stage) isPageCached(ino uint64) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	_, ok := st.pageCached[ino]
	return ok
}

// readThrough records a read of file ino that reached dlfs: the page
// cache no longer holds all of it.
func (st *Stage) readThrough(ino uint64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.pageCached, ino)
}

// dropPushedIf stops counting the pushed bytes of every file for which
// drop reports true. drop runs with st.mu held.
func (st *Stage) dropPushedIf(drop func(ino uint64) bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for ino, n := range st.pushed {
		if drop(ino) {
			st.pushedBytes -= n
			delete(st.pushed, ino)
		}
	}
}

// stageFigures are the stage's part of Totals.
type stageFigures struct {
	stagedBytes  int64
	stagedBlocks int
	inFlight     int
	pushedHeld   int64
	backedBytes  int64
}

func (st *Stage) figures() stageFigures {
	st.mu.Lock()
	defer st.mu.Unlock()
	return stageFigures{st.bytes, len(st.blocks), len(st.inflight), st.pushedBytes, st.backedBytes}
}

// trimStage takes off the stage the blocks that no stream would stage
// soon: each stream's window is the first 2×Staging bytes, in the order
// its reads will come from its cursor, of the samples RAM does not hold
// (twice, because RAM has changed since the prefetcher passed them). After
// a plan change (a resumed job announces epoch 0 when its sampler is made,
// and its real epoch only later) the stage can be full of samples the new
// order needs late; bound by staging, the prefetcher could then fetch
// nothing ahead of the reader until the reader happened on them. The
// caller offers them to RAM, which keeps them if their next use warrants.
// RAM is asked without mu (see Locking); the plans' orders do not change
// once built.
func (p *Prefetcher) trimStage() []stagedBlock {
	type view struct {
		s    *stream
		from int // the cursor's step
	}
	p.mu.Lock()
	var views []view
	for _, s := range p.streams {
		if s.cursor < s.len() {
			views = append(views, view{s, s.order.step(s.cursor)})
		}
	}
	p.mu.Unlock()
	staged := p.stage.files()
	if len(staged) == 0 {
		return nil
	}
	window := map[uint64]bool{}
	for _, v := range views {
		var bytes int64
		seen := 0 // staged samples met: once all are, the rest cannot matter
		for k := v.from; k < v.s.len() && bytes < 2*p.cfg.Staging && seen < len(staged); k++ {
			e := v.s.entry(v.s.order.at(k))
			if e == nil || window[e.Ino] || p.load.InRAM(e) {
				continue
			}
			window[e.Ino] = true
			bytes = catalog.AddSize(bytes, e.Size)
			if staged[e.Ino] {
				seen++
			}
		}
	}
	return p.stage.dropIf(func(b ramcache.Block) bool { return staged[b.ID] && !window[b.ID] })
}

// Hold implements loader.Stage: it stages a block that a read fetched
// only in part, if its Prefetcher's plans need it and there is room;
// before a Prefetcher adopted the stage, never (nothing would drop it).
func (st *Stage) Hold(key string, b ramcache.Block) {
	if p := st.owner.Load(); p != nil {
		p.hold(key, b)
	}
}

// Take is its stage's Take (for the daemon's backing files, which take
// staged blocks as a read would).
func (p *Prefetcher) Take(key string, tag uint64, done bool) (ramcache.Block, bool) {
	return p.stage.Take(key, tag, done)
}

// hold is Hold for the prefetcher that adopted the stage.
func (p *Prefetcher) hold(key string, b ramcache.Block) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.neededLocked(b.ID, false) || p.stage.stagedBytes()+int64(len(b.Data)) > p.cfg.Staging {
		return // unplanned (nothing would ever drop it) or no room
	}
	p.stage.add(key, b)
}

// neededLocked reports whether a stream still has ino ahead of its cursor
// within what the scheduler has reached (or anywhere, if !soon).
func (p *Prefetcher) neededLocked(ino uint64, soon bool) bool {
	for _, s := range p.streams {
		if q := s.pending(ino); q >= 0 && (!soon || s.order.step(q) < s.frontier) {
			return true
		}
	}
	return false
}

// soonLocked says whether a stream needs ino within horizon steps of its
// frontier (or behind it, not yet consumed).
func (p *Prefetcher) soonLocked(ino uint64, horizon int) bool {
	for _, s := range p.streams {
		if q := s.pending(ino); q >= 0 && s.order.step(q) < s.frontier+horizon {
			return true
		}
	}
	return false
}

// dropIfUnneededLocked drops e's staged blocks if no stream will read them
// soon; they count as wasted.
func (p *Prefetcher) dropIfUnneededLocked(e *catalog.Entry) {
	if e == nil || !p.stage.has(e.Ino) || p.neededLocked(e.Ino, true) {
		return
	}
	dropped := p.stage.removeFile(e, p.cfg.BlockSize)
	if len(dropped) == 0 {
		return // taken meanwhile
	}
	for _, b := range dropped {
		p.totals.WastedBytes += int64(len(b.Data))
	}
	p.totals.Wasted++
	if st := p.statsOfLocked(e.Ino, nil); st != nil {
		st.Wasted++
	}
}

// dropUnneededLocked drops every staged block that no stream will read
// again (after a plan change).
func (p *Prefetcher) dropUnneededLocked() {
	for _, b := range p.stage.dropIf(func(b ramcache.Block) bool { return !p.neededLocked(b.ID, false) }) {
		p.totals.Wasted++
		p.totals.WastedBytes += int64(len(b.Data))
	}
}
