package ramcache

import (
	"bytes"
	"fmt"
	"math"
	"testing"

	"github.com/dlfs/dlfs/backing"
	"github.com/dlfs/dlfs/integrity"
)

// fileBlocks puts the blocks of file id (n blocks of bs bytes, the last
// half as long) in c and returns their keys and blocks.
func fileBlocks(t *testing.T, c *Cache, id uint64, n, bs int) ([]string, []Block) {
	t.Helper()
	var keys []string
	var blocks []Block
	for i := 0; i < n; i++ {
		size := bs
		if i == n-1 {
			size = bs / 2
		}
		d := bytes.Repeat([]byte{byte(id), byte(i)}, size/2)
		tag := id<<16 | uint64(i)
		b := Block{ID: id, Data: d, Tag: tag, Sum: integrity.Sum(tag, d), Segs: integrity.Segments(tag, d)}
		key := fmt.Sprintf("f%d\x00%d", id, i)
		if !c.Put(key, b) {
			t.Fatalf("put %s refused", key)
		}
		keys, blocks = append(keys, key), append(blocks, b)
	}
	return keys, blocks
}

// backFile builds file id's backing file from the tier, as the daemon
// does (Peek, then backing.Build checks each sum), and adopts it.
func backFile(t *testing.T, c *Cache, id uint64, keys []string, blocks []Block, bs int) *backing.File {
	t.Helper()
	var size int64
	for _, b := range blocks {
		size += int64(len(b.Data))
	}
	f, err := backing.Build(keys[0], size, int64(bs), func(i int64) (backing.Block, bool) {
		b, ok := c.Peek(keys[i], blocks[i].Tag)
		return backing.Block{Data: b.Data, Tag: b.Tag, Sum: b.Sum}, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Adopt(id, keys, blocks, f) {
		t.Fatal("Adopt refused")
	}
	return f
}

// TestAdopt: a file moved into a backing file leaves the heap, counts its
// pages, still answers Get and GetRange with the right bytes, and is
// handed out only for its own version.
func TestAdopt(t *testing.T) {
	const bs = 300 << 10
	c := New(Config{Capacity: 64 << 20})
	keys, blocks := fileBlocks(t, c, 7, 4, bs)
	before := c.Stats().Bytes
	f := backFile(t, c, 7, keys, blocks, bs)
	f.Release() // the tier holds its own
	checkInvariant(t, c)
	st := c.Stats()
	if st.Backing.Files != 1 || st.Backing.Bytes != f.Pages() || st.Entries != 4 {
		t.Fatalf("stats %+v; want 1 backing file of %d bytes, 4 entries", st, f.Pages())
	}
	if st.Bytes > before {
		t.Fatalf("the tier holds %d bytes with the backing file, %d with the heap's copies", st.Bytes, before)
	}
	for i, k := range keys {
		if _, ok := c.Peek(k, blocks[i].Tag); ok {
			t.Fatal("Peek returned a backed block")
		}
		b, ok := c.Get(k, blocks[i].Tag)
		if !ok || !bytes.Equal(b.Data, blocks[i].Data) {
			t.Fatalf("Get block %d of the backed file: ok %v", i, ok)
		}
		if b, ok := c.GetRange(k, blocks[i].Tag, 10, 20); !ok || !bytes.Equal(b.Data[10:20], blocks[i].Data[10:20]) {
			t.Fatalf("GetRange block %d: ok %v", i, ok)
		}
		if !c.Contains(k) {
			t.Fatal("Contains says no")
		}
	}
	if _, ok := c.Get(keys[1], blocks[1].Tag+1); ok {
		t.Fatal("a backed block came back under another tag")
	}
	// That miss dropped the file (another version is wanted).
	if c.Backing(7, blocks[0].Tag) != nil || c.Stats().Backing.Files != 0 {
		t.Fatal("a backed file survived a miss on another version")
	}
	checkInvariant(t, c)

	keys, blocks = fileBlocks(t, c, 8, 3, bs)
	backFile(t, c, 8, keys, blocks, bs).Release()
	if g := c.Backing(8, blocks[0].Tag+1); g != nil {
		t.Fatal("Backing handed out another version")
	}
	g := c.Backing(8, blocks[0].Tag)
	if g == nil {
		t.Fatal("Backing of the adopted version: none")
	}
	g.Release()
	c.Delete(keys[2]) // one block: the whole file goes
	if c.Stats().Backing.Files != 0 || c.Stats().Entries != 0 || c.Stats().Bytes != 0 {
		t.Fatalf("after deleting a block: %+v", c.Stats())
	}
	checkInvariant(t, c)
}

// TestBackedEvictedWhileOpen: eviction drops a backing file whole; one
// still open counts as evicted-open bytes, within the capacity, until it
// is released.
func TestBackedEvictedWhileOpen(t *testing.T) {
	const bs = 256 << 10
	c := New(Config{Capacity: 8 << 20})
	keys, blocks := fileBlocks(t, c, 1, 8, bs) // 1.875 MiB
	f := backFile(t, c, 1, keys, blocks, bs)   // this reference is the open's
	pages := f.Pages()
	for i := 0; i < 64; i++ { // 16 MiB of other blocks
		c.Put(fmt.Sprintf("other%d", i), blk(bs))
		checkInvariant(t, c)
	}
	st := c.Stats()
	if st.Backing.Files != 0 || st.Backing.EvictedOpenBytes != pages {
		t.Fatalf("after eviction: %+v; want no backing file, %d evicted-open bytes", st.Backing, pages)
	}
	if st.Bytes+st.Backing.EvictedOpenBytes > st.Capacity {
		t.Fatalf("%d bytes and %d evicted-open bytes exceed the capacity %d", st.Bytes, st.Backing.EvictedOpenBytes, st.Capacity)
	}
	got := make([]byte, len(blocks[0].Data))
	if n, err := f.ReadAt(got, 0); err != nil || n != len(got) || !bytes.Equal(got, blocks[0].Data) {
		t.Fatal("the open lost its bytes on eviction")
	}
	f.Release()
	if n := c.Stats().Backing.EvictedOpenBytes; n != 0 {
		t.Fatalf("%d evicted-open bytes after the last release", n)
	}
	checkInvariant(t, c)
}

// TestBackedDropWatched: a file the tier adopts is kept (WatchDrop takes a
// watcher), and the tier letting go of it runs the watcher once, whether
// by eviction, DeleteID or a new file adopted for the same ID; a file the
// tier never adopted is not kept.
func TestBackedDropWatched(t *testing.T) {
	const bs = 256 << 10
	c := New(Config{Capacity: 8 << 20})
	watch := func(f *backing.File) *int {
		t.Helper()
		n := new(int)
		if !f.WatchDrop(func() { *n++ }) {
			t.Fatal("WatchDrop of an adopted file reported false")
		}
		return n
	}

	keys, blocks := fileBlocks(t, c, 1, 2, bs)
	f := backFile(t, c, 1, keys, blocks, bs)
	evicted := watch(f)
	f.Release()               // the open's reference
	for i := 0; i < 64; i++ { // 16 MiB of other blocks
		c.Put(fmt.Sprintf("other%d", i), blk(bs))
	}
	if *evicted != 1 {
		t.Fatalf("watcher ran %d times on eviction, want 1", *evicted)
	}

	keys, blocks = fileBlocks(t, c, 2, 2, bs)
	f = backFile(t, c, 2, keys, blocks, bs)
	deleted := watch(f)
	f.Release()
	c.DeleteID(2)
	if *deleted != 1 {
		t.Fatalf("watcher ran %d times on DeleteID, want 1", *deleted)
	}

	keys, blocks = fileBlocks(t, c, 3, 2, bs)
	old := backFile(t, c, 3, keys, blocks, bs)
	replaced := watch(old)
	keys, blocks = fileBlocks(t, c, 3, 2, bs)
	next := backFile(t, c, 3, keys, blocks, bs)
	if *replaced != 1 {
		t.Fatalf("watcher ran %d times when a new file replaced it, want 1", *replaced)
	}
	old.Release()
	next.Release()

	loose, err := backing.Build("loose", 10, bs, func(int64) (backing.Block, bool) {
		d := make([]byte, 10)
		return backing.Block{Data: d, Tag: 1, Sum: integrity.Sum(1, d)}, true
	})
	if err != nil {
		t.Fatal(err)
	}
	defer loose.Release()
	if loose.WatchDrop(func() {}) {
		t.Fatal("WatchDrop of a file the tier never adopted reported true")
	}
	checkInvariant(t, c)
}

// TestAdoptBelady: a file needed later than everything Adopt would evict
// is not kept, as Put would not keep it.
func TestAdoptBelady(t *testing.T) {
	const bs = 256 << 10
	next := map[uint64]int64{1: math.MaxInt64, 2: 5}
	c := New(Config{Capacity: 3 << 20, NextUse: func(id uint64) int64 { return next[id] }})
	keys, blocks := fileBlocks(t, c, 1, 4, bs)
	for i := 0; i < 8; i++ {
		c.Put(fmt.Sprintf("soon%d", i), Block{ID: 2, Data: make([]byte, bs), Tag: 2, Sum: integrity.Sum(2, make([]byte, bs))})
	}
	var size int64
	for _, b := range blocks {
		size += int64(len(b.Data))
	}
	f, err := backing.Build("x", size, bs, func(i int64) (backing.Block, bool) {
		return backing.Block{Data: blocks[i].Data, Tag: blocks[i].Tag, Sum: blocks[i].Sum}, true
	})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release()
	c.Delete(keys[0]) // room for some, not all
	for i := 0; i < 4; i++ {
		c.Put(fmt.Sprintf("soon%d", 8+i), Block{ID: 2, Data: make([]byte, bs), Tag: 2, Sum: integrity.Sum(2, make([]byte, bs))})
	}
	if c.Adopt(1, keys, blocks, f) {
		t.Fatal("a file never needed again was adopted over blocks needed soon")
	}
	checkInvariant(t, c)
}
