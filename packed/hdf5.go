//go:build cgo && !nohdf5

package packed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"gonum.org/v1/hdf5"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/loader/runs"
	"github.com/dlfs/dlfs/packed/npy"
	"github.com/dlfs/dlfs/source"
)

// h5Dataset is a directory of HDF5 files. Every dataset of shape (N, ...)
// with a numeric type shows as a directory of N NumPy files, one per row:
// FILE/GROUP/DATASET/000042.npy (FILE/ only when there are several
// files). Rows are numbered with as many digits as N-1 needs, so names
// sort in row order.
//
// The files are opened by the HDF5 library (cgo), through
// /proc/self/fd of a descriptor opened by source.Source, so they stay
// confined to SOURCE. The library lists them: groups, datasets, shapes,
// types, and where each dataset's data lies. One mutex serialises calls
// into the library.
//
// A row is shown raw, in the file's byte order (the library reads it in
// the file's own type, converting nothing). The rows of a contiguous
// dataset, the layout of one written without chunks or compression, lie
// in the file exactly so, one after another: they are read at their
// offset through the descriptor (source.Handle.ReadAt), outside the
// library and its mutex, several at once. That read is counted as PFS
// traffic, exactly the rows' bytes, and fails with source.ErrChanged if
// the file changed under it. The library read rows through its own open
// of the file and its 64 KiB sieve buffer, unseen by the count: rows of
// 3 KB read at random cost 20 times their bytes in reads, 30 KB ones 2.1
// times. A contiguous dataset whose data would end past the end of its
// file is not shown.
//
// Rows of chunked, compressed or compact datasets, and of contiguous ones
// never written (they read as the fill value), are read by the library:
// the bytes of the rows read are counted as PFS traffic, its metadata
// reads are not.
type h5Dataset struct {
	src   *source.Source
	names []string // the HDF5 files, sorted
	log   *slog.Logger
	max   int // rows all files may list

	mu      sync.Mutex // guards everything below and every library call
	files   map[string]*h5File
	rows    map[string]h5Row // path -> row
	retired []*h5File
}

type h5File struct {
	h    *source.Handle // nil in the preflight child
	f    *hdf5.File
	sets map[string]*h5Set // by dataset path in the file; read-only after List
	log  *slog.Logger

	// Direct reads run outside h5Dataset.mu: one holds reads from its
	// start, under the mutex, to its end, and close (under the mutex)
	// waits for them, then sets closed, which a read checks first.
	reads  sync.WaitGroup
	closed bool // (h5Dataset.mu)
}

// h5Set is one dataset shown as a directory. Read-only after List.
type h5Set struct {
	ds     *hdf5.Dataset
	dims   []uint
	rowLen int64  // bytes of one row
	header []byte // the .npy header of every row
	at     int64  // offset of row 0 in the file, read directly; -1: read by the library
}

type h5Row struct {
	file, set string
	row       uint
	v         source.Version // the row's size, and its file's mtime, ctime and inode
}

// npyTypes maps HDF5's standard types to NumPy's descr.
var npyTypes = []struct {
	t     *hdf5.Datatype
	descr string
}{
	{hdf5.T_STD_I8LE, "|i1"}, {hdf5.T_STD_I8BE, "|i1"}, {hdf5.T_STD_U8LE, "|u1"}, {hdf5.T_STD_U8BE, "|u1"},
	{hdf5.T_STD_I16LE, "<i2"}, {hdf5.T_STD_I16BE, ">i2"}, {hdf5.T_STD_U16LE, "<u2"}, {hdf5.T_STD_U16BE, ">u2"},
	{hdf5.T_STD_I32LE, "<i4"}, {hdf5.T_STD_I32BE, ">i4"}, {hdf5.T_STD_U32LE, "<u4"}, {hdf5.T_STD_U32BE, ">u4"},
	{hdf5.T_STD_I64LE, "<i8"}, {hdf5.T_STD_I64BE, ">i8"}, {hdf5.T_STD_U64LE, "<u8"}, {hdf5.T_STD_U64BE, ">u8"},
	{hdf5.T_IEEE_F32LE, "<f4"}, {hdf5.T_IEEE_F32BE, ">f4"}, {hdf5.T_IEEE_F64LE, "<f8"}, {hdf5.T_IEEE_F64BE, ">f8"},
}

