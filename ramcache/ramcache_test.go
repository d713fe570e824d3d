package ramcache

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"unsafe"

	"github.com/dlfs/dlfs/integrity"
)

// tagOf is the tag of the test blocks of n bytes.
func tagOf(n int) uint64 { return uint64(n)<<8 | 1 }

func blk(n int) Block {
	d := make([]byte, n)
	return Block{Data: d, Tag: tagOf(n), Sum: integrity.Sum(tagOf(n), d)}
}

func checkInvariant(t *testing.T, c *Cache) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	var sum int64
	live := map[*chunk]int{}
	backed := map[*backedFile]int{}
	for h, it := range c.items {
		switch bb, isBacked := c.backedBlocks[h]; {
		case isBacked != (it.b.Data == nil):
			t.Fatalf("INVARIANT broken: item %x has data %v but is backed %v", h, it.b.Data != nil, isBacked)
		case isBacked:
			if c.backed[bb.bf.id] != bb.bf || !slices.Contains(bb.bf.hashes, h) {
				t.Fatalf("INVARIANT broken: backed item %x is not its file's", h)
			}
			backed[bb.bf]++
		case it.ch == nil:
			sum += cost(it.b)
		default:
			sum += overhead
			live[it.ch] += hdrSize + len(it.b.Data)
			start := it.ch.buf[:cap(it.ch.buf)]
			if cap(it.b.Data) != len(it.b.Data) || len(it.b.Data) == 0 || !inside(start, it.b.Data) {
				t.Fatalf("INVARIANT broken: a packed block is not a capped slice of its chunk")
			}
		}
		if it.hash != h || it.next.prev != it || it.prev.next != it {
			t.Fatalf("INVARIANT broken: item under %x has hash %x, or is off the ring", h, it.hash)
		}
	}
	var backedBytes int64
	for _, bf := range c.backed {
		if backed[bf] != len(bf.hashes) {
			t.Fatalf("INVARIANT broken: backed file %d has %d of its %d items", bf.id, backed[bf], len(bf.hashes))
		}
		sum += bf.cost
		backedBytes += bf.f.Pages()
	}
	if len(backed) != len(c.backed) || backedBytes != c.backedBytes {
		t.Fatalf("INVARIANT broken: %d backed files with items, %d listed; %d bytes, counted %d", len(backed), len(c.backed), backedBytes, c.backedBytes)
	}
	var dead int64
	for i, ch := range c.slabs.chunks {
		sum += int64(c.slabs.size)
		dead += int64(ch.used - ch.live)
		if ch.idx != i || ch.live != live[ch] || (ch.live == 0 && ch != c.slabs.open) {
			t.Fatalf("INVARIANT broken: chunk %d (idx %d) counts %d live bytes, its items hold %d", i, ch.idx, ch.live, live[ch])
		}
		delete(live, ch)
	}
	if len(live) != 0 || dead != c.slabs.dead {
		t.Fatalf("INVARIANT broken: %d items in dropped chunks; dead %d, counted %d", len(live), dead, c.slabs.dead)
	}
	ring := 0
	for it := c.lru.next; it != &c.lru; it = it.next {
		ring++
	}
	if sum != c.bytes || c.bytes+max(c.orphans.Load(), 0) > c.capacity || ring != len(c.items) {
		t.Fatalf("INVARIANT broken: sum %d bytes %d capacity %d ring %d items %d", sum, c.bytes, c.capacity, ring, len(c.items))
	}
}

// inside reports whether b lies within buf.
func inside(buf, b []byte) bool {
	lo, hi := &buf[0], &buf[len(buf)-1]
	p, q := &b[0], &b[len(b)-1]
	return uintptr(unsafe.Pointer(p)) >= uintptr(unsafe.Pointer(lo)) && uintptr(unsafe.Pointer(q)) <= uintptr(unsafe.Pointer(hi))
}

func TestLRU(t *testing.T) {
	c := New(Config{Capacity: 3 * cost(blk(100))})
	for _, k := range []string{"a", "b", "c"} {
		c.Put(k, blk(100))
	}
	if _, ok := c.Get("a", tagOf(100)); !ok { // a is now the most recent
		t.Fatal("a missing")
	}
	c.Put("d", blk(100)) // evicts b, the least recent
	if c.Contains("b") || !c.Contains("a") || !c.Contains("c") || !c.Contains("d") {
		t.Errorf("wrong victim: a %v b %v c %v d %v", c.Contains("a"), c.Contains("b"), c.Contains("c"), c.Contains("d"))
	}
	checkInvariant(t, c)
	if c.Put("huge", blk(1000)) {
		t.Error("a block larger than the cache was kept")
	}
	checkInvariant(t, c)
}

func TestIdentityMismatchIsMiss(t *testing.T) {
	c := New(Config{Capacity: 1 << 20})
	c.Put("k", blk(10))
	if _, ok := c.Get("k", tagOf(10)+1); ok {
		t.Fatal("a block with another tag (version, dataset or key) was returned")
	}
	if c.Contains("k") {
		t.Error("the stale block was not dropped")
	}
	checkInvariant(t, c)
}

