// Package ramcache is the RAM tier: a byte-bounded map from block keys to
// immutable sample blocks.
//
// # Eviction
//
// Without an oracle the cache is LRU. With Config.NextUse, which tells how
// far in the future a block is needed (the clairvoyant prefetcher knows),
// it approximates Belady's policy: it looks at the candidates closest to
// the LRU end plus a random sample of the rest, and evicts the one needed
// furthest in the future (ties go to the least recently used). A new
// block needed later than every candidate is not admitted at all. A block
// larger than the whole capacity is never cached. Values are shared, not
// copied (callers must not modify a slice they put or got), except a slice
// of a larger buffer (a coalesced read) and a small block, which are
// copied: the first so that it does not hold the rest of the buffer, the
// second into a chunk.
//
// # Memory
//
// The capacity bounds the tier's real share of the heap, even over
// millions of tiny samples. Small blocks are packed into chunks (see
// slab.go), which the tier counts whole, dead bytes included; a block
// allocated on its own costs its data as Go's allocator sized it (a
// 33 KiB one takes 40 KiB: AllocSize). Every block adds its bookkeeping.
//
// # Integrity
//
// Every block carries its tag and sum (package integrity). Get returns a
// block only if its tag is the one the caller expects and its sum holds
// over its bytes; anything else removes the block and counts as a miss.
// The sum is checked outside the lock.
package ramcache

import (
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/dlfs/dlfs/integrity"
)

// Config configures a Cache.
type Config struct {
	// Capacity bounds the bytes of cached block data. 0 disables the tier.
	Capacity int64 // default 512 MiB
	// NextUse returns how far in the future the block with Block.ID is
	// needed (smaller is sooner; math.MaxInt64 for not planned). nil means
	// LRU. It is called with the cache's lock held and must not block.
	NextUse func(id uint64) int64
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{Capacity: 512 << 20} }

// Block is one cached piece of a file.
type Block struct {
	ID   uint64 // what NextUse is asked about (the file's inode number)
	Data []byte
	Tag  uint64 // integrity.Tag of the block's dataset, key and file version
	Sum  uint32 // integrity.Sum of Data under Tag
	// Segs are integrity.Segments of Data under Tag (none for a block of
	// one segment): a read of part of the block checks only its segments.
	Segs []uint32
	// Peer says the block came from the node that owns it: this node's
	// RAM tier does not keep it (the nodes' RAM tiers are disjoint).
	Peer bool
}

// overhead approximates the bookkeeping bytes per entry (an item, 112
// bytes since blocks carry segment sums, and its slot in the map), so
// that many tiny blocks cannot blow the memory bound.
const overhead = 136

// cost is what a block allocated on its own holds in memory: its data, as
// the allocator sized it, and the bookkeeping.
func cost(b Block) int64 { return int64(AllocSize(cap(b.Data))+4*cap(b.Segs)) + overhead }

// AllocSize is how many bytes Go's allocator gives a buffer of n bytes:
// the size class up to 32 KiB, whole 8 KiB pages beyond.
func AllocSize(n int) int {
	if n > maxSmall {
		return (n + 8191) &^ 8191
	}
	cs := sizeClasses()
	i, _ := slices.BinarySearch(cs, n)
	return cs[i]
}

const maxSmall = 32 << 10

// sizeClasses are the allocator's size classes up to maxSmall, learnt once
// from the runtime: a slice grown by append gets its whole class.
var sizeClasses = sync.OnceValue(func() []int {
	var cs []int
	for n := 1; n <= maxSmall; {
		c := cap(append([]byte(nil), make([]byte, n)...))
		cs = append(cs, c)
		n = c + 1
	}
	return cs
})

// Stats describe the tier's contents.
type Stats struct {
	Entries  int64 `json:"entries"`
	Bytes    int64 `json:"bytes"`
	Capacity int64 `json:"capacity_bytes"`
	// Chunks and DeadBytes describe the slabs: chunks held, and bytes in
	// them that no cached block uses (counted in Bytes).
	Chunks    int64 `json:"chunks"`
	DeadBytes int64 `json:"dead_bytes"`
	// Compactions counts chunks compacted since start.
	Compactions int64 `json:"compactions"`
	// CopiedBytes counts bytes copied into chunks since start (a packed
	// block is copied once when put, and again when its chunk is
	// compacted); larger blocks are kept as they came, uncopied.
	CopiedBytes int64 `json:"copied_bytes"`
	// Backing describes the files held in backing files (backed.go),
	// whose pages Bytes counts.
	Backing BackingStats `json:"backing"`
}

