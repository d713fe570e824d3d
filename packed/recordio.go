package packed

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/loader/runs"
	"github.com/dlfs/dlfs/packed/recordio"
	"github.com/dlfs/dlfs/source"
)

// recDataset is a directory of MXNet RecordIO files (im2rec's .rec; the
// .idx beside them is not needed, since the records are walked). Each
// image shows as LABEL/ID.jpg, under the .rec file's stem when there are
// several. Integer labels of one file are zero-padded to one width, so
// ImageFolder's class indices (sorted names) equal the labels 0..K-1.
type recDataset struct {
	src   *source.Source
	log   *slog.Logger
	names []string // the .rec files, sorted
	max   int      // samples all files may list

	mu      sync.Mutex
	samples map[string]recSample // mu guards samples, files and retired
	files   map[string]*source.Handle
	retired []*source.Handle
}

// recSample is where one image lives.
type recSample struct {
	file   string
	rec    recordio.Record
	skip   int64 // bytes of IRHeader before the image
	length int64
	v      source.Version // the sample's length, and its file's mtime, ctime and inode
}

// version is the sample's source.Version, as the catalog lists it.
func (s recSample) version() source.Version {
	v := s.v
	v.Size = s.length
	return v
}

func openRec(src *source.Source, names []string, log *slog.Logger, max int) *recDataset {
	return &recDataset{src: src, log: log, names: names, max: max, files: map[string]*source.Handle{}}
}

func (d *recDataset) Kind() string { return "recordio" }

// List walks every .rec file and returns the image tree.
func (d *recDataset) List(ctx context.Context) (_ []catalog.File, err error) {
	samples := map[string]recSample{}
	var files []catalog.File
	handles := map[string]*source.Handle{}
	defer func() {
		if err != nil {
			for _, h := range handles {
				h.Close()
			}
		}
	}()
	for _, name := range d.names {
		h, err := d.src.OpenHandle(name)
		if err != nil {
			return nil, err
		}
		handles[name] = h
		prefix := ""
		if len(d.names) > 1 {
			prefix = strings.TrimSuffix(name, ".rec") + "/"
		}
		all, err := d.images(ctx, name, h)
		if err != nil {
			return nil, err
		}
		if len(files)+len(all) > d.max {
			return nil, tooMany(name, uint64(len(files)+len(all)), d.max)
		}
		labels := make([]float32, len(all))
		for i, f := range all {
			labels[i] = f.label
		}
		dir := labelNamer(labels)
		seen := map[string]int{}
		for _, f := range all {
			base := prefix + dir(f.label) + "/" + strconv.FormatUint(f.id, 10)
			p := base + ".jpg"
			if n := seen[base]; n > 0 {
				p = fmt.Sprintf("%s-%d.jpg", base, n+1) // a repeated id: keep both
			}
			seen[base]++
			samples[p] = f.s
			files = append(files, catalog.File{Path: p, Mode: syscall.S_IFREG | 0o444, Size: f.s.length, Mtime: f.s.v.Mtime, Ctime: f.s.v.Ctime, Ino: f.s.v.Ino})
		}
		if prefix != "" {
			files = append(files, catalog.File{Path: strings.TrimSuffix(prefix, "/"), Mode: syscall.S_IFDIR | 0o555, Mtime: h.Mtime()})
		}
	}
	d.mu.Lock()
	for _, h := range d.files {
		d.retired = append(d.retired, h)
	}
	d.samples, d.files = samples, handles
	d.mu.Unlock()
	return files, nil
}

// found is one image a listing found.
type found struct {
	s     recSample
	label float32
	id    uint64
}

