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
// larger than the whole capacity is never cached. Values are shared, never
// copied: callers must not modify a slice they put or got.
//
// # Integrity
//
// Every block carries its tag and sum (package integrity). Get returns a
// block only if its tag is the one the caller expects and its sum holds
// over its bytes; anything else removes the block and counts as a miss.
// The sum is checked outside the lock.
package ramcache

import (
	"container/list"
	"sync"

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
	// Peer says the block came from the node that owns it: this node's
	// RAM tier does not keep it (the nodes' RAM tiers are disjoint).
	Peer bool
}

// overhead approximates the bookkeeping bytes per entry, so that many tiny
// blocks cannot blow the memory bound.
const overhead = 128

// Stats describe the tier's contents.
type Stats struct {
	Entries  int64 `json:"entries"`
	Bytes    int64 `json:"bytes"`
	Capacity int64 `json:"capacity_bytes"`
}

// Cache is safe for concurrent use; no method blocks on I/O.
type Cache struct {
	capacity int64 // read-only after New
	nextUse  func(uint64) int64

	mu sync.Mutex
	// mu guards the following.
	// INVARIANT: bytes == sum of len(Data)+overhead over items, and bytes <= capacity.
	items map[string]*list.Element
	lru   *list.List // front: most recently used; values are *item
	bytes int64
}

type item struct {
	key string
	b   Block
}

// New returns an empty cache.
func New(cfg Config) *Cache {
	return &Cache{capacity: cfg.Capacity, nextUse: cfg.NextUse, items: make(map[string]*list.Element), lru: list.New()}
}

// Get returns the block for key if it is cached with tag and intact.
func (c *Cache) Get(key string, tag uint64) (Block, bool) {
	c.mu.Lock()
	el, ok := c.items[key]
	if !ok {
		c.mu.Unlock()
		return Block{}, false
	}
	it := el.Value.(*item)
	if it.b.Tag != tag {
		c.removeLocked(el)
		c.mu.Unlock()
		return Block{}, false
	}
	c.lru.MoveToFront(el)
	b := it.b
	c.mu.Unlock()
	if !integrity.Check(tag, b.Sum, b.Data) {
		c.mu.Lock()
		if cur, ok := c.items[key]; ok && cur == el {
			c.removeLocked(el)
		}
		c.mu.Unlock()
		return Block{}, false
	}
	return b, true
}

// Contains reports whether key is cached, without touching recency.
func (c *Cache) Contains(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.items[key]
	return ok
}

// Put caches b under key, replacing any older block, and evicts as needed.
// It reports whether the block was kept.
func (c *Cache) Put(key string, b Block) bool {
	cost := int64(len(b.Data)) + overhead
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		c.removeLocked(el)
	}
	if cost > c.capacity {
		return false
	}
	for c.bytes+cost > c.capacity {
		victim := c.victimLocked()
		if c.nextUse != nil && c.nextUse(b.ID) > c.nextUse(victim.Value.(*item).b.ID) {
			return false // needed later than anything here: Belady would not keep it
		}
		c.removeLocked(victim)
	}
	c.items[key] = c.lru.PushFront(&item{key: key, b: b})
	c.bytes += cost
	return true
}

// Delete drops key if present.
func (c *Cache) Delete(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		c.removeLocked(el)
	}
}

// candidates is how many blocks from the LRU end, and again at random,
// the Belady approximation compares.
const candidates = 16

// victimLocked picks the block to evict.
func (c *Cache) victimLocked() *list.Element {
	tail := c.lru.Back()
	if c.nextUse == nil {
		return tail
	}
	best, bestUse := tail, c.nextUse(tail.Value.(*item).b.ID)
	consider := func(el *list.Element) {
		if u := c.nextUse(el.Value.(*item).b.ID); u > bestUse {
			best, bestUse = el, u
		}
	}
	el := tail.Prev()
	for i := 1; i < candidates && el != nil; i++ {
		consider(el)
		el = el.Prev()
	}
	i := 0
	for _, el := range c.items { // map order is random
		if i++; i > candidates {
			break
		}
		consider(el)
	}
	return best
}

func (c *Cache) removeLocked(el *list.Element) {
	it := c.lru.Remove(el).(*item)
	delete(c.items, it.key)
	c.bytes -= int64(len(it.b.Data)) + overhead
}

// Stats returns the current contents.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Stats{Entries: int64(len(c.items)), Bytes: c.bytes, Capacity: c.capacity}
}
