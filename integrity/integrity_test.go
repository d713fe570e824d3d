package integrity

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/dlfs/dlfs/source"
)

// crc32c computes CRC-32C of b by the book, bit by bit (the reflected
// polynomial 0x82F63B78), independently of Sum and of hash/crc32's tables.
func crc32c(b []byte) uint32 {
	crc := ^uint32(0)
	for _, c := range b {
		crc ^= uint32(c)
		for k := 0; k < 8; k++ {
			if crc&1 == 1 {
				crc = crc>>1 ^ 0x82F63B78
			} else {
				crc >>= 1
			}
		}
	}
	return ^crc
}

func TestCRC32CReference(t *testing.T) {
	// The check value of CRC-32C (RFC 3720, appendix B.4).
	if got := crc32c([]byte("123456789")); got != 0xE3069283 {
		t.Fatalf("reference crc32c(123456789) = %#08x, want 0xe3069283", got)
	}
}

// TestSumIsCRC32COfTagThenBytes pins Sum to its documented definition: a
// CRC-32C of the tag (8 bytes, little-endian) followed by the bytes. A Sum
// that drops the tag, the data, or a part of either, fails here.
func TestSumIsCRC32COfTagThenBytes(t *testing.T) {
	tags := []uint64{0, 1, 0x0123456789abcdef, ^uint64(0), 1 << 63}
	datas := [][]byte{nil, {}, {0}, []byte("a"), []byte("hello, block"), make([]byte, 4096)}
	for _, tag := range tags {
		for _, data := range datas {
			var buf []byte
			buf = binary.LittleEndian.AppendUint64(buf, tag)
			buf = append(buf, data...)
			if got, want := Sum(tag, data), crc32c(buf); got != want {
				t.Errorf("Sum(%#x, %d bytes) = %#08x, want crc32c(tag LE ‖ data) = %#08x", tag, len(data), got, want)
			}
		}
	}
}

// TestSumDependsOnTagAndBytes is the rule a tier relies on: the same bytes
// under another tag, or other bytes under the same tag, have another sum.
func TestSumDependsOnTagAndBytes(t *testing.T) {
	data := []byte("the bytes of block 3")
	base := Sum(42, data)
	for bit := 0; bit < 64; bit++ {
		if Sum(42^(1<<bit), data) == base {
			t.Errorf("flipping tag bit %d leaves the sum unchanged", bit)
		}
	}
	if Sum(42, data) != base {
		t.Fatal("Sum is not deterministic")
	}
	if Sum(42, nil) == Sum(43, nil) {
		t.Error("an empty block's sum ignores the tag")
	}
	if Sum(42, data[:len(data)-1]) == base {
		t.Error("a truncated block has the same sum")
	}
	if Sum(42, append(append([]byte(nil), data...), 0)) == base {
		t.Error("a block with a zero byte appended has the same sum")
	}
}

// TestCheckRejects: Check accepts exactly the sum of the bytes under the
// tag, and rejects every single flipped bit, a wrong sum and a wrong tag.
func TestCheckRejects(t *testing.T) {
	const tag = 0xfeedfacecafebeef
	data := []byte("sample 17, block 0: some training bytes")
	sum := Sum(tag, data)
	if !Check(tag, sum, data) {
		t.Fatal("Check rejects the right tag, sum and bytes")
	}
	for i := range data {
		for bit := 0; bit < 8; bit++ {
			bad := append([]byte(nil), data...)
			bad[i] ^= 1 << bit
			if Check(tag, sum, bad) {
				t.Errorf("Check accepts byte %d with bit %d flipped", i, bit)
			}
		}
	}
	for bit := 0; bit < 32; bit++ {
		if Check(tag, sum^(1<<bit), data) {
			t.Errorf("Check accepts the sum with bit %d flipped", bit)
		}
	}
	for bit := 0; bit < 64; bit++ {
		if Check(tag^(1<<bit), sum, data) {
			t.Errorf("Check accepts the tag with bit %d flipped", bit)
		}
	}
	if Check(tag, sum, data[:len(data)-1]) || Check(tag, sum, nil) {
		t.Error("Check accepts truncated bytes")
	}
}

