package packed

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"syscall"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/loader/runs"
	"github.com/dlfs/dlfs/seqfile"
	"github.com/dlfs/dlfs/source"
)

const seqIndexName = seqfile.IndexName

// seqDataset is a seqfile pack.
type seqDataset struct {
	src *source.Source
	max int // entries the index may list

	mu      sync.Mutex
	ix      *seqfile.Index         // mu guards ix, raw, shards and retired
	raw     []byte                 // the index's bytes
	shards  map[int]*source.Handle // opened on first read
	retired []*source.Handle       // shards of an older index: reads may still use them

	memo recordMemo // verified records read in part
}

// openSeq returns the pack; its index is read by List.
func openSeq(src *source.Source, max int) (*seqDataset, error) {
	return &seqDataset{src: src, max: max, shards: map[int]*source.Handle{}}, nil
}

func (d *seqDataset) Kind() string { return "seqfile" }

// List reads the index (again, on a refresh) and returns the packed tree.
func (d *seqDataset) List(ctx context.Context) ([]catalog.File, error) {
	h, err := d.src.OpenHandle(seqIndexName)
	if err != nil {
		return nil, err
	}
	b := make([]byte, h.Size())
	_, err = h.ReadAt(b, 0)
	h.Close()
	if err != nil && err != io.EOF {
		return nil, err
	}
	ix, err := seqfile.DecodeIndex(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w; repack with dlfs pack", seqIndexName, err)
	}
	if len(ix.Entries) > d.max {
		return nil, tooMany(seqIndexName, uint64(len(ix.Entries)), d.max)
	}
	d.mu.Lock()
	if d.ix == nil || !bytes.Equal(d.raw, b) { // a new pack: its shards are opened afresh
		for _, h := range d.shards {
			d.retired = append(d.retired, h) // closed with the dataset, not under a read
		}
		d.shards = map[int]*source.Handle{}
	}
	d.ix, d.raw = ix, b
	d.mu.Unlock()
	files := make([]catalog.File, 0, len(ix.Entries))
	for _, e := range ix.Entries {
		v := seqVersion(e)
		f := catalog.File{Path: e.Name, Mode: e.Mode, Size: v.Size, Mtime: v.Mtime, Ctime: v.Ctime}
		if e.Mode&syscall.S_IFMT == syscall.S_IFLNK {
			target := make([]byte, e.Length)
			if _, err := d.read(e, target, 0); err != nil {
				return nil, err
			}
			f.Target, f.Size = string(target), int64(len(target))
		}
		files = append(files, f)
	}
	return files, nil
}

// seqVersion is a record's source.Version: its length and mtime, and its
// checksum in place of a ctime, so that a repack that changes its bytes
// changes its version.
func seqVersion(e seqfile.Entry) source.Version {
	return source.Version{Size: e.Length, Mtime: e.Mtime, Ctime: int64(e.CRC)}
}

// shard returns the open shard i of the current index.
func (d *seqDataset) shard(i int) (*source.Handle, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h := d.shards[i]; h != nil {
		return h, nil
	}
	h, err := d.src.OpenHandle(d.ix.Shards[i])
	if err != nil {
		return nil, err
	}
	d.shards[i] = h
	return h, nil
}

func (d *seqDataset) ReadAt(path string, want source.Version, p []byte, off int64) (int, error) {
	d.mu.Lock()
	e, ok := d.ix.Lookup(path)
	d.mu.Unlock()
	if !ok || e.IsDir() {
		return 0, fmt.Errorf("packed: %s: not in the pack's index: %w", path, syscall.ENOENT)
	}
	if seqVersion(e) != want {
		return 0, fmt.Errorf("%w: %s; write 'refresh' to the control file", source.ErrChanged, path)
	}
	return d.read(e, p, off)
}

