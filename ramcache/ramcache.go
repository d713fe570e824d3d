// Package ramcache is the RAM tier: a byte-bounded map from block keys to
// immutable sample blocks.
//
// # Eviction
//
// When an insert would exceed the capacity, the least recently used blocks
// are dropped until it fits. A block larger than the whole capacity is not
// cached. Values are shared, never copied: callers must not modify a slice
// they put or got.
//
// # Identity
//
// Every block carries its file's identity (size, mtime) and a CRC-32C of its
// bytes. Get returns a block only if the identity matches what the caller
// expects; a mismatch removes the block and counts as a miss. The checksum is
// computed once on insert and travels with the block to the SSD tier, where
// it is verified on every read.
package ramcache

import (
	"container/list"
	"sync"
)

// Config configures a Cache.
type Config struct {
	// Capacity bounds the bytes of cached block data. 0 disables the tier.
	Capacity int64 // default 512 MiB
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{Capacity: 512 << 20} }

// Block is one cached piece of a file.
type Block struct {
	Data  []byte
	Size  int64  // identity: the file's size
	Mtime int64  // identity: the file's mtime in nanoseconds
	Sum   uint32 // CRC-32C of Data
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
	return &Cache{capacity: cfg.Capacity, items: make(map[string]*list.Element), lru: list.New()}
}

// Get returns the block for key if it is cached with identity (size, mtime).
func (c *Cache) Get(key string, size, mtime int64) (Block, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[key]
	if !ok {
		return Block{}, false
	}
	it := el.Value.(*item)
	if it.b.Size != size || it.b.Mtime != mtime {
		c.removeLocked(el)
		return Block{}, false
	}
	c.lru.MoveToFront(el)
	return it.b, true
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
		c.removeLocked(c.lru.Back())
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