// FuzzCheck: for any tag and bytes, the sum checks, and any change that CRC-32C
// is certain to detect is rejected: a flipped bit in the bytes or the sum,
// or a change of the tag confined to 32 consecutive bits (a burst no longer
// than the CRC's degree).
func FuzzCheck(f *testing.F) {
	f.Add(uint64(0), []byte{}, uint32(0), uint32(1), uint8(0))
	f.Add(uint64(7), []byte("abc"), uint32(9), uint32(0xffffffff), uint8(32))
	f.Fuzz(func(t *testing.T, tag uint64, data []byte, pos, tagDelta uint32, shift uint8) {
		sum := Sum(tag, data)
		if !Check(tag, sum, data) {
			t.Fatalf("Check(%#x, Sum, data) = false", tag)
		}
		if want := crc32c(binary.LittleEndian.AppendUint64(nil, tag)); len(data) == 0 && sum != want {
			t.Fatalf("Sum(%#x, empty) = %#08x, want %#08x", tag, sum, want)
		}
		if len(data) > 0 {
			bad := append([]byte(nil), data...)
			bit := int(pos % uint32(8*len(data)))
			bad[bit/8] ^= 1 << (bit % 8)
			if Check(tag, sum, bad) {
				t.Fatalf("bit %d flipped: Check still true", bit)
			}
		}
		if Check(tag, sum^(1<<(pos%32)), data) {
			t.Fatal("flipped sum bit accepted")
		}
		if tagDelta != 0 {
			other := tag ^ uint64(tagDelta)<<(shift%33)
			if Check(other, sum, data) {
				t.Fatalf("tag %#x accepted for a sum made under %#x", other, tag)
			}
		}
	})
}

// TestTagDependsOnEveryField: a Tag that ignores the dataset, the key, or
// any field of the version would let one of them hand its bytes to another.
func TestTagDependsOnEveryField(t *testing.T) {
	const ds Dataset = 0x1234
	const key = "train/cat/001.jpg#0"
	v := source.Version{Size: 110 << 10, Mtime: 1_700_000_000_000_000_000, Ctime: 1_700_000_000_500_000_000, Ino: 4711}
	base := Tag(ds, key, v)
	if Tag(ds, key, v) != base {
		t.Fatal("Tag is not deterministic")
	}
	changes := map[string]uint64{
		"dataset":        Tag(ds+1, key, v),
		"key":            Tag(ds, key[:len(key)-1]+"1", v),
		"key prefix":     Tag(ds, key[:len(key)-1], v),
		"empty key":      Tag(ds, "", v),
		"size":           Tag(ds, key, source.Version{Size: v.Size + 1, Mtime: v.Mtime, Ctime: v.Ctime, Ino: v.Ino}),
		"mtime":          Tag(ds, key, source.Version{Size: v.Size, Mtime: v.Mtime + 1, Ctime: v.Ctime, Ino: v.Ino}),
		"ctime":          Tag(ds, key, source.Version{Size: v.Size, Mtime: v.Mtime, Ctime: v.Ctime + 1, Ino: v.Ino}),
		"size high byte": Tag(ds, key, source.Version{Size: v.Size | 1<<56, Mtime: v.Mtime, Ctime: v.Ctime, Ino: v.Ino}),
		"dataset high":   Tag(ds|1<<63, key, v),
		// Same values in other fields: the fields are not summed together.
		"mtime⇄ctime": Tag(ds, key, source.Version{Size: v.Size, Mtime: v.Ctime, Ctime: v.Mtime, Ino: v.Ino}),
	}
	// The inode number is this host's alone (FUSE clients number inodes
	// per mount): hosts must agree on the tag whatever it is.
	if Tag(ds, key, source.Version{Size: v.Size, Mtime: v.Mtime, Ctime: v.Ctime, Ino: v.Ino + 1}) != base {
		t.Error("the inode number changes the tag: two hosts would tag one block differently")
	}
	seen := map[uint64]string{base: "base"}
	for name, tag := range changes {
		if tag == base {
			t.Errorf("changing the %s leaves the tag unchanged", name)
		}
		if prev, dup := seen[tag]; dup {
			t.Errorf("changing the %s gives the same tag as %s", name, prev)
		}
		seen[tag] = name
	}
}