// Cache is safe for concurrent use; no method blocks on I/O.
//
// Entries are found by a 64-bit hash of their key, which is not kept: at
// 10 M small blocks the keys would cost more than the bookkeeping. Two
// keys with one hash would share an entry; the block's tag, which binds
// the key, then does not match, and Get reports a miss.
type Cache struct {
	capacity int64 // read-only after New
	nextUse  func(uint64) int64
	seed     maphash.Seed

	// orphans are the pages of backing files evicted while open
	// (backed.go); they count against the capacity.
	orphans atomic.Int64

	mu sync.Mutex
	// mu guards the following.
	// INVARIANT: bytes == overhead per item + cost(b) of every item
	// allocated on its own + every chunk's size + every backed file's
	// pages, fileOverhead and 4 bytes per segment sum, and bytes <= capacity.
	// INVARIANT: an item has Data == nil exactly when backedBlocks has
	// it, and then its backed file is in backed and lists it.
	items        map[uint64]*item
	lru          item // sentinel of the recency ring: lru.next is the most recently used
	bytes        int64
	slabs        slabs
	compacted    int64
	backed       map[uint64]*backedFile // by file ID
	backedBlocks map[uint64]backedBlock // by item hash
	backedBytes  int64                  // the backed files' pages
}

// item is one entry, on the recency ring.
type item struct {
	prev, next *item
	hash       uint64
	ch         *chunk // where b.Data is; nil if allocated on its own
	b          Block
}

// New returns an empty cache.
func New(cfg Config) *Cache {
	c := &Cache{capacity: cfg.Capacity, nextUse: cfg.NextUse, seed: maphash.MakeSeed(), items: make(map[uint64]*item),
		slabs: newSlabs(cfg.Capacity), backed: map[uint64]*backedFile{}, backedBlocks: map[uint64]backedBlock{}}
	c.lru.next, c.lru.prev = &c.lru, &c.lru
	return c
}

func (c *Cache) hash(key string) uint64 { return maphash.String(c.seed, key) }

// front puts it at the most recent end of the ring.
func (c *Cache) front(it *item) {
	it.prev, it.next = &c.lru, c.lru.next
	c.lru.next.prev = it
	c.lru.next = it
}

func unlink(it *item) {
	it.prev.next, it.next.prev = it.next, it.prev
	it.prev, it.next = nil, nil
}

// Get returns the block for key if it is cached with tag and intact.
func (c *Cache) Get(key string, tag uint64) (Block, bool) {
	return c.get(key, tag, func(b Block) bool { return integrity.Check(tag, b.Sum, b.Data) })
}

// GetRange is Get for a read of bytes lo to hi of the block: it checks
// only the segments they lie in (the whole block, if it has none).
func (c *Cache) GetRange(key string, tag uint64, lo, hi int) (Block, bool) {
	return c.get(key, tag, func(b Block) bool { return integrity.CheckRange(tag, b.Sum, b.Segs, b.Data, lo, hi) })
}

// get returns the block for key if it is cached with tag and intact by
// check; one that is not is dropped.
func (c *Cache) get(key string, tag uint64, intact func(Block) bool) (Block, bool) {
	h := c.hash(key)
	c.mu.Lock()
	it, ok := c.items[h]
	if !ok {
		c.mu.Unlock()
		return Block{}, false
	}
	if it.b.Tag != tag {
		c.removeLocked(it)
		c.mu.Unlock()
		return Block{}, false
	}
	unlink(it)
	c.front(it)
	b := it.b
	bb, backed := c.backedBlocks[h]
	backed = backed && b.Data == nil
	c.mu.Unlock()
	if backed {
		var ok bool
		if b, ok = readBacked(bb, b); !ok {
			return Block{}, false
		}
	}
	if !intact(b) {
		c.mu.Lock()
		if cur, ok := c.items[h]; ok && cur == it {
			c.removeLocked(it)
		}
		c.mu.Unlock()
		return Block{}, false
	}
	return b, true
}