func openH5(src *source.Source, names []string, log *slog.Logger, max int) *h5Dataset {
	return &h5Dataset{src: src, names: names, log: log, max: max, files: map[string]*h5File{}}
}

func (d *h5Dataset) Kind() string { return "hdf5" }

// List opens every HDF5 file and returns the row tree.
func (d *h5Dataset) List(ctx context.Context) (_ []catalog.File, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	defer recoverLibrary(&err)
	defer quiet()()
	files := map[string]*h5File{}
	defer func() {
		if err != nil {
			for _, f := range files {
				f.close()
			}
		}
	}()
	rows := map[string]h5Row{}
	var out []catalog.File
	for _, name := range d.names {
		h, err := d.src.OpenHandle(name)
		if err != nil {
			return nil, err
		}
		if err := checkH5(h.Fd(), name); errors.Is(err, errCrashes) {
			d.log.Warn("packed: not showing an HDF5 file on which the HDF5 library crashes or hangs (a damaged or crafted file); repair or remove it, then refresh", "file", name, "err", err)
			h.Close()
			continue
		} else if err != nil {
			d.log.Warn("packed: could not check an HDF5 file in a separate process first; opening it anyway", "file", name, "err", err)
		}
		f, err := hdf5.OpenFile(fmt.Sprintf("/proc/self/fd/%d", h.Fd()), hdf5.F_ACC_RDONLY)
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("%w: %s: not a readable HDF5 file: %v", ErrFormat, name, err)
		}
		hf := &h5File{h: h, f: f, sets: map[string]*h5Set{}, log: d.log.With("file", name)}
		files[name] = hf
		prefix := ""
		if len(d.names) > 1 {
			prefix = strings.TrimSuffix(strings.TrimSuffix(name, ".h5"), ".hdf5") + "/"
			out = append(out, catalog.File{Path: strings.TrimSuffix(prefix, "/"), Mode: syscall.S_IFDIR | 0o555, Mtime: h.Mtime()})
		}
		if err := hf.walk(&hf.f.CommonFG, ""); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		setNames := make([]string, 0, len(hf.sets))
		for s := range hf.sets {
			setNames = append(setNames, s)
		}
		sort.Strings(setNames)
		// Count the rows before listing one: a file of a few bytes can
		// declare 2^28 of them.
		total := uint64(len(out))
		for _, s := range setNames {
			if total += uint64(hf.sets[s].dims[0]); total > uint64(d.max) {
				return nil, tooMany(name+" /"+s, total, d.max)
			}
		}
		for _, s := range setNames {
			set := hf.sets[s]
			dir := prefix + s
			out = append(out, catalog.File{Path: dir, Mode: syscall.S_IFDIR | 0o555, Mtime: h.Mtime()})
			width := len(strconv.FormatUint(uint64(max(set.dims[0], 1)-1), 10))
			size := int64(len(set.header)) + set.rowLen
			for r := uint(0); r < set.dims[0]; r++ {
				n := strconv.FormatUint(uint64(r), 10)
				p := dir + "/" + strings.Repeat("0", width-len(n)) + n + ".npy"
				v := h.Version()
				v.Size = size
				rows[p] = h5Row{file: name, set: s, row: r, v: v}
				out = append(out, catalog.File{Path: p, Mode: syscall.S_IFREG | 0o444, Size: size, Mtime: v.Mtime, Ctime: v.Ctime, Ino: v.Ino})
			}
		}
	}
	for _, f := range d.files {
		d.retired = append(d.retired, f)
	}
	d.files, d.rows = files, rows
	return out, nil
}

