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
// The tag binds the part of a file's version that every host mounting
// the PFS sees alike: size, mtime and ctime (both in ns). The inode number
// is left out: FUSE clients without use_ino number inodes per mount, so
// two hosts would tag one block differently. Each host still checks its
// whole source.Version, inode included, before and after every read of
// SOURCE, and a refresh that sees any part change drops the file's blocks
// from its tiers.
//
// # Dataset identity
//
// A Dataset is what every host computes alike for one dataset, whatever
// its mount path, device number or inode numbering (Identifier): the
// operator's --dataset-id, or a hash of the format and of the paths,
// shared versions and first 4 KiB of the dataset's 32 oldest files. Nodes
// gossip it, and a member of another dataset is never given a share of
// this one.
//
// Drawing it from the oldest files by ctime keeps it stable while a
// dataset grows (a new file's ctime is now, whatever mtime its writer
// gives it) and across refreshes; a file of the 32 that is renamed,
// chmod'ed or rewritten moves its ctime, and so the identity, as a
// change of its bytes would. It separates datasets by
// their bytes, and by ctime, which the filesystem sets on every create
// and write and no user can set: a copy of a dataset, even with names,
// sizes and mtimes kept, has new ctimes, though at a filesystem's ctime
// granularity (a jiffy on ext4) two copies made at once may not; their
// heads then still differ. Two datasets that agreed on all of it would
// still never exchange a block whose file's version differs, since every
// tag binds it.
//
// MountOf is the other identity: of SOURCE as this host mounts it, for
// state only this host keeps (the saved catalog, which holds inode
// numbers).
package integrity

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/dlfs/dlfs/source"
)

// Dataset identifies one dataset as dlfs shows it.
type Dataset uint64

// String is the identity as gossiped and shown in stats: 16 hex digits.
func (d Dataset) String() string { return fmt.Sprintf("%016x", uint64(d)) }

// Tag is the tag of the block with key (path and block number) of the
// file at version v in dataset ds. It binds v's size, mtime and ctime,
// not its inode number (see the package doc).
func Tag(ds Dataset, key string, v source.Version) uint64 {
	h := newHash()
	h.u64(uint64(ds))
	h.str(key)
	h.u64(uint64(v.Size))
	h.u64(uint64(v.Mtime))
	h.u64(uint64(v.Ctime))
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

// SegmentBytes is the span of one segment sum. A block is served in
// pieces (the kernel's page-cache reads of a FUSE file come 128 KiB at a
// time here), and checking the whole block for each piece checked a 1 MiB
// block eight times: the CRC pass over cold memory was most of the CPU of
// a read from RAM or from read-ahead.
const SegmentBytes = 128 << 10

// Segments returns the sums of data's segments of SegmentBytes under tag,
// each bound to its index in the block, so that a read of part of the
// block checks only the segments it lies in (CheckRange). Data of one
// segment has none: its Sum covers it. Taken from bytes just checked
// against their Sum (or just read from SOURCE), they are as good as it.
func Segments(tag uint64, data []byte) []uint32 {
	if len(data) <= SegmentBytes {
		return nil
	}
	out := make([]uint32, (len(data)+SegmentBytes-1)/SegmentBytes)
	for k := range out {
		out[k] = Sum(segmentTag(tag, k), data[k*SegmentBytes:min((k+1)*SegmentBytes, len(data))])
	}
	return out
}

// segmentTag binds a segment's sum to its index as well as to tag.
func segmentTag(tag uint64, k int) uint64 { return tag ^ uint64(k+1)*0x9e3779b97f4a7c15 }

// CheckRange reports whether data[lo:hi] is intact: against segs, the
// Segments of data, when it has them, otherwise against sum over all of
// data. A range out of data's bounds is not intact.
func CheckRange(tag uint64, sum uint32, segs []uint32, data []byte, lo, hi int) bool {
	if lo < 0 || hi > len(data) || lo > hi {
		return false
	}
	if len(segs) == 0 || len(segs) != (len(data)+SegmentBytes-1)/SegmentBytes {
		return Check(tag, sum, data)
	}
	for k := lo / SegmentBytes; k < len(segs) && (k*SegmentBytes < hi || k == lo/SegmentBytes); k++ {
		if Sum(segmentTag(tag, k), data[k*SegmentBytes:min((k+1)*SegmentBytes, len(data))]) != segs[k] {
			return false
		}
	}
	return true
}

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