// images lists the images of the .rec file name, open as h, in file
// order. With an im2rec .idx beside it, the records' headers are read in
// parallel at its offsets (a PFS round trip each would make a sequential
// walk of a million records take minutes); without one, or if it does not
// match the .rec, the records are walked from the start.
func (d *recDataset) images(ctx context.Context, name string, h *source.Handle) ([]found, error) {
	idxName := strings.TrimSuffix(name, ".rec") + ".idx"
	if ih, err := d.src.OpenHandle(idxName); err == nil {
		b := make([]byte, ih.Size())
		_, rerr := ih.ReadAt(b, 0)
		ih.Close()
		if rerr == nil || rerr == io.EOF {
			entries, perr := recordio.ParseIndex(b)
			if perr == nil && len(entries) > 0 {
				all, err := d.byIndex(ctx, name, h, entries)
				if err == nil {
					return all, nil
				}
				perr = err
			}
			if perr != nil {
				d.log.Warn("recordio: ignoring an index that does not match its .rec; walking the records", "index", idxName, "err", perr)
			}
		}
	}
	var all []found
	for off := int64(0); off < h.Size(); {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s, hdr, err := readImage(h, off)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		s.file, s.v = name, h.Version()
		all = append(all, found{s, hdr.FirstLabel(), hdr.ID})
		off = s.rec.Next()
	}
	return all, nil
}

// indexReaders bounds the header reads in flight when listing by index.
const indexReaders = 32

// byIndex reads the records at the index's offsets in parallel. The
// records must tile the file from offset 0 to its end, or the index does
// not describe this .rec.
func (d *recDataset) byIndex(ctx context.Context, name string, h *source.Handle, entries []recordio.IndexEntry) ([]found, error) {
	offs := make([]int64, 0, len(entries))
	seen := map[int64]bool{}
	for _, e := range entries {
		if !seen[e.Offset] {
			seen[e.Offset] = true
			offs = append(offs, e.Offset)
		}
	}
	sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
	all := make([]found, len(offs))
	errs := make([]error, len(offs))
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < min(indexReaders, len(offs)); w++ {
		wg.Add(1)
		go func() { // owned by byIndex, which waits for it
			defer wg.Done()
			for i := range next {
				s, hdr, err := readImage(h, offs[i])
				s.file, s.v = name, h.Version()
				all[i], errs[i] = found{s, hdr.FirstLabel(), hdr.ID}, err
			}
		}()
	}
	for i := range offs {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	want := int64(0)
	for i, f := range all {
		if errs[i] != nil {
			return nil, fmt.Errorf("offset %d: %w", offs[i], errs[i])
		}
		if f.s.rec.Offset() != want {
			return nil, fmt.Errorf("the records do not follow each other at offset %d", want)
		}
		want = f.s.rec.Next()
	}
	if want != h.Size() {
		return nil, fmt.Errorf("the indexed records end at %d, the file at %d", want, h.Size())
	}
	return all, nil
}

// readImage reads the record at off and its IRHeader: one read of the
// record and image headers for a whole record, the whole data for a split
// one.
func readImage(h *source.Handle, off int64) (recSample, recordio.IRHeader, error) {
	var b [recordio.HeaderSize + recordio.IRHeaderSize + 4]byte
	n, err := h.ReadAt(b[:], off)
	if err != nil && err != io.EOF {
		return recSample{}, recordio.IRHeader{}, err
	}
	part, err := recordio.DecodeHeader(b[:n], off)
	if err != nil {
		return recSample{}, recordio.IRHeader{}, err
	}
	var rec recordio.Record
	var head []byte
	if part.Flag == 0 {
		if off+recordio.HeaderSize+part.Length > h.Size() {
			return recSample{}, recordio.IRHeader{}, fmt.Errorf("%w: offset %d: record of %d bytes runs past the end of the file (%d bytes); it is truncated",
				recordio.ErrFormat, off, part.Length, h.Size())
		}
		rec = recordio.Record{Parts: []recordio.Part{part}, Length: part.Length}
		head = b[recordio.HeaderSize:n]
	} else {
		if rec, err = recordio.ReadRecord(h, h.Size(), off); err != nil {
			return recSample{}, recordio.IRHeader{}, err
		}
		if head, err = recordio.ReadData(h, rec); err != nil {
			return recSample{}, recordio.IRHeader{}, err
		}
	}
	hdr, err := recordio.DecodeIRHeader(head[:min(len(head), int(rec.Length))], rec.Length)
	if err != nil {
		return recSample{}, recordio.IRHeader{}, fmt.Errorf("offset %d: %w", off, err)
	}
	return recSample{rec: rec, skip: hdr.Size(), length: rec.Length - hdr.Size()}, hdr, nil
}

// labelNamer returns how labels become directory names: zero-padded
// integers when every label is a non-negative integer, else the shortest
// decimal form.
func labelNamer(labels []float32) func(float32) string {
	width, integral := 1, true
	for _, l := range labels {
		if l < 0 || l != float32(math.Trunc(float64(l))) || l > 1e9 {
			integral = false
			break
		}
		width = max(width, len(strconv.Itoa(int(l))))
	}
	if !integral {
		return func(l float32) string { return strconv.FormatFloat(float64(l), 'g', -1, 32) }
	}
	return func(l float32) string {
		s := strconv.Itoa(int(l))
		return strings.Repeat("0", width-len(s)) + s
	}
}

func (d *recDataset) ReadAt(p string, want source.Version, buf []byte, off int64) (int, error) {
	d.mu.Lock()
	s, ok := d.samples[path.Clean(p)]
	h := d.files[s.file]
	d.mu.Unlock()
	if !ok || h == nil {
		return 0, fmt.Errorf("packed: %s: no such image in the RecordIO files: %w", p, syscall.ENOENT)
	}
	if s.version() != want {
		return 0, fmt.Errorf("%w: %s; write 'refresh' to the control file", source.ErrChanged, p)
	}
	if off >= s.length {
		return 0, nil
	}
	buf = buf[:min(int64(len(buf)), s.length-off)]
	if s.rec.Contiguous() {
		n, err := h.ReadAt(buf, s.rec.DataOffset()+s.skip+off)
		if err == io.EOF {
			err = fmt.Errorf("%w: %s: the image at offset %d runs past the end; the file is truncated", ErrFormat, h.Path(), s.rec.Offset())
		}
		return n, err
	}
	data, err := recordio.ReadData(h, s.rec)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", h.Path(), err)
	}
	return copy(buf, data[s.skip+off:]), nil
}