// walk records every numeric dataset of shape (N, ...) under g.
func (hf *h5File) walk(g *hdf5.CommonFG, dir string) error {
	n, err := g.NumObjects()
	if err != nil {
		return fmt.Errorf("%w: group /%s: %v", ErrFormat, dir, err)
	}
	for i := uint(0); i < n; i++ {
		name, err := g.ObjectNameByIndex(i)
		if err != nil || name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
			continue
		}
		p := name
		if dir != "" {
			p = dir + "/" + name
		}
		if !hardLink(*g, name) {
			// An external link names another file, which the library
			// would open by name anywhere on the host; a soft link may
			// lead to one.
			hf.log.Warn("packed: not showing a link out of the HDF5 file's own objects", "object", "/"+p)
			continue
		}
		typ, err := g.ObjectTypeByIndex(i)
		if err != nil {
			continue
		}
		switch typ {
		case hdf5.H5G_GROUP:
			sub, err := g.OpenGroup(name)
			if err != nil {
				return fmt.Errorf("%w: group /%s: %v", ErrFormat, p, err)
			}
			err = hf.walk(&sub.CommonFG, p)
			sub.Close()
			if err != nil {
				return err
			}
		case hdf5.H5G_DATASET:
			ds, err := g.OpenDataset(name)
			if err != nil {
				return fmt.Errorf("%w: dataset /%s: %v", ErrFormat, p, err)
			}
			if !storedInside(ds) {
				hf.log.Warn("packed: not showing a dataset whose data lies in other files (external storage or a virtual dataset)", "dataset", "/"+p)
				ds.Close()
				continue
			}
			if !storageSane(ds) {
				hf.log.Warn("packed: not showing a dataset whose stored data is shorter than its shape says (a damaged or crafted file)", "dataset", "/"+p)
				ds.Close()
				continue
			}
			set := describe(ds)
			if set == nil {
				ds.Close() // not an array of numbers: not shown
				continue
			}
			if !hf.direct(ds, set) {
				hf.log.Warn("packed: not showing a dataset whose data would end past the end of its file (a damaged or crafted file)", "dataset", "/"+p)
				ds.Close()
				continue
			}
			hf.sets[p] = set
		}
	}
	return nil
}

// Limits on what a dataset may be to be shown: a crafted file must not
// make the daemon list billions of rows or allocate a huge row.
const (
	maxRows     = 1 << 28
	maxRowBytes = 1 << 30
)

// describe returns how ds shows, or nil if it is not a numeric array of
// at least one dimension within the limits.
func describe(ds *hdf5.Dataset) *h5Set {
	space := ds.Space()
	if space == nil {
		return nil
	}
	defer space.Close()
	if !space.IsSimple() || space.SimpleExtentNDims() < 1 {
		return nil // a scalar or null dataspace has no rows
	}
	dims, _, err := space.SimpleExtentDims()
	if err != nil || len(dims) == 0 {
		return nil
	}
	dt, err := ds.Datatype()
	if err != nil {
		return nil
	}
	defer dt.Close()
	descr := ""
	for _, t := range npyTypes {
		if dt.Equal(t.t) {
			descr = t.descr
			break
		}
	}
	if descr == "" {
		return nil
	}
	if dims[0] > maxRows {
		return nil // more rows than a tree of files can list
	}
	shape := make([]int, len(dims)-1)
	rowLen := int64(dt.Size())
	for i, d := range dims[1:] {
		if d > 0 && rowLen > maxRowBytes/int64(min(d, maxRowBytes)) {
			return nil // a row too large to be one file's bytes in memory
		}
		shape[i] = int(d)
		rowLen *= int64(d)
	}
	return &h5Set{ds: ds, dims: dims, rowLen: rowLen, header: npy.Header(descr, shape), at: -1}
}

// direct sets set.at when the rows of ds lie in the file as they are shown
// (contiguous storage): its type is one of npyTypes, as describe checked,
// and the library reads it in that same type, so the file's bytes are the
// rows' bytes. It reports false when they would end past the end of the
// file, which a read must not reach.
func (hf *h5File) direct(ds *hdf5.Dataset, set *h5Set) bool {
	if hf.h == nil {
		return true // the preflight child reads through the library
	}
	at, ok := contiguousAt(ds)
	if !ok {
		return true
	}
	size := uint64(hf.h.Size())
	if at > size || set.rowLen > 0 && uint64(set.dims[0]) > (size-at)/uint64(set.rowLen) {
		return false
	}
	set.at = int64(at)
	return true
}

