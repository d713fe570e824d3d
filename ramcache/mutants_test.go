package ramcache

import (
	"fmt"
	"testing"

	"github.com/dlfs/dlfs/backing"
	"github.com/dlfs/dlfs/integrity"
)

// Tests written against bugs planted by hand (issue 39, item 15): each
// fails with one of them in place.

// beladyCache is a cache of room for n blocks of 100 bytes whose oracle
// says every block with ID id is next needed at next[id].
func beladyCache(n int, next map[uint64]int64) (*Cache, func(key string, id uint64) bool) {
	c := New(Config{Capacity: int64(n) * cost(blk(100)), NextUse: func(id uint64) int64 { return next[id] }})
	return c, func(key string, id uint64) bool {
		b := blk(100)
		b.ID = id
		return c.Put(key, b)
	}
}

// A block needed exactly as soon as the block Belady would evict is
// admitted: only one needed strictly later is refused.
func TestBeladyAdmitsATie(t *testing.T) {
	c, put := beladyCache(3, map[uint64]int64{1: 5, 2: 9})
	for _, k := range []string{"a", "b", "c"} {
		put(k, 1)
	}
	if !put("d", 1) || !c.Contains("d") {
		t.Error("a block needed as soon as every cached one was refused")
	}
	if put("e", 2) || c.Contains("e") {
		t.Error("a block needed later than every cached one was admitted")
	}
	checkInvariant(t, c)
}

// Among blocks needed equally soon, the least recently used goes first,
// every time (the candidates compared include a random sample, which must
// not break a tie).
func TestBeladyTiesGoToTheLeastRecent(t *testing.T) {
	const n = candidates
	c, put := beladyCache(n, map[uint64]int64{1: 5})
	for i := 0; i < n; i++ {
		put(fmt.Sprint(i), 1)
	}
	for i := 0; i < 10; i++ {
		if !put(fmt.Sprint(n+i), 1) {
			t.Fatalf("put %d refused", n+i)
		}
		for j := i; j < n+i+1; j++ {
			if c.Contains(fmt.Sprint(j)) != (j > i) {
				t.Fatalf("after put %d: block %d cached %v; want the least recent, %d, evicted and no other", n+i, j, c.Contains(fmt.Sprint(j)), i)
			}
		}
	}
	checkInvariant(t, c)
}

// A block larger than the whole capacity is refused before anything is
// evicted for it: the tier keeps what it holds.
func TestHugeBlockEvictsNothing(t *testing.T) {
	for _, oracle := range []bool{false, true} {
		t.Run(fmt.Sprint("oracle ", oracle), func(t *testing.T) {
			cfg := Config{Capacity: 3 * cost(blk(100))}
			if oracle {
				cfg.NextUse = func(id uint64) int64 { return int64(id) }
			}
			c := New(cfg)
			for _, k := range []string{"a", "b", "c"} {
				c.Put(k, blk(100))
			}
			huge := blk(int(2 * cfg.Capacity))
			if c.Put("huge", huge) {
				t.Fatal("a block of twice the capacity was kept")
			}
			for _, k := range []string{"a", "b", "c"} {
				if !c.Contains(k) {
					t.Errorf("%s was evicted for a block that could never fit", k)
				}
			}
			checkInvariant(t, c)
		})
	}
}

// A block whose tag is not the one asked for is a miss even if its sum
// holds under the asked tag: Get checks both (the tag names what the
// bytes are; the sum only that they are intact).
func TestTagCheckedBesideSum(t *testing.T) {
	c := New(Config{Capacity: 1 << 20})
	d := []byte("the bytes of another version")
	const stored, asked = 0x100, 0x200
	c.Put("k", Block{Data: d, Tag: stored, Sum: integrity.Sum(asked, d)})
	if _, ok := c.Get("k", asked); ok {
		t.Error("a block tagged for another version was returned because its sum held under the asked tag")
	}
	if c.Contains("k") {
		t.Error("the block of another version was not dropped")
	}
	checkInvariant(t, c)
}

