package ssdstore

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/dlfs/dlfs/integrity"
)

// The stored form: Badger keys (segment, length, file ID, block key) and
// values (header, then data), checked on every read.

const (
	magic      = 0x444c4653 // "DLFS"
	version    = 2          // 1 had the file's size and mtime where the tag is, and a sum over the data alone
	headerSize = 32
)

// Key forms. A block whose file ID is known is stored under 'i', the
// segment, the data length, the ID and the block key; one whose ID is 0
// (unknown) under 's', the segment, the data length and the block key,
// the only form before IDs were kept (such stores still open, their IDs
// unknown). Open rebuilds the index, IDs included, from keys alone.
const (
	formPlain = 's'
	formID    = 'i'
)

// dbKey is the Badger key of a block: its form follows from m.id, so that
// the index entry alone finds the key.
func dbKey(m meta, key string) []byte {
	n := 9
	if m.id != 0 {
		n += 8
	}
	k := make([]byte, n+len(key))
	k[0] = formPlain
	binary.BigEndian.PutUint32(k[1:5], m.seg)
	binary.BigEndian.PutUint32(k[5:9], m.len)
	if m.id != 0 {
		k[0] = formID
		binary.BigEndian.PutUint64(k[9:17], m.id)
	}
	copy(k[n:], key)
	return k
}

// segPrefixes are the prefixes of seg's keys, of either form.
func segPrefixes(seg uint32) [][]byte {
	return [][]byte{dbKey(meta{seg: seg}, "")[:5], dbKey(meta{seg: seg, id: 1}, "")[:5]}
}

// parseKey parses a key of either form; an 'i' key with ID 0 is not one
// dbKey writes, and is refused.
func parseKey(k []byte) (m meta, key string, ok bool) {
	if len(k) < 9 || (k[0] != formPlain && k[0] != formID) {
		return meta{}, "", false
	}
	m = meta{seg: binary.BigEndian.Uint32(k[1:5]), len: binary.BigEndian.Uint32(k[5:9])}
	if k[0] == formPlain {
		return m, string(k[9:]), true
	}
	if len(k) < 17 {
		return meta{}, "", false
	}
	if m.id = binary.BigEndian.Uint64(k[9:17]); m.id == 0 {
		return meta{}, "", false
	}
	return m, string(k[17:]), true
}

// encode returns the stored form of b.
func encode(b Block) []byte {
	v := make([]byte, headerSize+len(b.Data))
	binary.BigEndian.PutUint32(v[0:], magic)
	v[4] = version
	binary.BigEndian.PutUint64(v[8:], b.Tag)
	binary.BigEndian.PutUint32(v[24:], uint32(len(b.Data)))
	binary.BigEndian.PutUint32(v[28:], b.Sum)
	copy(v[headerSize:], b.Data)
	return v
}

// ErrCorrupt means a stored value failed its header or checksum check.
var ErrCorrupt = errors.New("ssdstore: corrupt entry")

// decode parses a stored value. The returned block shares v.
func decode(v []byte) (Block, error) {
	if len(v) < headerSize {
		return Block{}, fmt.Errorf("%w: %d-byte value is shorter than the header", ErrCorrupt, len(v))
	}
	if binary.BigEndian.Uint32(v[0:]) != magic || v[4] != version || v[5]|v[6]|v[7] != 0 ||
		binary.BigEndian.Uint64(v[16:]) != 0 {
		return Block{}, fmt.Errorf("%w: bad magic, version or reserved bytes", ErrCorrupt)
	}
	b := Block{
		Tag:  binary.BigEndian.Uint64(v[8:]),
		Sum:  binary.BigEndian.Uint32(v[28:]),
		Data: v[headerSize:],
	}
	if n := binary.BigEndian.Uint32(v[24:]); int(n) != len(b.Data) {
		return Block{}, fmt.Errorf("%w: header says %d bytes, value holds %d", ErrCorrupt, n, len(b.Data))
	}
	if !integrity.Check(b.Tag, b.Sum, b.Data) {
		return Block{}, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	return b, nil
}
