package daemon

import (
	"sync"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/loader"
)

// The backing builder.
//
// A file's backing file is built at its first open after the RAM tier
// holds it whole (passthrough.go). That open pays for the copy: a later
// epoch of 32 MiB samples whose files are built at their opens read at
// 0.47x the FUSE floor, against 3x once they exist. So the builder builds
// them in the background, from the blocks the RAM tier and the
// prefetcher's stage hold, and the tier adopts them; an open then finds
// its file built. It is offered two kinds of file:
//   - one the prefetcher staged (prefetch.Config.Staged): an announced
//     job's first read of it is served by passthrough. The stage keeps
//     the file beside the blocks, counted against --staging with them,
//     until they are read (Stage.AdoptBacking); the open that reads them
//     hands the file to the RAM tier.
//   - one a reader read to its end: the next epoch's open finds it built.
//
// One goroutine builds, from a bounded queue: an offer that finds the
// queue full, or the file queued or being built already, is dropped (the
// open builds it). A file not yet held whole when its turn comes (its
// reader's other READs still on their way) is offered again a little
// later, a few times. An open of a file being built waits for that build
// instead of building a second copy (builds). Close stops the goroutine
// and waits for it.

// builderQueue bounds the files waiting for the builder. The prefetcher
// offers every file it stages, as fast as it fetches them: an announced
// epoch of 110 KB files left 1,193 of 3,000 unbuilt behind a queue of 64.
// An entry costs a pointer and a map slot; 4,096 of them cover a stage of
// 256 MiB of files of 64 KB and more.
const builderQueue = 4096

// A file the RAM tier does not hold whole yet is offered again builderRetry
// later, builderTries times in all (retryLater).
const (
	builderRetry = 100 * time.Millisecond
	builderTries = 3
)

// builder builds backing files in the background (see above).
type builder struct {
	n     *Node
	queue chan *catalog.Entry
	stop  chan struct{}
	done  sync.WaitGroup

	mu     sync.Mutex
	queued map[uint64]bool // (mu) inodes in queue
	tries  map[uint64]int  // (mu) retries of inodes not held whole yet (at most builderQueue)
	// building holds a channel per inode being built, closed when its
	// build ends (mu).
	building map[uint64]chan struct{}
	closed   bool // (mu)
}

func newBuilder(n *Node) *builder {
	b := &builder{n: n, queue: make(chan *catalog.Entry, builderQueue), stop: make(chan struct{}),
		queued: map[uint64]bool{}, tries: map[uint64]int{}, building: map[uint64]chan struct{}{}}
	b.done.Add(1)
	go b.run()
	return b
}

// offer queues e, which the prefetcher staged or a reader read to its
// end, for a build if the mount uses passthrough and e has no backing
// file yet. It does not block.
func (b *builder) offer(e *catalog.Entry) {
	if e.Size == 0 || !b.n.fs.UsesPassthrough() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.queued[e.Ino] || b.building[e.Ino] != nil {
		return
	}
	select {
	case b.queue <- e:
		b.queued[e.Ino] = true
	default: // full: the open builds it
	}
}

func (b *builder) run() {
	defer b.done.Done()
	for {
		select {
		case <-b.stop:
			return
		case e := <-b.queue:
			b.mu.Lock()
			delete(b.queued, e.Ino)
			b.mu.Unlock()
			b.build(e)
		}
	}
}

// build builds e's backing file from the blocks the RAM tier and the
// stage hold and leaves it to the tier, unless the tier has one, or they
// lack a block, or a block is a peer's.
func (b *builder) build(e *catalog.Entry) {
	n := b.n
	end, mine := b.begin(e.Ino)
	if !mine {
		return // an open builds it
	}
	defer end()
	key0 := loader.BlockKey(e.Path(), 0)
	tag0 := n.tiers.load.Tag(e, key0)
	if f := n.tiers.ram.Backing(e.Ino, tag0); f != nil {
		f.Release() // built already (by an open, or an offer before)
		return
	}
	if f := n.tiers.stage.Backing(e.Ino, key0, tag0); f != nil {
		f.Release() // built already, beside its staged blocks
		return
	}
	// The copy and the tier's blocks are both in memory until the tier
	// adopts it: one build at a time, and only while the opens leave room
	// for it under their bound. It takes no part of the bound itself: an
	// open of the file meanwhile waits for this build, and must not be
	// turned away by it.
	c := &n.tiers.backing
	if c.openBytes.Load()+openCharge(e.Size) > n.openBound() {
		return
	}
	f, adopted, missing := n.buildBacking(e, false)
	if f != nil {
		f.Release() // the tier holds its own reference, if it adopted it
	}
	if adopted {
		c.builtAhead.Add(1)
	}
	if missing {
		b.retryLater(e) // reads of its other blocks may still be on their way
		return
	}
	b.mu.Lock()
	delete(b.tries, e.Ino)
	b.mu.Unlock()
}

// retryLater offers e again after builderRetry, at most builderTries
// times in all: the kernel sends a reader's READs of one file out of
// order, so the one that reaches the end may be answered while another
// block is still on its way into the RAM tier.
func (b *builder) retryLater(e *catalog.Entry) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.tries[e.Ino] >= builderTries-1 || b.tries[e.Ino] == 0 && len(b.tries) >= builderQueue {
		delete(b.tries, e.Ino)
		return
	}
	b.tries[e.Ino]++
	time.AfterFunc(builderRetry, func() { b.offer(e) })
}

// begin claims the build of inode ino: mine says the caller builds it
// and must call end when done; otherwise wait ends when the build under
// way does.
func (b *builder) begin(ino uint64) (end func(), mine bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.building[ino] != nil {
		return nil, false
	}
	ch := make(chan struct{})
	b.building[ino] = ch
	return func() {
		b.mu.Lock()
		delete(b.building, ino)
		b.mu.Unlock()
		close(ch)
	}, true
}

// wait waits for the build of inode ino under way, if any.
func (b *builder) wait(ino uint64) {
	b.mu.Lock()
	ch := b.building[ino]
	b.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// close stops the builder and waits for the build under way.
func (b *builder) close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	b.mu.Unlock()
	close(b.stop)
	b.done.Wait()
}
