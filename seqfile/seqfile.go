// Package seqfile is dlfs's format for packing many small samples into a
// few large files (shards), after MXNet's RecordIO and dmlc's InputSplit.
//
// # Layout
//
// A packed dataset is a directory holding shards and one index:
//
//	OUTDIR/shard-00000.seq ... shard-NNNNN.seq
//	OUTDIR/index.seqidx
//
// A shard starts with a 16-byte file header, "DLFSSEQ\x00" then the
// format version (uint32, 1) and 4 zero bytes, followed by records. All
// integers are little-endian. A record is a 40-byte header, the name, the
// payload, and zero bytes up to the next multiple of 4:
//
//	off  size  field
//	  0     4  magic 0x51534C44 ("DLSQ")
//	  4     4  flags, zero (reserved)
//	  8     8  payload length
//	 16     4  mode: file type and permission bits, as st_mode
//	 20     2  name length, 1 to 4096
//	 22     2  zero (reserved)
//	 24     8  mtime, nanoseconds since the epoch
//	 32     4  CRC-32C of the name and the payload
//	 36     4  CRC-32C of bytes 0 to 35 of this header
//
// The name is the sample's slash-separated path relative to the packed
// tree. A symlink's payload is its target. The magic and the header CRC
// let a reader find record boundaries from any byte offset, as InputSplit
// does; the payload CRC catches corrupt data.
//
// # Index
//
// index.seqidx maps every name to its shard, offset and length, so any
// record is reached with one read, and lists the directories, so empty
// ones and their modes survive packing. See Index for its encoding. The
// index is written last, by rename: a directory with a valid index is a
// finished pack.
//
// # Partitions
//
// Index.Split cuts the records into any number of logical partitions of
// about equal bytes, whatever the number of shards, as InputSplit does:
// a partition may span shards, and no record is split.
package seqfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"syscall"
)

// Format constants.
const (
	RecordMagic = 0x51534C44 // "DLSQ" in little-endian byte order
	HeaderSize  = 40         // bytes of a record header
	FileHeader  = 16         // bytes of a shard's file header
	MaxName     = 4096
	MaxTarget   = 4095 // bytes of a symlink's target: PATH_MAX less the NUL
	Version     = 1
	// IndexName is the index's file name in a packed directory.
	IndexName = "index.seqidx"
)

