package ramcache

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/dlfs/dlfs/integrity"
)

// keyed is the block for key: n bytes that only key's block holds.
func keyed(key string, n int) Block {
	d := make([]byte, n)
	seed := integrity.Sum(7, []byte(key))
	for i := range d {
		d[i] = byte(seed>>(i%4*8)) + byte(i)
	}
	tag := uint64(seed)<<8 | 2
	return Block{Data: d, Tag: tag, Sum: integrity.Sum(tag, d)}
}

// TestPacked: small blocks go into chunks, which the tier counts whole.
func TestPacked(t *testing.T) {
	c := New(Config{Capacity: 64 << 20})
	if c.slabs.size != maxChunk || c.slabs.max != 32<<10 {
		t.Fatalf("chunk %d, largest packed block %d", c.slabs.size, c.slabs.max)
	}
	var want []Block
	for i := range 3000 {
		b := keyed(fmt.Sprint(i), 256+i%1800)
		want = append(want, b)
		if !c.Put(fmt.Sprint(i), b) {
			t.Fatalf("block %d not kept", i)
		}
	}
	for i, w := range want {
		got, ok := c.Get(fmt.Sprint(i), w.Tag)
		if !ok || !bytes.Equal(got.Data, w.Data) || &got.Data[0] == &w.Data[0] {
			t.Fatalf("block %d: got %v, equal %v, not copied into a chunk", i, ok, bytes.Equal(got.Data, w.Data))
		}
	}
	st := c.Stats()
	if st.Chunks < 2 || st.Bytes != 3000*overhead+st.Chunks*maxChunk {
		t.Errorf("%d chunks, %d bytes", st.Chunks, st.Bytes)
	}
	big := keyed("big", 40<<10) // larger than a 32nd of a chunk: on its own
	c.Put("big", big)
	if got, ok := c.Get("big", big.Tag); !ok || &got.Data[0] != &big.Data[0] {
		t.Error("a large block was copied")
	}
	empty := keyed("empty", 0)
	if !c.Put("empty", empty) {
		t.Error("an empty block was not kept")
	}
	if got, ok := c.Get("empty", empty.Tag); !ok || len(got.Data) != 0 {
		t.Error("the empty block was lost")
	}
	checkInvariant(t, c)
}

// TestDamagedPackedBlockIsMiss: bytes changed in a chunk are a miss.
func TestDamagedPackedBlockIsMiss(t *testing.T) {
	c := New(Config{Capacity: 64 << 20})
	b := keyed("k", 1000)
	c.Put("k", b)
	c.Put("j", keyed("j", 1000))
	got, _ := c.Get("k", b.Tag)
	got.Data[999] ^= 1 // the chunk's copy
	if _, ok := c.Get("k", b.Tag); ok {
		t.Fatal("a damaged block was returned")
	}
	if _, ok := c.Get("j", keyed("j", 1000).Tag); !ok {
		t.Error("its neighbour was lost")
	}
	checkInvariant(t, c)
}

// TestChurn fills a small tier many times over with random blocks and
// deletes, checking every hit's bytes, the bookkeeping, that compaction
// runs and that the dead bytes it leaves do not crowd out the blocks.
func TestChurn(t *testing.T) {
	const capacity = 8 << 20 // 128 KiB chunks, blocks up to 4 KiB packed
	c := New(Config{Capacity: capacity})
	rng := rand.New(rand.NewPCG(1, 2))
	size := func(k int) int { return 1 + (k*7919)%(6<<10) } // some too large to pack
	for i := range 60_000 {
		k := rng.IntN(20_000)
		key := fmt.Sprint(k)
		switch r := rng.IntN(10); {
		case r < 5:
			c.Put(key, keyed(key, size(k)))
		case r < 9:
			w := keyed(key, size(k))
			if got, ok := c.Get(key, w.Tag); ok && !bytes.Equal(got.Data, w.Data) {
				t.Fatalf("step %d: wrong bytes for %s", i, key)
			}
		default:
			c.Delete(key)
		}
		if i%5000 == 0 {
			checkInvariant(t, c)
		}
	}
	checkInvariant(t, c)
	st := c.Stats()
	if st.Compactions == 0 {
		t.Error("never compacted")
	}
	// What the chunks hold for blocks: at least 3/4 of the capacity, less
	// the dead share and a chunk's worth of headroom.
	c.mu.Lock()
	var data int64
	for _, it := range c.items {
		data += int64(len(it.b.Data))
	}
	c.mu.Unlock()
	if data < capacity*3/4 {
		t.Errorf("the tier holds %d bytes of blocks in %d (%d dead, %d chunks)", data, capacity, st.DeadBytes, st.Chunks)
	}
	t.Logf("%d entries, %d bytes of blocks, %d dead, %d chunks, %d compactions", st.Entries, data, st.DeadBytes, st.Chunks, st.Compactions)
}

