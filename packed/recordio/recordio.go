// Package recordio reads MXNet's binary RecordIO (dmlc-core), as written by
// im2rec: the image records that dlfs shows as per-sample files.
//
// # Format
//
// A .rec file is a sequence of records. Each is a 4-byte magic
// (0xced7230a), a 4-byte lrecord whose top 3 bits are the continuation
// flag and low 29 bits the length, the data, and zero padding to a
// multiple of 4. All integers are little-endian. A record whose data held
// the magic at a 4-byte-aligned position was split there by the writer
// into parts (flag 1 for the first, 2 for middle parts, 3 for the last;
// 0 is a whole record), the magic itself dropped; a reader joins the
// parts with the magic between them.
//
// im2rec's data starts with an IRHeader: flag (uint32), label (float32),
// id (uint64), id2 (uint64). When flag > 0, flag float32 labels follow
// and the header's label is unused. The image bytes are the rest.
package recordio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Format constants.
const (
	Magic        = 0xced7230a
	HeaderSize   = 8  // magic and lrecord
	IRHeaderSize = 24 // flag, label, id, id2
	MaxLength    = 1<<29 - 1
)

// ErrFormat wraps every error about bytes that are not valid RecordIO.
var ErrFormat = errors.New("recordio: bad data")

// Part is one physical record: a whole record or a part of a split one.
type Part struct {
	Offset int64 // of the record header
	Flag   uint32
	Length int64 // data bytes, padding excluded
}

// Next is the offset of the record after p.
func (p Part) Next() int64 { return p.Offset + HeaderSize + (p.Length+3)&^3 }

// DecodeHeader parses the 8-byte record header at off (off only names
// the place in errors).
func DecodeHeader(b []byte, off int64) (Part, error) {
	if len(b) < HeaderSize {
		return Part{}, fmt.Errorf("%w: offset %d: %d bytes left, want a record header of %d", ErrFormat, off, len(b), HeaderSize)
	}
	if m := binary.LittleEndian.Uint32(b); m != Magic {
		return Part{}, fmt.Errorf("%w: offset %d: no record magic (found %#08x)", ErrFormat, off, m)
	}
	lrec := binary.LittleEndian.Uint32(b[4:])
	p := Part{Offset: off, Flag: lrec >> 29, Length: int64(lrec & MaxLength)}
	if p.Flag > 3 {
		return Part{}, fmt.Errorf("%w: offset %d: continuation flag %d", ErrFormat, off, p.Flag)
	}
	return p, nil
}

// Record is one logical record: its parts, and the length of its data
// once joined.
type Record struct {
	Parts  []Part
	Length int64
}

// Offset is where the record starts.
func (r Record) Offset() int64 { return r.Parts[0].Offset }

// Next is the offset of the record after r.
func (r Record) Next() int64 { return r.Parts[len(r.Parts)-1].Next() }

// Contiguous reports whether the record's data lies in one piece in the
// file (a whole record), at DataOffset.
func (r Record) Contiguous() bool { return len(r.Parts) == 1 }

// DataOffset is the offset of a whole record's data.
func (r Record) DataOffset() int64 { return r.Parts[0].Offset + HeaderSize }

// maxParts bounds a split record's parts, so a crafted file cannot make
// a reader loop for ever on a chain of tiny parts.
const maxParts = 1 << 20

// ReadRecord reads the record headers of the logical record at off in a
// file of size bytes (not its data).
func ReadRecord(r io.ReaderAt, size, off int64) (Record, error) {
	var rec Record
	var hb [HeaderSize]byte
	for {
		if off < 0 || off+HeaderSize > size {
			return Record{}, fmt.Errorf("%w: offset %d: the file ends (%d bytes) inside a record; it is truncated", ErrFormat, off, size)
		}
		if n, err := r.ReadAt(hb[:], off); err != nil && !(err == io.EOF && n == HeaderSize) {
			return Record{}, fmt.Errorf("offset %d: %w", off, err)
		}
		p, err := DecodeHeader(hb[:], off)
		if err != nil {
			return Record{}, err
		}
		if off+HeaderSize+p.Length > size {
			return Record{}, fmt.Errorf("%w: offset %d: record of %d bytes runs past the end of the file (%d bytes); it is truncated",
				ErrFormat, off, p.Length, size)
		}
		first := len(rec.Parts) == 0
		switch {
		case first && (p.Flag == 0 || p.Flag == 1):
		case !first && (p.Flag == 2 || p.Flag == 3):
			rec.Length += 4 // the magic dropped between parts
		default:
			return Record{}, fmt.Errorf("%w: offset %d: continuation flag %d out of sequence", ErrFormat, off, p.Flag)
		}
		rec.Parts = append(rec.Parts, p)
		rec.Length += p.Length
		if p.Flag == 0 || p.Flag == 3 {
			return rec, nil
		}
		if len(rec.Parts) >= maxParts {
			return Record{}, fmt.Errorf("%w: offset %d: a record of more than %d parts", ErrFormat, rec.Offset(), maxParts)
		}
		off = p.Next()
	}
}