// Contains reports whether key is cached, without touching recency.
func (c *Cache) Contains(key string) bool {
	h := c.hash(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.items[h]
	return ok
}

// Put caches b under key, replacing any older block, and evicts as needed.
// It reports whether the block was kept.
func (c *Cache) Put(key string, b Block) bool {
	packed := c.slabs.packs(len(b.Data))
	if !packed && cap(b.Data) > AllocSize(len(b.Data)) {
		b.Data = append([]byte(nil), b.Data...) // its own allocation, sized to it
	}
	h := c.hash(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	if it, ok := c.items[h]; ok {
		c.removeLocked(it)
	}
	// need is what admitting b adds to bytes.
	need := func() int64 {
		switch {
		case !packed:
			return cost(b)
		case c.slabs.grows(len(b.Data)):
			return overhead + int64(c.slabs.size)
		}
		return overhead
	}
	if !c.roomLocked(b.ID, need) {
		return false
	}
	it := &item{hash: h, b: b}
	if packed {
		var grew int64
		it.ch, it.b.Data, grew = c.slabs.add(h, b.Data)
		c.bytes += overhead + grew
	} else {
		c.bytes += cost(b)
	}
	c.front(it)
	c.items[h] = it
	return true
}

// roomLocked evicts until need() more bytes fit, and reports whether they
// do. A block of file id that would be needed later than the victim is
// refused, as Belady would refuse it.
func (c *Cache) roomLocked(id uint64, need func() int64) bool {
	if need() > c.capacity {
		return false
	}
	for c.bytes+c.orphans.Load()+need() > c.capacity {
		if ch := c.slabs.sparse(c.capacity); ch != nil {
			c.compactLocked(ch)
			continue
		}
		if len(c.items) == 0 {
			return false // backing files still open hold the rest
		}
		victim := c.victimLocked()
		if c.nextUse != nil && c.nextUse(id) > c.nextUse(victim.b.ID) {
			return false // needed later than anything here: Belady would not keep it
		}
		c.removeLocked(victim)
	}
	return true
}

// compactLocked moves ch's live blocks to the open chunk and drops ch.
func (c *Cache) compactLocked(ch *chunk) {
	ch.blocks(func(h uint64, block []byte) {
		it, ok := c.items[h]
		if !ok || it.ch != ch || &it.b.Data[0] != &block[0] {
			return // dead
		}
		c.bytes -= c.slabs.remove(ch, len(block))
		var grew int64
		it.ch, it.b.Data, grew = c.slabs.add(h, block)
		c.bytes += grew
	}) // its last live block dropped it
	c.compacted++
}

// Delete drops key if present.
func (c *Cache) Delete(key string) {
	h := c.hash(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	if it, ok := c.items[h]; ok {
		c.removeLocked(it)
	}
}

// DeleteID drops every block whose ID is id (a file's), walking the
// cache: for a file of more blocks than the cache holds.
func (c *Cache) DeleteID(id uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, it := range c.items {
		if it.b.ID == id {
			c.removeLocked(it)
		}
	}
}

// candidates is how many blocks from the LRU end, and again at random,
// the Belady approximation compares.
const candidates = 16

// victimLocked picks the block to evict. The cache is not empty.
func (c *Cache) victimLocked() *item {
	tail := c.lru.prev
	if c.nextUse == nil {
		return tail
	}
	best, bestUse := tail, c.nextUse(tail.b.ID)
	consider := func(it *item) {
		if u := c.nextUse(it.b.ID); u > bestUse {
			best, bestUse = it, u
		}
	}
	it := tail.prev
	for i := 1; i < candidates && it != &c.lru; i++ {
		consider(it)
		it = it.prev
	}
	i := 0
	for _, it := range c.items { // map order is random
		if i++; i > candidates {
			break
		}
		consider(it)
	}
	return best
}

func (c *Cache) removeLocked(it *item) {
	if c.isBacked(it) {
		c.removeBackedLocked(c.backedBlocks[it.hash].bf)
		return
	}
	unlink(it)
	delete(c.items, it.hash)
	if it.ch == nil {
		c.bytes -= cost(it.b)
		return
	}
	c.bytes -= overhead + c.slabs.remove(it.ch, len(it.b.Data))
	it.ch = nil
}

// Stats returns the current contents.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Stats{Entries: int64(len(c.items)), Bytes: c.bytes, Capacity: c.capacity,
		Chunks: int64(len(c.slabs.chunks)), DeadBytes: c.slabs.dead, Compactions: c.compacted,
		CopiedBytes: c.slabs.copied,
		Backing:     BackingStats{Files: int64(len(c.backed)), Bytes: c.backedBytes, EvictedOpenBytes: c.orphans.Load()}}
}