func (d *recDataset) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, h := range d.files {
		h.Close()
	}
	for _, h := range d.retired {
		h.Close()
	}
	d.files, d.retired = map[string]*source.Handle{}, nil
	return nil
}

// topFiles lists the regular files at the top of dir whose names end in
// one of suffixes, sorted.
func topFiles(dir string, suffixes ...string) ([]string, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, de := range des {
		if !de.Type().IsRegular() {
			continue
		}
		for _, suf := range suffixes {
			if strings.HasSuffix(de.Name(), suf) {
				out = append(out, de.Name())
				break
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// Locate implements loader.Coalescer, for images of whole records.
func (d *recDataset) Locate(p string) (runs.Span, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.samples[p]
	if !ok || !s.rec.Contiguous() {
		return runs.Span{}, false
	}
	return runs.Span{Container: s.file, Off: s.rec.DataOffset() + s.skip, Len: s.length}, true
}

// ReadRun implements loader.Coalescer.
func (d *recDataset) ReadRun(paths []string, wants []source.Version) ([][]byte, error) {
	d.mu.Lock()
	parts := make([]runPart, len(paths))
	var h *source.Handle
	for i, p := range paths {
		s, ok := d.samples[p]
		if !ok || !s.rec.Contiguous() || (i > 0 && d.files[s.file] != h) {
			d.mu.Unlock()
			return nil, fmt.Errorf("packed: %s is not a whole record of the run's file", p)
		}
		if s.version() != wants[i] {
			d.mu.Unlock()
			return nil, fmt.Errorf("%w: %s; write 'refresh' to the control file", source.ErrChanged, p)
		}
		h = d.files[s.file]
		parts[i] = runPart{path: p, off: s.rec.DataOffset() + s.skip, len: s.length}
	}
	d.mu.Unlock()
	return readRun(h, parts)
}