// TestTagGolden pins the tag to its definition (FNV-1a 64 over the dataset,
// the key's length and bytes, then size, mtime and ctime, all
// little-endian), so that tags agree across builds and machines: a peer
// checks a block under the tag it computed itself.
func TestTagGolden(t *testing.T) {
	ref := func(ds uint64, key string, v source.Version) uint64 {
		var b []byte
		b = binary.LittleEndian.AppendUint64(b, ds)
		b = binary.LittleEndian.AppendUint64(b, uint64(len(key)))
		b = append(b, key...)
		for _, x := range []uint64{uint64(v.Size), uint64(v.Mtime), uint64(v.Ctime)} {
			b = binary.LittleEndian.AppendUint64(b, x)
		}
		return fnv1a(b)
	}
	cases := []struct {
		ds  uint64
		key string
		v   source.Version
	}{
		{0, "", source.Version{}},
		{1, "a#0", source.Version{Size: 1, Mtime: 2, Ctime: 3, Ino: 4}},
		{^uint64(0), strings.Repeat("x", 300), source.Version{Size: -1, Mtime: -5, Ctime: 1 << 62, Ino: ^uint64(0)}},
	}
	for _, c := range cases {
		if got, want := Tag(Dataset(c.ds), c.key, c.v), ref(c.ds, c.key, c.v); got != want {
			t.Errorf("Tag(%#x, %q, %+v) = %#x, want %#x", c.ds, c.key, c.v, got, want)
		}
	}
}

// fnv1a is FNV-1a 64 by the book.
func fnv1a(b []byte) uint64 {
	h := uint64(0xcbf29ce484222325)
	for _, c := range b {
		h ^= uint64(c)
		h *= 0x100000001b3
	}
	return h
}

func TestFNVReference(t *testing.T) {
	// Published FNV-1a 64 test vectors.
	for in, want := range map[string]uint64{"": 0xcbf29ce484222325, "a": 0xaf63dc4c8601ec8c, "foobar": 0x85944171f73967e8} {
		if got := fnv1a([]byte(in)); got != want {
			t.Errorf("fnv1a(%q) = %#x, want %#x", in, got, want)
		}
		h := newHash()
		for i := 0; i < len(in); i++ {
			h.byte(in[i])
		}
		if h.sum != want {
			t.Errorf("newHash+byte over %q = %#x, want %#x", in, h.sum, want)
		}
	}
}

// TestStrLengthPrefixed: str hashes the length first, so that adjacent
// strings cannot trade bytes ("ab","c" against "a","bc").
func TestStrLengthPrefixed(t *testing.T) {
	a, b := newHash(), newHash()
	a.str("ab")
	a.str("c")
	b.str("a")
	b.str("bc")
	if a.sum == b.sum {
		t.Error(`str("ab")+str("c") == str("a")+str("bc")`)
	}
}

func TestDatasetString(t *testing.T) {
	for d, want := range map[Dataset]string{0: "0000000000000000", 0xabc: "0000000000000abc", ^Dataset(0): "ffffffffffffffff"} {
		if got := d.String(); got != want {
			t.Errorf("Dataset(%#x).String() = %q, want %q", uint64(d), got, want)
		}
	}
}

// A range of a block is checked against the segments it lies in: a change
// in one of them fails it, a change elsewhere does not; a segment's sum is
// bound to the tag and to its place in the block.
func TestCheckRange(t *testing.T) {
	const tag = 0x1234
	data := make([]byte, 3*SegmentBytes+100)
	for i := range data {
		data[i] = byte(i * 7)
	}
	sum, segs := Sum(tag, data), Segments(tag, data)
	if len(segs) != 4 {
		t.Fatalf("%d segments, want 4", len(segs))
	}
	whole := func(lo, hi int) bool { return CheckRange(tag, sum, segs, data, lo, hi) }
	if !whole(0, len(data)) || !whole(SegmentBytes+5, SegmentBytes+10) || !whole(len(data)-1, len(data)) {
		t.Fatal("an intact block fails a range check")
	}
	data[2*SegmentBytes+1] ^= 1
	if whole(2*SegmentBytes, 2*SegmentBytes+2) || whole(SegmentBytes, 3*SegmentBytes) || whole(0, len(data)) {
		t.Error("a range over a changed segment passes")
	}
	if !whole(0, 2*SegmentBytes) || !whole(3*SegmentBytes, len(data)) {
		t.Error("a range over intact segments fails because another segment changed")
	}
	data[2*SegmentBytes+1] ^= 1
	if CheckRange(tag+1, sum, segs, data, 0, 10) {
		t.Error("segments pass under another tag")
	}
	swapped := append([]uint32(nil), segs...)
	swapped[0], swapped[1] = swapped[1], swapped[0]
	if CheckRange(tag, sum, swapped, data, 0, 10) {
		t.Error("a segment's sum passes at another segment's place")
	}
	if whole(-1, 10) || whole(10, len(data)+1) || whole(10, 5) {
		t.Error("a range out of the block passes")
	}
	// Without segments (one segment's worth, or none computed) the whole
	// block is checked.
	small := data[:100]
	if !CheckRange(tag, Sum(tag, small), Segments(tag, small), small, 10, 20) || CheckRange(tag, Sum(tag, small)+1, nil, small, 10, 20) {
		t.Error("a block without segments is not checked whole")
	}
}

