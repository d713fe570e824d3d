package seqfile

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/dlfs/dlfs/atomicfile"
	"github.com/dlfs/dlfs/source"
)

// Entry is one row of the index: a record, or a directory of the packed
// tree (which has no record).
type Entry struct {
	Name   string // slash-separated path in the packed tree
	Mode   uint32 // file type and permission bits
	Mtime  int64  // nanoseconds
	Shard  int    // records: index into Index.Shards
	Offset int64  // records: offset of the record header in the shard
	Length int64  // records: payload bytes
	CRC    uint32 // records: CRC-32C of name and payload
}

// IsDir reports whether e is a directory.
func (e Entry) IsDir() bool { return e.Mode&syscall.S_IFMT == syscall.S_IFDIR }

// DataOffset is the offset of e's payload in its shard.
func (e Entry) DataOffset() int64 { return e.Offset + HeaderSize + int64(len(e.Name)) }

// RecordSize is the bytes e's record takes in its shard.
func (e Entry) RecordSize() int64 { return pad4(HeaderSize + int64(len(e.Name)) + e.Length) }

// Index lists a packed tree. Entries are sorted by name, with no name
// twice.
//
// Encoding (little-endian): "DLFSIDX\x00", version (uint32, 1), the number
// of shards (uint32) and of entries (uint64); each shard's file name as a
// uint16 length and bytes; each entry as a uint16 name length, the name,
// mode (uint32), mtime (int64), shard (uint32), offset (uint64), length
// (uint64) and CRC (uint32); then a CRC-32C of everything before it.
type Index struct {
	Shards  []string
	Entries []Entry

	byName map[string]int
}

var indexMagic = [8]byte{'D', 'L', 'F', 'S', 'I', 'D', 'X', 0}

const entryFixed = 2 + 4 + 8 + 4 + 8 + 8 + 4

// NewIndex sorts entries by name and checks them.
func NewIndex(shards []string, entries []Entry) (*Index, error) {
	ix := &Index{Shards: shards, Entries: entries}
	sort.Slice(ix.Entries, func(i, j int) bool { return ix.Entries[i].Name < ix.Entries[j].Name })
	if err := ix.check(); err != nil {
		return nil, err
	}
	return ix, nil
}

// check validates the shards and entries and builds the name map.
func (ix *Index) check() error {
	for i, s := range ix.Shards {
		if s == "" || s == "." || s == ".." || strings.ContainsAny(s, "/\x00") || s == IndexName {
			return fmt.Errorf("%w: shard %d has the name %q; want a plain file name", ErrFormat, i, s)
		}
	}
	ix.byName = make(map[string]int, len(ix.Entries))
	for i, e := range ix.Entries {
		if !validName(e.Name) {
			return fmt.Errorf("%w: entry %d: name %q is not a clean relative path", ErrFormat, i, clip(e.Name))
		}
		if i > 0 && ix.Entries[i-1].Name >= e.Name {
			return fmt.Errorf("%w: entry %d (%q): names out of order or repeated", ErrFormat, i, clip(e.Name))
		}
		switch e.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			if e.Length != 0 {
				return fmt.Errorf("%w: directory %q has a length", ErrFormat, clip(e.Name))
			}
		case syscall.S_IFREG, syscall.S_IFLNK:
			if e.Shard < 0 || e.Shard >= len(ix.Shards) {
				return fmt.Errorf("%w: %q: shard %d of %d", ErrFormat, clip(e.Name), e.Shard, len(ix.Shards))
			}
			if e.Offset < FileHeader || e.Length < 0 || e.Length > 1<<40 || e.Offset > 1<<50 {
				return fmt.Errorf("%w: %q: offset %d, length %d out of range", ErrFormat, clip(e.Name), e.Offset, e.Length)
			}
			if e.Mode&syscall.S_IFMT == syscall.S_IFLNK && e.Length > MaxTarget {
				return fmt.Errorf("%w: symlink %q: target of %d bytes (at most %d)", ErrFormat, clip(e.Name), e.Length, MaxTarget)
			}
		default:
			return fmt.Errorf("%w: %q: mode %#o is not a file, directory or symlink", ErrFormat, clip(e.Name), e.Mode)
		}
		ix.byName[e.Name] = i
	}
	return nil
}