// read reads the payload of e at off. No byte is returned before the
// whole record has been checked against its checksum: a read of part of
// a record (a block of a large sample) reads the record whole, checks it,
// and keeps it in a small memo of verified records, so the reads of its
// other blocks do not read it again. A record too large for the memo is
// streamed through the checksum on every read, keeping only the part asked
// for: correct, in bounded memory, and costly (see maxMemoRecord).
func (d *seqDataset) read(e seqfile.Entry, p []byte, off int64) (int, error) {
	if off >= e.Length {
		return 0, nil
	}
	p = p[:min(int64(len(p)), e.Length-off)]
	h, err := d.shard(e.Shard)
	if err != nil {
		return 0, err
	}
	if end := e.DataOffset() + e.Length; end > h.Size() {
		return 0, fmt.Errorf("%w: %s: record %s at offset %d runs past the end (%d bytes); the shard is truncated, repack",
			ErrFormat, h.Path(), e.Name, e.Offset, h.Size())
	}
	if off == 0 && int64(len(p)) == e.Length { // the whole record: check it in place
		if err := readRecord(h, e, p); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	if e.Length <= maxMemoRecord {
		rec, err := d.memo.get(h, e, func() ([]byte, error) {
			b := make([]byte, e.Length)
			return b, readRecord(h, e, b)
		})
		if err != nil {
			return 0, err
		}
		return copy(p, rec[off:]), nil
	}
	// Stream the record through the checksum, keeping p's part.
	sum := seqfile.RecordCRC(e.Name, nil)
	chunk := make([]byte, 1<<20)
	for pos := int64(0); pos < e.Length; {
		c := chunk[:min(int64(len(chunk)), e.Length-pos)]
		if err := readFull(h, c, e.DataOffset()+pos); err != nil {
			return 0, err
		}
		sum = seqfile.UpdateCRC(sum, c)
		if lo, hi := max(pos, off), min(pos+int64(len(c)), off+int64(len(p))); lo < hi {
			copy(p[lo-off:hi-off], c[lo-pos:hi-pos])
		}
		pos += int64(len(c))
	}
	if sum != e.CRC {
		return 0, corrupt(h, e)
	}
	return len(p), nil
}

// readRecord reads e's whole payload into p (e.Length bytes) and checks
// it against the record's checksum.
func readRecord(h *source.Handle, e seqfile.Entry, p []byte) error {
	if err := readFull(h, p, e.DataOffset()); err != nil {
		return err
	}
	if seqfile.RecordCRC(e.Name, p) != e.CRC {
		return corrupt(h, e)
	}
	return nil
}

// readFull reads len(p) bytes of h at off; a short read is an error.
func readFull(h *source.Handle, p []byte, off int64) error {
	n, err := h.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = fmt.Errorf("%w: %s: %d of %d bytes at offset %d; the shard is truncated, repack", ErrFormat, h.Path(), n, len(p), off)
	}
	return err
}

func corrupt(h *source.Handle, e seqfile.Entry) error {
	return fmt.Errorf("%w: %s: record %s at offset %d fails its checksum; the shard is corrupt, repack",
		ErrFormat, h.Path(), e.Name, e.Offset)
}

func (d *seqDataset) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, h := range d.shards {
		h.Close()
	}
	for _, h := range d.retired {
		h.Close()
	}
	d.shards, d.retired = map[int]*source.Handle{}, nil
	return nil
}

// Locate implements loader.Coalescer.
func (d *seqDataset) Locate(path string) (runs.Span, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.ix.Lookup(path)
	if !ok || e.IsDir() {
		return runs.Span{}, false
	}
	return runs.Span{Container: d.ix.Shards[e.Shard], Off: e.DataOffset(), Len: e.Length}, true
}

// ReadRun implements loader.Coalescer: one read for the run, then every
// record's checksum.
func (d *seqDataset) ReadRun(paths []string, wants []source.Version) ([][]byte, error) {
	d.mu.Lock()
	entries := make([]seqfile.Entry, len(paths))
	for i, p := range paths {
		e, ok := d.ix.Lookup(p)
		if !ok || e.IsDir() || (i > 0 && e.Shard != entries[0].Shard) {
			d.mu.Unlock()
			return nil, fmt.Errorf("packed: %s is not a record of the run's shard", p)
		}
		if seqVersion(e) != wants[i] {
			d.mu.Unlock()
			return nil, fmt.Errorf("%w: %s; write 'refresh' to the control file", source.ErrChanged, p)
		}
		entries[i] = e
	}
	d.mu.Unlock()
	h, err := d.shard(entries[0].Shard)
	if err != nil {
		return nil, err
	}
	parts := make([]runPart, len(entries))
	for i, e := range entries {
		parts[i] = runPart{path: e.Name, off: e.DataOffset(), len: e.Length}
	}
	bufs, err := readRun(h, parts)
	if err != nil {
		return nil, err
	}
	for i, e := range entries {
		if seqfile.RecordCRC(e.Name, bufs[i]) != e.CRC {
			return nil, corrupt(h, e)
		}
	}
	return bufs, nil
}