// TestReaderKeepsItsBytes: a block got before its chunk is compacted or
// dropped still holds its bytes, and they still check.
func TestReaderKeepsItsBytes(t *testing.T) {
	c := New(Config{Capacity: 4 << 20})
	first := keyed("first", 900)
	c.Put("first", first)
	got, ok := c.Get("first", first.Tag)
	if !ok {
		t.Fatal("missing")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 50_000 {
		key := fmt.Sprint(rng.IntN(6000))
		c.Put(key, keyed(key, 500+i%1500))
		if i%3 == 0 {
			c.Delete(fmt.Sprint(rng.IntN(6000)))
		}
	}
	if c.Stats().Compactions == 0 || c.Contains("first") {
		t.Fatalf("the test did not move or evict the block (compactions %d)", c.Stats().Compactions)
	}
	if !bytes.Equal(got.Data, first.Data) || !integrity.Check(first.Tag, first.Sum, got.Data) {
		t.Error("a reader's block changed under it")
	}
	checkInvariant(t, c)
}

// TestConcurrentPacked runs readers against writers that compact.
func TestConcurrentPacked(t *testing.T) {
	c := New(Config{Capacity: 4 << 20})
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 8000 {
				k := (i*(g+3) + g) % 4000
				key := fmt.Sprint(k)
				w := keyed(key, 100+k%1900)
				if g%2 == 0 {
					c.Put(key, w)
				} else if got, ok := c.Get(key, w.Tag); ok && !bytes.Equal(got.Data, w.Data) {
					t.Error("wrong bytes")
					return
				}
			}
		}()
	}
	wg.Wait()
	checkInvariant(t, c)
}

// TestEmptyOpenChunkIsDropped: an open chunk whose blocks were all
// dropped is let go, not closed, when the next block does not fit.
func TestEmptyOpenChunkIsDropped(t *testing.T) {
	c := New(Config{Capacity: 64 << 20})
	for i := range 34 { // 34 blocks of 30 KiB and their headers fill one chunk
		c.Put(fmt.Sprint(i), keyed(fmt.Sprint(i), 30<<10))
	}
	for i := range 34 {
		c.Delete(fmt.Sprint(i))
	}
	c.Put("next", keyed("next", 30<<10))
	if st := c.Stats(); st.Chunks != 1 || st.Bytes != overhead+maxChunk {
		t.Errorf("%d chunks, %d bytes", st.Chunks, st.Bytes)
	}
	checkInvariant(t, c)
}

// BenchmarkPutChurn puts random 256 B–2 KB blocks over a key space twice
// the tier's size, so that blocks are evicted at random and chunks are
// compacted: the cost of a Put in a full tier, compaction included.
func BenchmarkPutChurn(b *testing.B) {
	const capacity = 64 << 20
	c := New(Config{Capacity: capacity})
	keys := 2 * capacity / 1200
	blocks := make([]Block, 1024)
	for i := range blocks {
		blocks[i] = keyed(fmt.Sprint(i), 256+i*1792/len(blocks))
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range keys { // fill first
		c.Put(fmt.Sprint(i), blocks[i%len(blocks)])
	}
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprint(i)
	}
	before := c.Stats().Compactions
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := rng.IntN(keys)
		c.Put(names[k], blocks[k%len(blocks)])
	}
	st := c.Stats()
	b.ReportMetric(float64(st.Compactions-before)*1000/float64(b.N), "compactions/1kput")
	b.ReportMetric(float64(st.DeadBytes)/capacity*100, "dead%")
}
