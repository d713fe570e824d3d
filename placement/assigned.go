package placement

import (
	"cmp"
	"math/bits"
	"strings"
)

// The keys demand placed away from their buckets' owners, kept for a
// million samples and more: a slice sorted by key hash, and an open-
// addressing index over it by the same hash. Making it sorts one slice
// and fills one array (no map of strings, no allocation per key);
// comparing two tables, or listing what moved between them, is one
// sequential walk over both; Owner costs the key's hash, which it needs
// for its bucket anyway, and a probe or two.

// assigned is one key demand placed away from its bucket's owner.
type assigned struct {
	key   string
	hash  uint64 // fnv64a("", key): the key's bucket and its index slot
	size  int64  // the sample's size, as Assign was given it
	owner int32
}

// demandIndex holds a table's assigned keys. Immutable once made.
type demandIndex struct {
	keys  []assigned // sorted by hash, then key
	slots []int32    // index+1 into keys, or 0; len a power of two, at least twice len(keys)
}

// newDemandIndex indexes keys, sorted by hash, then key.
func newDemandIndex(keys []assigned) demandIndex {
	if len(keys) == 0 {
		return demandIndex{}
	}
	n := 1 << bits.Len(uint(2*len(keys)-1)) // a power of two, at least 2 len(keys)
	x := demandIndex{keys: keys, slots: make([]int32, n)}
	mask := uint64(n - 1)
	for i := range keys {
		s := keys[i].hash & mask
		for x.slots[s] != 0 {
			s = (s + 1) & mask
		}
		x.slots[s] = int32(i + 1)
	}
	return x
}

// find returns the entry of the key whose hash is kh, or nil.
func (x *demandIndex) find(key string, kh uint64) *assigned {
	if len(x.slots) == 0 {
		return nil
	}
	mask := uint64(len(x.slots) - 1)
	for s := kh & mask; x.slots[s] != 0; s = (s + 1) & mask {
		if a := &x.keys[x.slots[s]-1]; a.hash == kh && a.key == key {
			return a
		}
	}
	return nil
}

// AssignedDiff calls fn for every key that a or b (tables over any
// members) assigns by demand, once each, in an order both share: with its
// bucket, its owner in a and in b (each table's member index), and
// whether each assigns it. It hashes no key: a merge of the two sorted
// lists.
func AssignedDiff(a, b *Table, fn func(key string, bucket, aOwner, bOwner int, inA, inB bool)) {
	ak, bk := a.demand.keys, b.demand.keys
	i, j := 0, 0
	for i < len(ak) || j < len(bk) {
		c := 0
		switch {
		case i == len(ak):
			c = 1
		case j == len(bk):
			c = -1
		default:
			if c = cmp.Compare(ak[i].hash, bk[j].hash); c == 0 && ak[i].key != bk[j].key { // == compares the pointers first
				c = strings.Compare(ak[i].key, bk[j].key)
			}
		}
		switch {
		case c < 0:
			x := &ak[i]
			bucket := bucketOf(x.hash)
			fn(x.key, bucket, int(x.owner), b.BucketOwner(bucket), true, false)
			i++
		case c > 0:
			y := &bk[j]
			bucket := bucketOf(y.hash)
			fn(y.key, bucket, a.BucketOwner(bucket), int(y.owner), false, true)
			j++
		default:
			x, y := &ak[i], &bk[j]
			fn(x.key, bucketOf(x.hash), int(x.owner), int(y.owner), true, true)
			i++
			j++
		}
	}
}