func (d *h5Dataset) ReadAt(p string, want source.Version, buf []byte, off int64) (int, error) {
	d.mu.Lock()
	r, ok := d.rows[path.Clean(p)]
	hf := d.files[r.file]
	d.mu.Unlock()
	if !ok || hf == nil {
		return 0, fmt.Errorf("packed: %s: no such row in the HDF5 files: %w", p, syscall.ENOENT)
	}
	if r.v != want {
		return 0, fmt.Errorf("%w: %s; write 'refresh' to the control file", source.ErrChanged, p)
	}
	set := hf.sets[r.set]
	if off >= r.v.Size {
		return 0, nil
	}
	buf = buf[:min(int64(len(buf)), r.v.Size-off)]
	n := 0
	if off < int64(len(set.header)) {
		n = copy(buf, set.header[off:])
	}
	if n == len(buf) {
		return n, nil
	}
	row, err := d.read(hf, set, r.row, 1)
	if err != nil {
		return n, fmt.Errorf("%s: %s row %d: %w", r.file, r.set, r.row, err)
	}
	from := max(off-int64(len(set.header)), 0)
	n += copy(buf[n:], row[from:])
	return n, nil
}

// read reads count rows from row first of set, raw in the file's byte
// order: directly when set.at says where they lie, else through the
// library.
func (d *h5Dataset) read(hf *h5File, set *h5Set, first, count uint) (_ []byte, err error) {
	d.mu.Lock()
	if hf.closed {
		d.mu.Unlock()
		return nil, fmt.Errorf("packed: reading a closed HDF5 file: %w", syscall.ENOENT)
	}
	if set.at >= 0 {
		hf.reads.Add(1)
		d.mu.Unlock()
		defer hf.reads.Done()
		return hf.readDirect(set, first, count)
	}
	defer d.mu.Unlock()
	defer recoverLibrary(&err)
	defer quiet()()
	return d.readRows(hf, set, first, count)
}

// readDirect reads count rows from row first of set at their offset in
// the file (set.at is not -1). Handle.ReadAt counts the read and fails
// with source.ErrChanged if the file changed since List.
func (hf *h5File) readDirect(set *h5Set, first, count uint) ([]byte, error) {
	buf := make([]byte, set.rowLen*int64(count))
	if len(buf) == 0 {
		return buf, nil
	}
	n, err := hf.h.ReadAt(buf, set.at+int64(first)*set.rowLen)
	if err == io.EOF {
		// Only a file shorter than when listed, which its version
		// check would have caught; never hand back part of a row.
		err = fmt.Errorf("%w: the file ends %d bytes into the rows", ErrFormat, n)
	}
	if err != nil {
		return nil, err
	}
	return buf, nil
}

// readRows reads count rows from row first of set through the library,
// raw in the file's byte order: ReadSubset's memory type is the dataset's
// own. d.mu is held.
func (d *h5Dataset) readRows(hf *h5File, set *h5Set, first, count uint) ([]byte, error) {
	rank := len(set.dims)
	offset, cnt := make([]uint, rank), make([]uint, rank)
	offset[0], cnt[0] = first, count
	copy(cnt[1:], set.dims[1:])
	fspace := set.ds.Space()
	if fspace == nil {
		return nil, fmt.Errorf("%w: no dataspace", ErrFormat)
	}
	defer fspace.Close()
	if err := fspace.SelectHyperslab(offset, nil, cnt, nil); err != nil {
		return nil, err
	}
	mspace, err := hdf5.CreateSimpleDataspace(cnt, nil)
	if err != nil {
		return nil, err
	}
	defer mspace.Close()
	buf := make([]byte, set.rowLen*int64(count))
	if len(buf) == 0 {
		return buf, nil
	}
	if err := set.ds.ReadSubset(&buf, mspace, fspace); err != nil {
		return nil, err
	}
	if d.src != nil { // nil in the preflight child
		d.src.Count(1, int64(len(buf)))
	}
	if hf.h != nil {
		// The library read the file itself: rows read while it was
		// rewritten may mix two versions.
		if err := hf.h.Check(); err != nil {
			return nil, err
		}
	}
	return buf, nil
}

