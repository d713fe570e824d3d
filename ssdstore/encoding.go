package ssdstore

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/dlfs/dlfs/integrity"
)

// The stored form: Badger keys (segment, length, block key) and values
// (header, then data), checked on every read.

const (
	magic      = 0x444c4653 // "DLFS"
	version    = 2          // 1 had the file's size and mtime where the tag is, and a sum over the data alone
	headerSize = 32
)

// dbKey is the Badger key of a block: 's', the segment, the data length
// (so that Open rebuilds the index from keys alone) and the block key.
func dbKey(m meta, key string) []byte {
	k := make([]byte, 9+len(key))
	k[0] = 's'
	binary.BigEndian.PutUint32(k[1:5], m.seg)
	binary.BigEndian.PutUint32(k[5:9], uint32(m.len))
	copy(k[9:], key)
	return k
}

func segPrefix(seg uint32) []byte { return dbKey(meta{seg: seg}, "")[:5] }

func parseKey(k []byte) (m meta, key string, ok bool) {
	if len(k) < 9 || k[0] != 's' {
		return meta{}, "", false
	}
	m = meta{seg: binary.BigEndian.Uint32(k[1:5]), len: int64(binary.BigEndian.Uint32(k[5:9]))}
	return m, string(k[9:]), true
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