func FuzzCheckRange(f *testing.F) {
	f.Add([]byte("abc"), 0, 3, 1)
	f.Fuzz(func(t *testing.T, seed []byte, lo, hi, flip int) {
		if len(seed) == 0 {
			return
		}
		data := make([]byte, 2*SegmentBytes+len(seed))
		for i := range data {
			data[i] = seed[i%len(seed)]
		}
		sum, segs := Sum(7, data), Segments(7, data)
		ok := CheckRange(7, sum, segs, data, lo, hi)
		if ok != (lo >= 0 && hi <= len(data) && lo <= hi) {
			t.Fatalf("range %d-%d of an intact block of %d: %v", lo, hi, len(data), ok)
		}
		if !ok || hi <= lo || flip < lo/SegmentBytes*SegmentBytes || flip >= min(len(data), (hi+SegmentBytes-1)/SegmentBytes*SegmentBytes) {
			return
		}
		data[flip] ^= 0x80
		if CheckRange(7, sum, segs, data, lo, hi) {
			t.Fatalf("byte %d changed in the segments of range %d-%d, and it passed", flip, lo, hi)
		}
	})
}

// Segment sums of another count than data has segments are not the
// block's: CheckRange checks the whole sum instead of trusting them. A
// block cut short after its segments were taken, or a list cut short,
// must not pass on the segments that remain.
func TestCheckRangeWrongCount(t *testing.T) {
	const tag = 0x77
	data := make([]byte, 4*SegmentBytes)
	for i := range data {
		data[i] = byte(i*13 + i>>9)
	}
	sum, segs := Sum(tag, data), Segments(tag, data)
	for _, tc := range []struct {
		name   string
		segs   []uint32
		data   []byte
		lo, hi int
	}{
		{"a block cut short", segs, data[:2*SegmentBytes], 0, SegmentBytes},
		{"a block grown", segs, append(append([]byte(nil), data...), 1), 0, 10},
		{"a list cut short, the range past it", segs[:2], data, 3 * SegmentBytes, 3*SegmentBytes + 10},
		{"a list cut short, the range in it", segs[:2], data, 0, 10},
		{"one segment's sum for a block of four", segs[:1], data, 0, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The whole sum does not hold over these bytes (or holds for
			// the block the segments were not taken from): it decides.
			wantOK := Check(tag, sum, tc.data)
			if got := CheckRange(tag, sum, tc.segs, tc.data, tc.lo, tc.hi); got != wantOK {
				t.Errorf("CheckRange with %d segment sums over %d bytes: %v, want %v (the whole sum's verdict)", len(tc.segs), len(tc.data), got, wantOK)
			}
		})
	}
	// A list cut short over a damaged block: the segments that remain are
	// intact, the damage lies past them.
	bad := append([]byte(nil), data...)
	bad[3*SegmentBytes+1] ^= 1
	if CheckRange(tag, sum, segs[:3], bad, 3*SegmentBytes, len(bad)) || CheckRange(tag, sum, segs[:3], bad, 0, 10) {
		t.Error("a damaged block passed on a list of segment sums cut short")
	}
}

// A range that ends one byte into a segment, or starts on its last byte,
// checks that segment: damage there fails it.
func TestCheckRangeEdges(t *testing.T) {
	const tag = 0x99
	data := make([]byte, 3*SegmentBytes)
	for i := range data {
		data[i] = byte(i * 5)
	}
	sum, segs := Sum(tag, data), Segments(tag, data)
	for _, at := range []int{SegmentBytes, 2*SegmentBytes - 1} {
		data[at] ^= 1
		for _, r := range [][2]int{{at - 5, at + 1}, {at, at + 1}, {at, at + 7}} {
			if CheckRange(tag, sum, segs, data, r[0], r[1]) {
				t.Errorf("byte %d changed, and the range %d-%d over it passed", at, r[0], r[1])
			}
		}
		data[at] ^= 1
	}
}