var (
	fileMagic  = [8]byte{'D', 'L', 'F', 'S', 'S', 'E', 'Q', 0}
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

// ErrFormat wraps every error about bytes that are not valid seqfile data.
var ErrFormat = errors.New("seqfile: bad data")

// ShardName is the file name of shard i.
func ShardName(i int) string { return fmt.Sprintf("shard-%05d.seq", i) }

// Header is a decoded record header.
type Header struct {
	Length  int64
	Mode    uint32
	NameLen int
	Mtime   int64
	CRC     uint32 // of name and payload
}

// RecordSize is the bytes a record with this header takes, padding
// included.
func (h Header) RecordSize() int64 { return pad4(HeaderSize + int64(h.NameLen) + h.Length) }

func pad4(n int64) int64 { return (n + 3) &^ 3 }

// encodeHeader writes h into b[:HeaderSize].
func encodeHeader(b []byte, h Header) {
	le := binary.LittleEndian
	le.PutUint32(b[0:], RecordMagic)
	le.PutUint32(b[4:], 0)
	le.PutUint64(b[8:], uint64(h.Length))
	le.PutUint32(b[16:], h.Mode)
	le.PutUint16(b[20:], uint16(h.NameLen))
	le.PutUint16(b[22:], 0)
	le.PutUint64(b[24:], uint64(h.Mtime))
	le.PutUint32(b[32:], h.CRC)
	le.PutUint32(b[36:], crc32.Checksum(b[:36], castagnoli))
}

// DecodeHeader parses a record header. It checks the magic, the reserved
// fields, the header CRC and the field ranges; it never panics.
func DecodeHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: record header of %d bytes, want %d", ErrFormat, len(b), HeaderSize)
	}
	le := binary.LittleEndian
	if m := le.Uint32(b[0:]); m != RecordMagic {
		return Header{}, fmt.Errorf("%w: no record magic (found %#08x)", ErrFormat, m)
	}
	if got, want := le.Uint32(b[36:]), crc32.Checksum(b[:36], castagnoli); got != want {
		return Header{}, fmt.Errorf("%w: record header checksum %#08x, want %#08x", ErrFormat, got, want)
	}
	if le.Uint32(b[4:]) != 0 || le.Uint16(b[22:]) != 0 {
		return Header{}, fmt.Errorf("%w: reserved record header bytes are not zero", ErrFormat)
	}
	h := Header{Length: int64(le.Uint64(b[8:])), Mode: le.Uint32(b[16:]), NameLen: int(le.Uint16(b[20:])),
		Mtime: int64(le.Uint64(b[24:])), CRC: le.Uint32(b[32:])}
	if h.Length < 0 || h.Length > 1<<40 {
		return Header{}, fmt.Errorf("%w: record length %d", ErrFormat, h.Length)
	}
	if h.NameLen == 0 || h.NameLen > MaxName {
		return Header{}, fmt.Errorf("%w: record name length %d (1 to %d)", ErrFormat, h.NameLen, MaxName)
	}
	if t := h.Mode & syscall.S_IFMT; t != syscall.S_IFREG && t != syscall.S_IFLNK {
		return Header{}, fmt.Errorf("%w: record mode %#o is neither a file nor a symlink", ErrFormat, h.Mode)
	}
	if h.Mode&syscall.S_IFMT == syscall.S_IFLNK && h.Length > MaxTarget {
		return Header{}, fmt.Errorf("%w: symlink record with a target of %d bytes (at most %d)", ErrFormat, h.Length, MaxTarget)
	}
	return h, nil
}

// Record is one sample read back from a shard.
type Record struct {
	Header
	Name string
	Data []byte
}

// ReadRecord reads and checks the record at off in r, a shard of size
// bytes. Errors name the offset; the caller adds the file.
func ReadRecord(r io.ReaderAt, size, off int64) (Record, error) {
	if off < FileHeader || off > size-HeaderSize {
		return Record{}, fmt.Errorf("%w: offset %d: no room for a record header in %d bytes", ErrFormat, off, size)
	}
	var hb [HeaderSize]byte
	if _, err := r.ReadAt(hb[:], off); err != nil {
		return Record{}, fmt.Errorf("offset %d: %w", off, err)
	}
	h, err := DecodeHeader(hb[:])
	if err != nil {
		return Record{}, fmt.Errorf("offset %d: %w", off, err)
	}
	end := off + HeaderSize + int64(h.NameLen) + h.Length
	if end > size {
		return Record{}, fmt.Errorf("%w: offset %d: record of %d bytes runs past the end of the file (%d bytes); the shard is truncated",
			ErrFormat, off, end-off, size)
	}
	body := make([]byte, int64(h.NameLen)+h.Length)
	if _, err := r.ReadAt(body, off+HeaderSize); err != nil {
		return Record{}, fmt.Errorf("offset %d: %w", off, err)
	}
	if got := crc32.Checksum(body, castagnoli); got != h.CRC {
		return Record{}, fmt.Errorf("%w: offset %d: record checksum %#08x, want %#08x; the shard is corrupt", ErrFormat, off, got, h.CRC)
	}
	return Record{Header: h, Name: string(body[:h.NameLen]), Data: body[h.NameLen:]}, nil
}

// RecordCRC is a record's checksum: CRC-32C of its name, then its payload.
func RecordCRC(name string, data []byte) uint32 {
	return crc32.Update(crc32.Checksum([]byte(name), castagnoli), castagnoli, data)
}

// UpdateCRC continues a record checksum started by RecordCRC with more
// payload bytes.
func UpdateCRC(sum uint32, data []byte) uint32 { return crc32.Update(sum, castagnoli, data) }