// ReadData reads the joined data of rec.
func ReadData(r io.ReaderAt, rec Record) ([]byte, error) {
	out := make([]byte, 0, rec.Length)
	for i, p := range rec.Parts {
		if i > 0 {
			out = binary.LittleEndian.AppendUint32(out, Magic)
		}
		n := len(out)
		out = out[:n+int(p.Length)]
		if p.Length == 0 {
			continue
		}
		if got, err := r.ReadAt(out[n:], p.Offset+HeaderSize); err != nil && !(err == io.EOF && got == int(p.Length)) {
			return nil, fmt.Errorf("offset %d: %w", p.Offset, err)
		}
	}
	return out, nil
}

// IRHeader is im2rec's image record header.
type IRHeader struct {
	Flag   uint32
	Label  float32
	ID     uint64
	ID2    uint64
	Labels []float32 // when Flag > 0
}

// Size is the bytes the header takes at the start of a record's data.
func (h IRHeader) Size() int64 { return IRHeaderSize + 4*int64(h.Flag) }

// FirstLabel is the label a classifier uses: Label, or the first of
// Labels when there are several.
func (h IRHeader) FirstLabel() float32 {
	if h.Flag > 0 && len(h.Labels) > 0 {
		return h.Labels[0]
	}
	return h.Label
}

// DecodeIRHeader parses the IRHeader at the start of a record's data of
// dataLen bytes; b holds at least its first IRHeaderSize bytes and, for
// a label vector, as many of the labels as the caller read.
func DecodeIRHeader(b []byte, dataLen int64) (IRHeader, error) {
	if len(b) < IRHeaderSize || dataLen < IRHeaderSize {
		return IRHeader{}, fmt.Errorf("%w: record of %d bytes is too short for an image header (%d)", ErrFormat, dataLen, IRHeaderSize)
	}
	le := binary.LittleEndian
	h := IRHeader{Flag: le.Uint32(b), Label: math.Float32frombits(le.Uint32(b[4:])), ID: le.Uint64(b[8:]), ID2: le.Uint64(b[16:])}
	if h.Size() > dataLen {
		return IRHeader{}, fmt.Errorf("%w: image header with %d labels does not fit in a record of %d bytes", ErrFormat, h.Flag, dataLen)
	}
	for i := 0; i < int(h.Flag) && IRHeaderSize+4*(i+1) <= len(b); i++ {
		h.Labels = append(h.Labels, math.Float32frombits(le.Uint32(b[IRHeaderSize+4*i:])))
	}
	return h, nil
}

// IndexEntry is one line of an im2rec .idx file: a record's key and the
// offset of its first part in the .rec file.
type IndexEntry struct {
	Key    uint64
	Offset int64
}

// ParseIndex parses an im2rec .idx file: one "KEY<TAB>OFFSET" line per
// record. It never panics; errors name the line.
func ParseIndex(b []byte) ([]IndexEntry, error) {
	var out []IndexEntry
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimRight(line, "\r")
		if line == "" {
			continue
		}
		k, o, ok := strings.Cut(line, "\t")
		key, kerr := strconv.ParseUint(strings.TrimSpace(k), 10, 64)
		off, oerr := strconv.ParseInt(strings.TrimSpace(o), 10, 64)
		if !ok || kerr != nil || oerr != nil || off < 0 {
			return nil, fmt.Errorf("%w: index line %d: %q is not KEY<TAB>OFFSET", ErrFormat, n+1, clip(line))
		}
		out = append(out, IndexEntry{Key: key, Offset: off})
	}
	return out, nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
