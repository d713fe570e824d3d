// Package integrity binds every cached byte to what it claims to be.
//
// # Tags and sums
//
// A block of a sample is cached under its path and block number, but that
// key alone does not say which bytes belong there: another dataset can have
// the same path, the file can have been rewritten, and a misdirected
// pointer in a store can hand one key's value to another. So every block
// carries a Tag, a 64-bit hash of the dataset's identity, the block's key
// and the file's source.Version, and a Sum, a CRC-32C of the tag followed
// by the bytes. A tier returns a block only if its tag is the one the
// reader computes for what it wants, and its sum holds over the bytes it
// returns: on the RAM tier, the stage, the SSD tier and the wire alike.
// Anything else is a miss, never bytes.
//
// The sum is computed once, where the bytes were checked against SOURCE
// (a read that passed the version check, or a packed record whose own
// checksum held), and travels with the bytes from then on: no tier makes
// a fresh sum over bytes it did not check.
//
// # Dataset identity
//
// A Dataset is a hash of SOURCE's filesystem (statfs's f_fsid where the
// filesystem has one, else st_dev), its inode number, and the format it
// is shown as. Nodes gossip it, and a member of another dataset is never
// given a share of this one.
package integrity

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/source"
)

// Dataset identifies one dataset as dlfs shows it.
type Dataset uint64

// String is the identity as gossiped and shown in stats: 16 hex digits.
func (d Dataset) String() string { return fmt.Sprintf("%016x", uint64(d)) }

// DatasetOf returns the identity of the dataset directory dir shown as
// format ("directory", "seqfile", "recordio", "hdf5").
func DatasetOf(dir, format string) (Dataset, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, fmt.Errorf("integrity: stat %s: %w", dir, err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return 0, fmt.Errorf("integrity: statfs %s: %w", dir, err)
	}
	fsid := uint64(uint32(fs.Fsid.Val[0]))<<32 | uint64(uint32(fs.Fsid.Val[1]))
	if fsid == 0 {
		fsid = st.Dev // FUSE and some others report no fsid
	}
	h := newHash()
	h.u64(fsid)
	h.u64(st.Ino)
	h.str(format)
	return Dataset(h.sum), nil
}

// Tag is the tag of the block with key (path and block number) of the
// file at version v in dataset ds.
func Tag(ds Dataset, key string, v source.Version) uint64 {
	h := newHash()
	h.u64(uint64(ds))
	h.str(key)
	h.u64(uint64(v.Size))
	h.u64(uint64(v.Mtime))
	h.u64(uint64(v.Ctime))
	h.u64(v.Ino)
	return h.sum
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Sum is the checksum of data under tag.
func Sum(tag uint64, data []byte) uint32 {
	var t [8]byte
	binary.LittleEndian.PutUint64(t[:], tag)
	return crc32.Update(crc32.Checksum(t[:], castagnoli), castagnoli, data)
}

// Check reports whether sum is data's checksum under tag.
func Check(tag uint64, sum uint32, data []byte) bool { return Sum(tag, data) == sum }

// fnv is FNV-1a, 64-bit: stable across processes and machines (unlike
// hash/maphash), and without allocations.
type fnv struct{ sum uint64 }

func newHash() fnv { return fnv{14695981039346656037} }

func (h *fnv) byte(b byte) {
	h.sum ^= uint64(b)
	h.sum *= 1099511628211
}

func (h *fnv) u64(v uint64) {
	for i := 0; i < 8; i++ {
		h.byte(byte(v >> (8 * i)))
	}
}

// str hashes s and its length, so that fields cannot run into each other.
func (h *fnv) str(s string) {
	h.u64(uint64(len(s)))
	for i := 0; i < len(s); i++ {
		h.byte(s[i])
	}
}