// TestDamagedBlockIsMiss: a block whose bytes no longer match its sum is
// never returned, and is dropped.
func TestDamagedBlockIsMiss(t *testing.T) {
	c := New(Config{Capacity: 1 << 20})
	b := blk(10)
	c.Put("k", b)
	b.Data[3] ^= 1 // the cache shares the slice: damage it in place
	if _, ok := c.Get("k", tagOf(10)); ok {
		t.Fatal("a damaged block was returned")
	}
	if c.Contains("k") {
		t.Error("the damaged block was not dropped")
	}
	checkInvariant(t, c)
}

func TestConcurrent(t *testing.T) {
	c := New(Config{Capacity: 50 * cost(blk(64))})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				k := fmt.Sprint((i * (g + 1)) % 97)
				if i%3 == 0 {
					c.Put(k, blk(64))
				} else if b, ok := c.Get(k, tagOf(64)); ok && len(b.Data) != 64 {
					t.Error("wrong block")
				}
				if i%50 == 0 {
					c.Delete(k)
				}
			}
		}()
	}
	wg.Wait()
	checkInvariant(t, c)
}

// TestBelady: with an oracle, the block needed furthest in the future goes
// first, and a block needed later than everything cached is not admitted.
func TestBelady(t *testing.T) {
	next := map[uint64]int64{1: 10, 2: 1000, 3: 5, 4: 7, 5: 2000}
	c := New(Config{Capacity: 3 * cost(blk(100)), NextUse: func(id uint64) int64 { return next[id] }})
	put := func(id uint64) bool {
		b := blk(100)
		b.ID = id
		return c.Put(fmt.Sprint(id), b)
	}
	put(1)
	put(2)
	put(3)
	if !put(4) || c.Contains("2") || !c.Contains("1") || !c.Contains("3") {
		t.Errorf("evicted the wrong block: 1 %v 2 %v 3 %v", c.Contains("1"), c.Contains("2"), c.Contains("3"))
	}
	if put(5) || c.Contains("5") {
		t.Error("admitted a block needed later than everything cached")
	}
	checkInvariant(t, c)
}

// TestAllocSize checks AllocSize against what the runtime counts.
func TestAllocSize(t *testing.T) {
	const count = 4000
	keep := make([][]byte, count)
	for _, n := range []int{100, 1100, 2000, 4097, 20000, 32 << 10, 33 << 10, 100 << 10} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := range keep {
			keep[i] = make([]byte, n)
		}
		runtime.ReadMemStats(&after)
		got := (after.TotalAlloc - before.TotalAlloc) / count
		// Anything else the process allocates meanwhile adds a little.
		if want := AllocSize(n); int(got) < want || float64(got) > 1.01*float64(want) {
			t.Errorf("a %d-byte buffer: the runtime allocated %d bytes, AllocSize says %d", n, got, want)
		}
	}
	runtime.KeepAlive(keep)
}

// TestSliceOfALargerBuffer: a block that is a slice of a larger buffer
// (a coalesced read) is copied, so the tier does not hold the buffer.
func TestSliceOfALargerBuffer(t *testing.T) {
	c := New(Config{Capacity: 1 << 20})
	run := make([]byte, 64<<10)
	d := run[:100]
	b := Block{Data: d, Tag: tagOf(100), Sum: integrity.Sum(tagOf(100), d)}
	if !c.Put("k", b) {
		t.Fatal("not kept")
	}
	got, ok := c.Get("k", tagOf(100))
	if !ok || &got.Data[0] == &run[0] || cap(got.Data) != AllocSize(100) {
		t.Errorf("kept the larger buffer (cap %d)", cap(got.Data))
	}
	if st := c.Stats(); st.Bytes != int64(AllocSize(100))+overhead {
		t.Errorf("costs %d bytes, want %d", st.Bytes, AllocSize(100)+overhead)
	}
}

// DeleteID drops a file's blocks and nothing else.
func TestDeleteID(t *testing.T) {
	c := New(Config{Capacity: 1 << 20})
	for i := range 10 {
		b := blk(100 + i)
		b.ID = uint64(i % 2)
		c.Put(fmt.Sprint(i), b)
	}
	c.DeleteID(1)
	for i := range 10 {
		if got := c.Contains(fmt.Sprint(i)); got != (i%2 == 0) {
			t.Errorf("block %d of file %d: cached %v after DeleteID(1)", i, i%2, got)
		}
	}
	checkInvariant(t, c)
}

// GetRange checks only the segments of the range read: a damaged segment
// fails a read of it, and the block is dropped.
func TestGetRange(t *testing.T) {
	c := New(Config{Capacity: 8 << 20})
	const tag = 9
	data := make([]byte, 4*integrity.SegmentBytes)
	for i := range data {
		data[i] = byte(i)
	}
	c.Put("k", Block{ID: 1, Data: data, Tag: tag, Sum: integrity.Sum(tag, data), Segs: integrity.Segments(tag, data)})
	b, ok := c.Get("k", tag)
	if !ok {
		t.Fatal("an intact block missed")
	}
	b.Data[3*integrity.SegmentBytes] ^= 1 // damage the cached bytes in place
	if _, ok := c.GetRange("k", tag, 0, 2*integrity.SegmentBytes); !ok {
		t.Error("a range over intact segments missed")
	}
	if _, ok := c.GetRange("k", tag, 3*integrity.SegmentBytes, 3*integrity.SegmentBytes+10); ok {
		t.Error("a range over the damaged segment was served")
	}
	if c.Contains("k") {
		t.Error("a damaged block stayed cached")
	}
}