// validName accepts a clean, relative, slash-separated path of at most
// MaxName bytes.
func validName(name string) bool { return len(name) <= MaxName && source.Local(name) }

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// Lookup returns the entry called name.
func (ix *Index) Lookup(name string) (Entry, bool) {
	i, ok := ix.byName[name]
	if !ok {
		return Entry{}, false
	}
	return ix.Entries[i], true
}

// Records returns the entries that are records (not directories), in
// shard and offset order: the order they were written in.
func (ix *Index) Records() []Entry {
	var out []Entry
	for _, e := range ix.Entries {
		if !e.IsDir() {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Shard != out[j].Shard {
			return out[i].Shard < out[j].Shard
		}
		return out[i].Offset < out[j].Offset
	})
	return out
}

// Split returns logical partition k of n: the records whose first byte
// falls in the k-th of n equal byte ranges of all the shards laid end to
// end, as dmlc's InputSplit cuts them. Every record is in exactly one
// partition, whatever the number of shards.
func (ix *Index) Split(k, n int) []Entry {
	if n <= 0 || k < 0 || k >= n {
		return nil
	}
	recs := ix.Records()
	var total int64
	for _, r := range recs {
		total += r.RecordSize()
	}
	lo, hi := total*int64(k)/int64(n), total*int64(k+1)/int64(n)
	var out []Entry
	var at int64
	for _, r := range recs {
		if at >= lo && at < hi {
			out = append(out, r)
		}
		at += r.RecordSize()
	}
	return out
}