// The block needed furthest ahead is found among the candidates nearest
// the LRU end, not only by the random sample: among many blocks, one
// fifth from the LRU end and needed last goes first.
func TestBeladyLooksPastTheTail(t *testing.T) {
	const n = 4000 // the random sample finds one block in 250
	next := map[uint64]int64{1: 5, 2: 1 << 40, 3: 0}
	c, put := beladyCache(n, next)
	for i := 0; i < n; i++ {
		id := uint64(1)
		if i == 4 {
			id = 2
		}
		put(fmt.Sprint(i), id)
	}
	if !put("new", 3) {
		t.Fatal("a block needed at once was refused")
	}
	if c.Contains("4") || !c.Contains("0") {
		t.Errorf("evicted: the least recent %v, the one needed last (fifth from the LRU end) %v; want the latter alone",
			!c.Contains("0"), !c.Contains("4"))
	}
	checkInvariant(t, c)
}

// Adopt refuses keys that are not distinct (two keys of one hash could not
// share an entry), and changes nothing.
func TestAdoptRefusesRepeatedKeys(t *testing.T) {
	const bs = 256 << 10
	c := New(Config{Capacity: 8 << 20})
	keys, blocks := fileBlocks(t, c, 1, 2, bs)
	f, err := backing.Build(keys[0], int64(len(blocks[0].Data)*2), bs, func(int64) (backing.Block, bool) {
		return backing.Block{Data: blocks[0].Data, Tag: blocks[0].Tag, Sum: blocks[0].Sum}, true
	})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release()
	if c.Adopt(1, []string{keys[0], keys[0]}, []Block{blocks[0], blocks[0]}, f) {
		t.Fatal("a file adopted under one key twice")
	}
	if st := c.Stats(); st.Backing.Files != 0 || !c.Contains(keys[0]) || !c.Contains(keys[1]) {
		t.Errorf("a refused Adopt changed the tier: %+v", st.Backing)
	}
	checkInvariant(t, c)
}

// A new backing file for a file ID replaces the one the tier held, even
// when no key is shared between them (the file's version changed its
// blocks): one file, the new one, counted once.
func TestAdoptReplacesTheOldFile(t *testing.T) {
	const bs = 256 << 10
	c := New(Config{Capacity: 8 << 20})
	keys, blocks := fileBlocks(t, c, 1, 3, bs)
	old := backFile(t, c, 1, keys, blocks, bs)
	defer old.Release()
	keys2, blocks2 := fileBlocks(t, c, 9, 2, bs) // other keys and tags...
	for i := range blocks2 {
		blocks2[i].ID = 1 // ...of the same file ID
	}
	next := backFile(t, c, 1, keys2, blocks2, bs)
	defer next.Release()
	st := c.Stats()
	if st.Backing.Files != 1 || st.Backing.Bytes != next.Pages() || c.Contains(keys[0]) {
		t.Errorf("after a new file for ID 1: %+v, the old file's block cached %v; want the new file alone", st.Backing, c.Contains(keys[0]))
	}
	checkInvariant(t, c)
}

// Open backing files the tier let go of can hold all its room: a Put
// then evicts what it can and is refused, with nothing left to evict
// (never a victim taken from an empty ring).
func TestPutWhenOpenFilesHoldTheRoom(t *testing.T) {
	const bs = 256 << 10
	c := New(Config{Capacity: 2 << 20})
	keys, blocks := fileBlocks(t, c, 1, 8, bs) // 1.875 MiB
	f := backFile(t, c, 1, keys, blocks, bs)   // this reference is an open's
	defer f.Release()
	c.DeleteID(1) // let go of while open: its pages stay counted
	if c.Stats().Backing.EvictedOpenBytes == 0 {
		t.Fatal("no evicted-open bytes after DeleteID of an open file")
	}
	if c.Put("late", blk(bs)) {
		t.Error("a block kept past the room that open files hold")
	}
	if st := c.Stats(); st.Bytes+st.Backing.EvictedOpenBytes > st.Capacity {
		t.Errorf("%d bytes and %d evicted-open bytes exceed the capacity %d", st.Bytes, st.Backing.EvictedOpenBytes, st.Capacity)
	}
	checkInvariant(t, c)
}