// close waits for the file's direct reads and closes it. d.mu is held.
func (f *h5File) close() {
	f.reads.Wait()
	f.closed = true
	for _, s := range f.sets {
		s.ds.Close()
	}
	f.f.Close()
	if f.h != nil {
		f.h.Close()
	}
}

func (d *h5Dataset) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, f := range d.files {
		f.close()
	}
	for _, f := range d.retired {
		f.close()
	}
	d.files, d.retired = map[string]*h5File{}, nil
	return nil
}

// quiet keeps the goroutine on its OS thread and turns off the library's
// printing of error stacks there (a setting per thread in a thread-safe
// HDF5 build); the returned func releases the thread.
func quiet() func() {
	runtime.LockOSThread()
	_ = hdf5.DisplayErrors(false)
	return runtime.UnlockOSThread
}

// recoverLibrary turns a panic in the HDF5 bindings (they index slices a
// crafted file can leave empty) into an error: a bad file must not take
// the daemon down.
func recoverLibrary(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%w: the HDF5 library failed on this file: %v", ErrFormat, r)
	}
}

// Locate implements loader.Coalescer: a dataset is a container whose
// samples are its rows, each at row × its .npy size.
func (d *h5Dataset) Locate(p string) (runs.Span, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.rows[p]
	if !ok {
		return runs.Span{}, false
	}
	return runs.Span{Container: r.file + "\x00" + r.set, Off: int64(r.row) * r.v.Size, Len: r.v.Size}, true
}

// ReadRun implements loader.Coalescer: one hyperslab read of the rows from
// the first to the last, each then given its .npy header.
//
// A run of a contiguous dataset is one read of its rows' bytes, outside
// the library's mutex.
func (d *h5Dataset) ReadRun(paths []string, wants []source.Version) ([][]byte, error) {
	rows, hf, err := d.run(paths, wants)
	if err != nil {
		return nil, err
	}
	set := hf.sets[rows[0].set]
	first, last := rows[0].row, rows[len(rows)-1].row
	data, err := d.read(hf, set, first, last-first+1)
	if err != nil {
		return nil, fmt.Errorf("%s: %s rows %d to %d: %w", rows[0].file, rows[0].set, first, last, err)
	}
	out := make([][]byte, len(rows))
	for i, r := range rows {
		b := make([]byte, 0, r.v.Size)
		b = append(b, set.header...)
		at := int64(r.row-first) * set.rowLen
		out[i] = append(b, data[at:at+set.rowLen]...)
	}
	return out, nil
}

// run looks up a run's rows, later and later rows of one dataset, each of
// the version wanted, and their file.
func (d *h5Dataset) run(paths []string, wants []source.Version) ([]h5Row, *h5File, error) {
	if len(paths) == 0 || len(wants) != len(paths) {
		return nil, nil, fmt.Errorf("packed: a run of %d rows and %d versions", len(paths), len(wants))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	rows := make([]h5Row, len(paths))
	for i, p := range paths {
		r, ok := d.rows[p]
		if !ok || (i > 0 && (r.file != rows[0].file || r.set != rows[0].set || r.row <= rows[i-1].row)) {
			return nil, nil, fmt.Errorf("packed: %s is not a later row of the run's dataset", p)
		}
		if r.v != wants[i] {
			return nil, nil, fmt.Errorf("%w: %s; write 'refresh' to the control file", source.ErrChanged, p)
		}
		rows[i] = r
	}
	hf := d.files[rows[0].file]
	if hf == nil {
		return nil, nil, fmt.Errorf("packed: %s: the HDF5 files are closed: %w", paths[0], syscall.ENOENT)
	}
	return rows, hf, nil
}
