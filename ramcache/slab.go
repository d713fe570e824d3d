package ramcache

import "encoding/binary"

// Slabs
//
// A million 1 KB samples as a million Go allocations cost more than their
// bytes: each is rounded up to its size class, the garbage allocated
// between them (requests, paths, buffers) leaves holes in their spans that
// the runtime cannot give back, and every 8 KiB span carries its own
// metadata. At 1 M files that was about 100 bytes per sample outside the
// tier's count (docs/benchmarks.md, issue 13).
//
// So small blocks are packed into chunks, log-structured: a block is
// appended to the open chunk behind a 12-byte header (its hash and
// length) and never moves while its chunk lives. Evicting a block only
// marks its bytes dead. When dead bytes reach an eighth of the capacity,
// the chunk with the fewest live bytes is compacted: its live blocks are
// appended to the open chunk and the chunk is dropped. A chunk is never
// written again once closed and never reused: a reader holding a block of
// a dropped chunk keeps the chunk alive through the collector, so what it
// checked is what it serves. The tier counts whole chunks, dead bytes
// included, so Capacity bounds its memory as before.
//
// Blocks larger than a chunk's 32nd, empty ones, and every block of a
// cache too small for 64 chunks are allocated on their own.

const (
	hdrSize      = 12       // hash (8), length (4)
	maxChunk     = 1 << 20  // the chunk of a cache of 64 MiB and more
	minChunk     = 64 << 10 // the smallest chunk; smaller caches have none
	chunksPerCap = 64       // a chunk is at most this share of the capacity
	deadShare    = 8        // compact when dead bytes reach capacity/deadShare
	blocksPer    = 32       // the largest packed block is a chunk's 32nd
)

// chunk is one slab buffer. Blocks are appended at used.
type chunk struct {
	buf  []byte // len(buf) is the chunk size
	used int    // bytes appended, or len(buf) once closed
	live int    // bytes of blocks still cached, headers included
	idx  int    // position in slabs.chunks
}

// slabs is the cache's set of chunks. Guarded by Cache.mu.
type slabs struct {
	size   int      // chunk size; 0 when the cache packs nothing
	max    int      // the largest packed block
	chunks []*chunk // every chunk, open or closed
	open   *chunk   // where blocks are appended; nil before the first
	dead   int64    // bytes in chunks that hold no live block
	copied int64    // bytes copied into chunks, by puts and compactions
}

func newSlabs(capacity int64) slabs {
	size := min(int64(maxChunk), capacity/chunksPerCap)
	if size < minChunk {
		return slabs{}
	}
	return slabs{size: int(size), max: int(size) / blocksPer}
}

// packs reports whether a block of n bytes goes into a chunk.
func (s *slabs) packs(n int) bool { return n > 0 && n <= s.max }

// grows reports whether appending n bytes needs a new chunk.
func (s *slabs) grows(n int) bool {
	return s.open == nil || s.open.used+hdrSize+n > len(s.open.buf)
}

// add appends data, keyed by hash, and returns the chunk and the block's
// copy in it. The caller has checked the capacity for a new chunk
// (grows) and adds the returned growth to its bytes.
func (s *slabs) add(hash uint64, data []byte) (ch *chunk, block []byte, grew int64) {
	if s.grows(len(data)) {
		switch old := s.open; {
		case old == nil:
		case old.live == 0: // nothing in it lives: drop it
			s.drop(old)
			grew -= int64(s.size)
		default: // close it: its tail is dead
			s.dead += int64(len(old.buf) - old.used)
			old.used = len(old.buf)
		}
		s.open = &chunk{buf: make([]byte, s.size), idx: len(s.chunks)}
		s.chunks = append(s.chunks, s.open)
		grew += int64(s.size)
	}
	ch = s.open
	o := ch.used
	binary.LittleEndian.PutUint64(ch.buf[o:], hash)
	binary.LittleEndian.PutUint32(ch.buf[o+8:], uint32(len(data)))
	end := o + hdrSize + len(data)
	block = ch.buf[o+hdrSize : end : end]
	copy(block, data)
	s.copied += int64(len(data))
	ch.used = end
	ch.live += hdrSize + len(data)
	return ch, block, grew
}

// remove marks a block of n bytes in ch dead, and drops ch if nothing in
// it lives and it is closed. It returns the bytes freed.
func (s *slabs) remove(ch *chunk, n int) (freed int64) {
	ch.live -= hdrSize + n
	s.dead += int64(hdrSize + n)
	if ch.live == 0 && ch != s.open {
		s.drop(ch)
		return int64(s.size)
	}
	return 0
}

// drop forgets ch, whose bytes are all dead.
func (s *slabs) drop(ch *chunk) {
	s.dead -= int64(ch.used - ch.live)
	last := s.chunks[len(s.chunks)-1]
	s.chunks[ch.idx], last.idx = last, ch.idx
	s.chunks[len(s.chunks)-1] = nil
	s.chunks = s.chunks[:len(s.chunks)-1]
}

// sparse returns the closed chunk with the fewest live bytes if dead
// bytes have reached capacity/deadShare and it has at least a chunk's
// 16th dead, or nil. A 16th is two of the largest blocks, more than
// closing the open chunk early can waste, so every compaction lowers the
// dead bytes. With an eighth of the capacity dead over at most 64 chunks
// per eighth, the sparsest closed chunk has more than a 16th dead, so a
// compaction copies at most 15 bytes for each byte it frees, and about 7
// when blocks die evenly.
func (s *slabs) sparse(capacity int64) *chunk {
	if s.dead < capacity/deadShare {
		return nil
	}
	var best *chunk
	for _, ch := range s.chunks {
		if ch != s.open && (best == nil || ch.live < best.live) {
			best = ch
		}
	}
	if best == nil || best.used-best.live < s.size/16 {
		return nil
	}
	return best
}

// blocks calls f with the hash and bytes of every block appended to ch,
// live or dead.
func (ch *chunk) blocks(f func(hash uint64, block []byte)) {
	for o := 0; o+hdrSize <= ch.used; {
		h := binary.LittleEndian.Uint64(ch.buf[o:])
		n := int(binary.LittleEndian.Uint32(ch.buf[o+8:]))
		if n == 0 { // the closed tail
			return
		}
		end := o + hdrSize + n
		f(h, ch.buf[o+hdrSize:end:end])
		o = end
	}
}
