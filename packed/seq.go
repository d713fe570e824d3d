package packed

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"syscall"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/seqfile"
	"github.com/dlfs/dlfs/source"
)

const seqIndexName = seqfile.IndexName

// seqDataset is a seqfile pack.
type seqDataset struct {
	src *source.Source

	mu      sync.Mutex
	ix      *seqfile.Index         // mu guards ix, raw, shards and retired
	raw     []byte                 // the index's bytes
	shards  map[int]*source.Handle // opened on first read
	retired []*source.Handle       // shards of an older index: reads may still use them
}

// openSeq returns the pack; its index is read by List.
func openSeq(src *source.Source) (*seqDataset, error) {
	return &seqDataset{src: src, shards: map[int]*source.Handle{}}, nil
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
		f := catalog.File{Path: e.Name, Mode: e.Mode, Size: e.Length, Mtime: e.Mtime}
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

func (d *seqDataset) ReadAt(path string, want source.Want, p []byte, off int64) (int, error) {
	d.mu.Lock()
	e, ok := d.ix.Lookup(path)
	d.mu.Unlock()
	if !ok || e.IsDir() {
		return 0, fmt.Errorf("packed: %s: not in the pack's index: %w", path, syscall.ENOENT)
	}
	if e.Length != want.Size || e.Mtime != want.Mtime {
		return 0, fmt.Errorf("%w: %s; write 'refresh' to the control file", source.ErrChanged, path)
	}
	return d.read(e, p, off)
}

// read reads the payload of e at off. A read of the whole payload is
// checked against the record's checksum.
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
	n, err := h.ReadAt(p, e.DataOffset()+off)
	if err != nil && err != io.EOF {
		return n, err
	}
	if off == 0 && int64(n) == e.Length {
		if seqfile.RecordCRC(e.Name, p[:n]) != e.CRC {
			return 0, fmt.Errorf("%w: %s: record %s at offset %d fails its checksum; the shard is corrupt, repack",
				ErrFormat, h.Path(), e.Name, e.Offset)
		}
	}
	return n, nil
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
func (d *seqDataset) Locate(path string) (loader.Span, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.ix.Lookup(path)
	if !ok || e.IsDir() {
		return loader.Span{}, false
	}
	return loader.Span{Container: d.ix.Shards[e.Shard], Off: e.DataOffset(), Len: e.Length}, true
}

// ReadRun implements loader.Coalescer: one read for the run, then every
// record's checksum.
func (d *seqDataset) ReadRun(paths []string, wants []source.Want) ([][]byte, error) {
	d.mu.Lock()
	entries := make([]seqfile.Entry, len(paths))
	for i, p := range paths {
		e, ok := d.ix.Lookup(p)
		if !ok || e.IsDir() || (i > 0 && e.Shard != entries[0].Shard) {
			d.mu.Unlock()
			return nil, fmt.Errorf("packed: %s is not a record of the run's shard", p)
		}
		if e.Length != wants[i].Size || e.Mtime != wants[i].Mtime {
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
			return nil, fmt.Errorf("%w: %s: record %s at offset %d fails its checksum; the shard is corrupt, repack",
				ErrFormat, h.Path(), e.Name, e.Offset)
		}
	}
	return bufs, nil
}