// Encode returns the index's bytes.
func (ix *Index) Encode() []byte {
	le := binary.LittleEndian
	b := append([]byte(nil), indexMagic[:]...)
	b = le.AppendUint32(b, Version)
	b = le.AppendUint32(b, uint32(len(ix.Shards)))
	b = le.AppendUint64(b, uint64(len(ix.Entries)))
	for _, s := range ix.Shards {
		b = le.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	for _, e := range ix.Entries {
		b = le.AppendUint16(b, uint16(len(e.Name)))
		b = append(b, e.Name...)
		b = le.AppendUint32(b, e.Mode)
		b = le.AppendUint64(b, uint64(e.Mtime))
		b = le.AppendUint32(b, uint32(e.Shard))
		b = le.AppendUint64(b, uint64(e.Offset))
		b = le.AppendUint64(b, uint64(e.Length))
		b = le.AppendUint32(b, e.CRC)
	}
	return le.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// DecodeIndex parses and checks index bytes. It never panics, and it
// allocates no more than the input's size warrants.
func DecodeIndex(b []byte) (*Index, error) {
	le := binary.LittleEndian
	if len(b) < 28 || [8]byte(b[:8]) != indexMagic {
		return nil, fmt.Errorf("%w: not a seqfile index (no DLFSIDX header)", ErrFormat)
	}
	body, sum := b[:len(b)-4], le.Uint32(b[len(b)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return nil, fmt.Errorf("%w: index checksum %#08x, want %#08x; the index is corrupt or truncated", ErrFormat, got, sum)
	}
	if v := le.Uint32(b[8:]); v != Version {
		return nil, fmt.Errorf("%w: index format version %d; this dlfs reads version %d", ErrFormat, v, Version)
	}
	nShards, nEntries := uint64(le.Uint32(b[12:])), le.Uint64(b[16:])
	p := body[24:]
	if nShards > uint64(len(p))/3 || nEntries > uint64(len(p))/(entryFixed+1) {
		return nil, fmt.Errorf("%w: index claims %d shards and %d entries in %d bytes", ErrFormat, nShards, nEntries, len(b))
	}
	str := func() (string, bool) {
		if len(p) < 2 {
			return "", false
		}
		n := int(le.Uint16(p))
		if len(p) < 2+n {
			return "", false
		}
		s := string(p[2 : 2+n])
		p = p[2+n:]
		return s, true
	}
	ix := &Index{Shards: make([]string, 0, nShards), Entries: make([]Entry, 0, nEntries)}
	for i := uint64(0); i < nShards; i++ {
		s, ok := str()
		if !ok {
			return nil, fmt.Errorf("%w: index ends inside shard name %d", ErrFormat, i)
		}
		ix.Shards = append(ix.Shards, s)
	}
	for i := uint64(0); i < nEntries; i++ {
		name, ok := str()
		if !ok || len(p) < entryFixed-2 {
			return nil, fmt.Errorf("%w: index ends inside entry %d", ErrFormat, i)
		}
		e := Entry{Name: name, Mode: le.Uint32(p), Mtime: int64(le.Uint64(p[4:])), Shard: int(le.Uint32(p[12:])),
			Offset: int64(le.Uint64(p[16:])), Length: int64(le.Uint64(p[24:])), CRC: le.Uint32(p[32:])}
		p = p[entryFixed-2:]
		ix.Entries = append(ix.Entries, e)
	}
	if len(p) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the last index entry", ErrFormat, len(p))
	}
	if err := ix.check(); err != nil {
		return nil, err
	}
	return ix, nil
}

// ReadIndex reads dir's index. The error names the file.
func ReadIndex(dir string) (*Index, error) {
	path := filepath.Join(dir, IndexName)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	ix, err := DecodeIndex(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ix, nil
}

// indexTemp is the prefix of the temporary file WriteIndex writes before
// its rename (package atomicfile).
const indexTemp = ".index-"

// WriteIndex writes ix to dir atomically: to a temporary file, synced,
// then renamed over the index. It first removes the temporary files of
// earlier writes that were killed before their rename (only those no
// live writer holds).
func WriteIndex(dir string, ix *Index) error {
	if _, err := atomicfile.RemoveStale(dir, indexTemp); err != nil {
		return err
	}
	path := filepath.Join(dir, IndexName)
	if err := atomicfile.Write(path, indexTemp, func(w io.Writer) error {
		_, err := w.Write(ix.Encode())
		return err
	}); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Writer appends records to one shard. It is not safe for concurrent use.
type Writer struct {
	f     *os.File
	bw    *bufio.Writer
	off   int64
	shard int
}

// Create starts shard number shard at path.
func Create(path string, shard int) (*Writer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w := &Writer{f: f, bw: bufio.NewWriterSize(f, 1<<20), off: FileHeader, shard: shard}
	var fh [FileHeader]byte
	copy(fh[:], fileMagic[:])
	binary.LittleEndian.PutUint32(fh[8:], Version)
	if _, err := w.bw.Write(fh[:]); err != nil {
		f.Close()
		return nil, err
	}
	return w, nil
}

// Append writes one record and returns its index entry.
func (w *Writer) Append(name string, mode uint32, mtime int64, data []byte) (Entry, error) {
	if !validName(name) {
		return Entry{}, fmt.Errorf("seqfile: %q is not a clean relative path", clip(name))
	}
	if t := mode & syscall.S_IFMT; t != syscall.S_IFREG && t != syscall.S_IFLNK {
		return Entry{}, fmt.Errorf("seqfile: %s: only files and symlinks are records", name)
	}
	crc := RecordCRC(name, data)
	h := Header{Length: int64(len(data)), Mode: mode, NameLen: len(name), Mtime: mtime, CRC: crc}
	var hb [HeaderSize]byte
	encodeHeader(hb[:], h)
	e := Entry{Name: name, Mode: mode, Mtime: mtime, Shard: w.shard, Offset: w.off, Length: h.Length, CRC: crc}
	var zero [3]byte
	for _, part := range [][]byte{hb[:], []byte(name), data, zero[:h.RecordSize()-(HeaderSize+int64(len(name))+h.Length)]} {
		if _, err := w.bw.Write(part); err != nil {
			return Entry{}, fmt.Errorf("seqfile: write %s: %w", w.f.Name(), err)
		}
	}
	w.off += h.RecordSize()
	return e, nil
}

// Close flushes, syncs and closes the shard.
func (w *Writer) Close() error {
	err := w.bw.Flush()
	if err == nil {
		err = w.f.Sync()
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("seqfile: close %s: %w", w.f.Name(), err)
	}
	return nil
}
