package ramcache

import (
	"github.com/dlfs/dlfs/backing"
)

// Backing files
//
// A file the tier holds whole can move into a sealed backing file
// (package backing), from which FUSE passthrough serves its opens: the
// kernel reads its bytes and no request reaches the daemon. The backing
// file is then the tier's copy: Adopt drops the file's blocks from the
// heap and keeps, for each, only its tag and sums; Get reads a block back
// from the backing file into a new buffer and checks it like any other.
// Those reads are rare, as the kernel reads a passthrough open itself.
//
// A backing file counts its pages against the capacity, with the
// bookkeeping of its blocks, and goes whole: evicting or deleting any of
// its blocks drops the file. An open of it keeps it alive after that (the
// kernel holds it), so its pages count on, as evicted-open bytes, until
// the last open closes: the heap's blocks make room for them, and the
// tier's memory stays within the capacity.

// fileOverhead is what the kernel holds for a backing file beside its
// pages: its inode, dentry and open file (about 1 KiB measured on Linux
// 6.18).
const fileOverhead = 1 << 10

// backedFile is a file whose blocks the tier holds in a backing file.
type backedFile struct {
	f      *backing.File
	id     uint64
	tag    uint64   // its first block's tag: the version it holds
	hashes []uint64 // its blocks' items, in order
	cost   int64    // what it adds to Cache.bytes
}

// backedBlock is where a block of a backed file lies in it.
type backedBlock struct {
	bf  *backedFile
	off int64
	n   int
}

// BackingStats describe the backing files the tier holds.
type BackingStats struct {
	Files int64 `json:"files"`
	// Bytes are their pages (counted in Stats.Bytes).
	Bytes int64 `json:"bytes"`
	// EvictedOpenBytes are the pages of backing files the tier let go of
	// (evicted, or dropped when their file changed) while an open still
	// reads them; they count against the capacity until it closes.
	EvictedOpenBytes int64 `json:"evicted_open_bytes"`
}

// Peek returns the block for key if it is cached on the heap with tag,
// without checking its sum: for a caller that checks it (backing.Build
// does). A block held in a backing file is not returned.
func (c *Cache) Peek(key string, tag uint64) (Block, bool) {
	h := c.hash(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	it, ok := c.items[h]
	if !ok || it.b.Tag != tag || c.isBacked(it) {
		return Block{}, false
	}
	return it.b, true
}

// Backing returns the backing file of the file with ID id, if the tier
// holds one of the version whose first block's tag is tag, with a
// reference for the caller (who releases it); or nil.
func (c *Cache) Backing(id, tag uint64) *backing.File {
	c.mu.Lock()
	defer c.mu.Unlock()
	bf := c.backed[id]
	if bf == nil || bf.tag != tag || !bf.f.Acquire() {
		return nil
	}
	for _, h := range bf.hashes {
		it := c.items[h]
		unlink(it)
		c.front(it)
	}
	return bf.f
}

// Adopt makes f, which holds exactly the bytes of blocks, the tier's copy
// of the file with ID id, whose blocks are cached under keys (in order):
// the tier keeps their tags and sums (blocks' Data gives only their
// lengths) and reads them from f from then on; their heap copies go. It
// reports whether the tier kept f, taking a reference of its own: like
// Put, it does not keep a file needed later than what it would evict.
func (c *Cache) Adopt(id uint64, keys []string, blocks []Block, f *backing.File) bool {
	if len(keys) == 0 || len(keys) != len(blocks) {
		return false
	}
	bf := &backedFile{f: f, id: id, tag: blocks[0].Tag, hashes: make([]uint64, len(keys)), cost: f.Pages() + fileOverhead}
	seen := make(map[uint64]bool, len(keys))
	for i, k := range keys {
		bf.hashes[i] = c.hash(k)
		if seen[bf.hashes[i]] {
			return false // two keys of one hash: one entry could not hold both
		}
		seen[bf.hashes[i]] = true
		bf.cost += overhead + int64(4*cap(blocks[i].Segs))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.backed[id]; old != nil {
		c.removeBackedLocked(old)
	}
	for _, h := range bf.hashes {
		if it, ok := c.items[h]; ok {
			c.removeLocked(it)
		}
	}
	if !c.roomLocked(id, func() int64 { return bf.cost }) || !f.Acquire() {
		return false
	}
	off := int64(0)
	for i, h := range bf.hashes {
		b := blocks[i]
		it := &item{hash: h, b: Block{ID: id, Tag: b.Tag, Sum: b.Sum, Segs: b.Segs}}
		c.front(it)
		c.items[h] = it
		c.backedBlocks[h] = backedBlock{bf, off, len(b.Data)}
		off += int64(len(b.Data))
	}
	c.backed[id] = bf
	c.bytes += bf.cost
	c.backedBytes += f.Pages()
	f.Keep()
	return true
}

// isBacked reports whether it is a block of a backed file.
func (c *Cache) isBacked(it *item) bool {
	if it.b.Data != nil {
		return false
	}
	_, ok := c.backedBlocks[it.hash]
	return ok
}

// removeBackedLocked drops bf and all its blocks. If an open still reads
// it, its pages count as evicted-open bytes until the last open closes.
func (c *Cache) removeBackedLocked(bf *backedFile) {
	for _, h := range bf.hashes {
		if bb, ok := c.backedBlocks[h]; ok && bb.bf == bf {
			unlink(c.items[h])
			delete(c.items, h)
			delete(c.backedBlocks, h)
		}
	}
	if c.backed[bf.id] == bf {
		delete(c.backed, bf.id)
	}
	c.bytes -= bf.cost
	pages := bf.f.Pages()
	c.backedBytes -= pages
	bf.f.Drop() // no longer the tier's copy (an idle passthrough registration lets go)
	if bf.f.Detach(func() { c.orphans.Add(-pages) }) {
		c.orphans.Add(pages)
	}
}

// readBacked reads block b of backed block bb into a new buffer, or
// reports false. It holds a reference to the file while it reads.
func readBacked(bb backedBlock, b Block) (Block, bool) {
	if !bb.bf.f.Acquire() {
		return Block{}, false
	}
	defer bb.bf.f.Release()
	buf := make([]byte, bb.n)
	if n, err := bb.bf.f.ReadAt(buf, bb.off); err != nil || n != bb.n {
		return Block{}, false
	}
	b.Data = buf
	return b, true
}
