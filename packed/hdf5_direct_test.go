//go:build cgo && !nohdf5

package packed

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"gonum.org/v1/hdf5"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/source"
)

// h5Spec is a dataset for writeH5: contiguous unless chunk is set.
type h5Spec struct {
	name  string
	typ   *hdf5.Datatype
	dims  []uint
	chunk []uint
	gzip  bool
}

// writeH5 writes an HDF5 file of the datasets in specs, each filled with
// bytes that differ from row to row and dataset to dataset, and returns
// those bytes by dataset name: the rows raw, as the file holds them.
func writeH5(t *testing.T, file string, specs []h5Spec) map[string][]byte {
	t.Helper()
	defer quiet()()
	f, err := hdf5.CreateFile(file, hdf5.F_ACC_TRUNC)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := map[string][]byte{}
	for k, s := range specs {
		space, err := hdf5.CreateSimpleDataspace(s.dims, nil)
		if err != nil {
			t.Fatal(err)
		}
		dcpl, err := hdf5.NewPropList(hdf5.P_DATASET_CREATE)
		if err != nil {
			t.Fatal(err)
		}
		if s.chunk != nil {
			if err := dcpl.SetChunk(s.chunk); err != nil {
				t.Fatal(err)
			}
		}
		if s.gzip {
			if err := dcpl.SetDeflate(6); err != nil {
				t.Fatal(err)
			}
		}
		ds, err := f.CreateDatasetWith(s.name, s.typ, space, dcpl)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		n := int(s.typ.Size())
		for _, d := range s.dims {
			n *= int(d)
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7 + i/251 + 31*k) // not periodic in a row's length
		}
		// The memory type is the file's own: the bytes go in as they are.
		if err := ds.Write(&b); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		data[s.name] = b
		ds.Close()
		dcpl.Close()
		space.Close()
	}
	return data
}

// openH5Dir opens dir's HDF5 files and lists them, logging to logs.
func openH5Dir(t *testing.T, dir string, logs *bytes.Buffer) (*h5Dataset, *source.Source, map[string]catalog.File) {
	t.Helper()
	s, err := source.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	d, err := Open(dir, s, Config{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil || d == nil {
		t.Fatalf("Open: %v, %v", d, err)
	}
	t.Cleanup(func() { d.Close() })
	files, err := d.List(context.Background())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	byPath := map[string]catalog.File{}
	for _, f := range files {
		byPath[f.Path] = f
	}
	return d.(*h5Dataset), s, byPath
}

func versionOf(f catalog.File) source.Version {
	return source.Version{Size: f.Size, Mtime: f.Mtime, Ctime: f.Ctime, Ino: f.Ino}
}

// libraryRows reads rows through the HDF5 library, as every row was read
// before direct reads.
func libraryRows(t *testing.T, d *h5Dataset, file, set string, first, count uint) []byte {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	defer quiet()()
	hf := d.files[file]
	b, err := d.readRows(hf, hf.sets[set], first, count)
	if err != nil {
		t.Fatalf("library read of %s rows %d+%d: %v", set, first, count, err)
	}
	return b
}

// rowsOf returns the .npy files listed in dir, in row order (their
// names sort so).
func rowsOf(files map[string]catalog.File, dir string) []catalog.File {
	var out []catalog.File
	for p, f := range files {
		if path.Dir(p) == dir && strings.HasSuffix(p, ".npy") {
			out = append(out, f)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// TestHDF5DirectRows: the rows of contiguous datasets are read at their
// offset in the file, not by the library: each read, whole, in part or in
// a run, returns the bytes written and the bytes the library reads, and
// costs the PFS one read of exactly the row's bytes. Several types and
// shapes, rows of 2 to 8000 bytes, none a multiple of a block.
func TestHDF5DirectRows(t *testing.T) {
	dir := t.TempDir()
	specs := []h5Spec{
		{name: "i1", typ: hdf5.T_STD_I8LE, dims: []uint{13, 3}},
		{name: "u2be", typ: hdf5.T_STD_U16BE, dims: []uint{5}},
		{name: "i4be", typ: hdf5.T_STD_I32BE, dims: []uint{7, 5, 3}},
		{name: "f8", typ: hdf5.T_IEEE_F64LE, dims: []uint{6, 1000}},
		{name: "f4be", typ: hdf5.T_IEEE_F32BE, dims: []uint{4, 1025}},
	}
	data := writeH5(t, filepath.Join(dir, "x.h5"), specs)
	var logs bytes.Buffer
	d, s, files := openH5Dir(t, dir, &logs)
	for _, sp := range specs {
		set := d.files["x.h5"].sets[sp.name]
		if set == nil || set.at < 0 {
			t.Fatalf("%s: %+v; want a contiguous dataset read directly", sp.name, set)
		}
		rows := rowsOf(files, sp.name)
		if len(rows) != int(sp.dims[0]) {
			t.Fatalf("%s: %d rows listed, want %d", sp.name, len(rows), sp.dims[0])
		}
		rowLen := len(data[sp.name]) / int(sp.dims[0])
		lib := libraryRows(t, d, "x.h5", sp.name, 0, sp.dims[0])
		if !bytes.Equal(lib, data[sp.name]) {
			t.Fatalf("%s: the library reads other bytes than were written", sp.name)
		}
		// The library can no longer read this dataset: every read below
		// must go to the file itself.
		set.ds.Close()
		for i, f := range rows {
			want := append(append([]byte{}, set.header...), lib[i*rowLen:(i+1)*rowLen]...)
			before := s.Stats()
			buf := make([]byte, f.Size+10)
			n, err := d.ReadAt(f.Path, versionOf(f), buf, 0)
			if err != nil || !bytes.Equal(buf[:n], want) {
				t.Fatalf("%s: %d bytes, %v; want the library's %d", f.Path, n, err, len(want))
			}
			if got := s.Stats(); got.Bytes-before.Bytes != int64(rowLen) || got.ReadOps-before.ReadOps != 1 {
				t.Errorf("%s: the PFS read %d bytes in %d reads, want %d in 1", f.Path, got.Bytes-before.Bytes, got.ReadOps-before.ReadOps, rowLen)
			}
			// Part of a row: the header's last byte and the row's first.
			off := int64(len(set.header)) - 1
			if n, err := d.ReadAt(f.Path, versionOf(f), buf[:2], off); err != nil || n != 2 || !bytes.Equal(buf[:2], want[off:off+2]) {
				t.Errorf("%s at %d: %d bytes, %v", f.Path, off, n, err)
			}
		}
		// A run of rows 1 to 3: one read of their bytes.
		var paths []string
		var wants []source.Version
		for _, f := range rows[1:4] {
			paths, wants = append(paths, f.Path), append(wants, versionOf(f))
		}
		before := s.Stats()
		got, err := d.ReadRun(paths, wants)
		if err != nil || len(got) != 3 {
			t.Fatalf("%s: run: %d rows, %v", sp.name, len(got), err)
		}
		if st := s.Stats(); st.Bytes-before.Bytes != int64(3*rowLen) || st.ReadOps-before.ReadOps != 1 {
			t.Errorf("%s: a run of 3 rows read %d bytes in %d reads, want %d in 1", sp.name, st.Bytes-before.Bytes, st.ReadOps-before.ReadOps, 3*rowLen)
		}
		for i, b := range got {
			if !bytes.Equal(b[len(set.header):], lib[(i+1)*rowLen:(i+2)*rowLen]) || !bytes.Equal(b[:len(set.header)], set.header) {
				t.Errorf("%s: run row %d differs", sp.name, i+1)
			}
		}
	}
}

// TestHDF5LibraryRows: chunked and compressed datasets, whose rows do not
// lie in the file as they are, are still read by the library, and read
// right.
func TestHDF5LibraryRows(t *testing.T) {
	dir := t.TempDir()
	specs := []h5Spec{
		{name: "chunked", typ: hdf5.T_IEEE_F32LE, dims: []uint{20, 6}, chunk: []uint{3, 6}},
		{name: "gzip", typ: hdf5.T_STD_I64BE, dims: []uint{9, 4}, chunk: []uint{2, 4}, gzip: true},
	}
	data := writeH5(t, filepath.Join(dir, "x.h5"), specs)
	var logs bytes.Buffer
	d, _, files := openH5Dir(t, dir, &logs)
	for _, sp := range specs {
		set := d.files["x.h5"].sets[sp.name]
		if set == nil || set.at != -1 {
			t.Fatalf("%s: %+v; want it read by the library", sp.name, set)
		}
		rowLen := len(data[sp.name]) / int(sp.dims[0])
		for i, f := range rowsOf(files, sp.name) {
			buf := make([]byte, f.Size)
			n, err := d.ReadAt(f.Path, versionOf(f), buf, 0)
			if err != nil || !bytes.Equal(buf[len(set.header):n], data[sp.name][i*rowLen:(i+1)*rowLen]) {
				t.Fatalf("%s: %d bytes, %v", f.Path, n, err)
			}
		}
		// Without the library, these rows cannot be read.
		set.ds.Close()
		f := rowsOf(files, sp.name)[0]
		if _, err := d.ReadAt(f.Path, versionOf(f), make([]byte, f.Size), 0); err == nil {
			t.Errorf("%s: read with the library's dataset closed", f.Path)
		}
	}
}

// TestHDF5Layouts: in a file with a user block (h5py's userblock_size,
// which HDF5's addresses start after), a contiguous dataset is read at its
// offset and a compact one and an unwritten one (its fill value) by the
// library, each as the library reads it. HDF5 1.10 gives an unwritten
// dataset an offset inside the user block.
func TestHDF5Layouts(t *testing.T) {
	b, err := os.ReadFile("testdata/layouts.h5")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write(t, dir, "layouts.h5", b)
	var logs bytes.Buffer
	d, _, files := openH5Dir(t, dir, &logs)
	fill := binary.LittleEndian.AppendUint64(nil, math.Float64bits(7.5))
	for _, c := range []struct {
		set    string
		direct bool
		row1   []byte // row 1, raw
	}{
		{"contiguous", true, []byte{0, 3, 0, 4, 0, 5}}, // >i2 arange(15).reshape(5, 3)
		{"compact", false, []byte{2, 0, 0, 0, 3, 0, 0, 0}},
		{"unwritten", false, append(fill, fill...)},
	} {
		set := d.files["layouts.h5"].sets[c.set]
		if set == nil || (set.at >= 0) != c.direct {
			t.Fatalf("%s: %+v; want direct %v", c.set, set, c.direct)
		}
		rows := rowsOf(files, c.set)
		lib := libraryRows(t, d, "layouts.h5", c.set, 0, uint(len(rows)))
		rowLen := len(lib) / len(rows)
		if !bytes.Equal(lib[rowLen:2*rowLen], c.row1) {
			t.Errorf("%s: the library reads row 1 as %v, want %v", c.set, lib[rowLen:2*rowLen], c.row1)
		}
		for i, f := range rows {
			buf := make([]byte, f.Size)
			n, err := d.ReadAt(f.Path, versionOf(f), buf, 0)
			if err != nil || !bytes.Equal(buf[len(set.header):n], lib[i*rowLen:(i+1)*rowLen]) {
				t.Errorf("%s: %d bytes, %v; want the library's row", f.Path, n, err)
			}
		}
	}
}

// TestHDF5DirectChanged: a file rewritten after it was listed fails a
// direct read, alone or in a run, with source.ErrChanged instead of
// handing back bytes of either version.
func TestHDF5DirectChanged(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "x.h5")
	writeH5(t, file, []h5Spec{{name: "a", typ: hdf5.T_STD_U16LE, dims: []uint{4, 50}}})
	var logs bytes.Buffer
	d, _, files := openH5Dir(t, dir, &logs)
	if d.files["x.h5"].sets["a"].at < 0 {
		t.Fatal("the dataset is not read directly")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	// Other row bytes, and one byte more: a new size, whatever the clock.
	for i := len(b) - 400; i < len(b); i++ {
		b[i] ^= 0xff
	}
	if err := os.WriteFile(file, append(b, 0), 0o644); err != nil {
		t.Fatal(err)
	}
	rows := rowsOf(files, "a")
	if n, err := d.ReadAt(rows[0].Path, versionOf(rows[0]), make([]byte, rows[0].Size), 0); !errors.Is(err, source.ErrChanged) || n > len(d.files["x.h5"].sets["a"].header) {
		t.Errorf("row 0 of a rewritten file: %d bytes, %v; want source.ErrChanged", n, err)
	}
	if got, err := d.ReadRun([]string{rows[1].Path, rows[2].Path}, []source.Version{versionOf(rows[1]), versionOf(rows[2])}); !errors.Is(err, source.ErrChanged) || got != nil {
		t.Errorf("a run of a rewritten file: %d rows, %v; want source.ErrChanged", len(got), err)
	}
}

// TestHDF5CraftedOffset: a contiguous dataset whose data, by its layout,
// ends past the end of its file, or at an offset that overflows, is not
// shown, with one log line naming it (libhdf5 1.10 opens it); the dataset
// beside it reads right. One that ends exactly at the end is read there,
// as the library reads it.
func TestHDF5CraftedOffset(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "x.h5")
	data := writeH5(t, file, []h5Spec{
		{name: "a", typ: hdf5.T_STD_U8LE, dims: []uint{4, 100}},
		{name: "b", typ: hdf5.T_STD_U8LE, dims: []uint{4, 100}},
	})
	var logs bytes.Buffer
	d, _, _ := openH5Dir(t, dir, &logs)
	at := d.files["x.h5"].sets["a"].at
	d.Close()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	// a's layout message (version 3, contiguous): its address, its size.
	layout := func(addr uint64) []byte {
		return binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64([]byte{3, 1}, addr), 400)
	}
	if bytes.Count(b, layout(uint64(at))) != 1 {
		t.Fatalf("a's layout message is not in the file once")
	}
	size := uint64(len(b))
	for _, c := range []struct {
		name  string
		addr  uint64
		shown bool
	}{
		{"ends at the end", size - 400, true},
		{"ends a byte past the end", size - 399, false},
		{"past the end", size + 1, false},
		{"negative as int64", 1 << 63, false},
		{"overflows", 1<<64 - 256, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, "x.h5", bytes.Replace(b, layout(uint64(at)), layout(c.addr), 1))
			var logs bytes.Buffer
			d, _, files := openH5Dir(t, dir, &logs)
			set := d.files["x.h5"].sets["a"]
			if (set != nil) != c.shown || (len(rowsOf(files, "a")) > 0) != c.shown {
				t.Fatalf("a shown: %v, want %v", set != nil, c.shown)
			}
			if warned := strings.Count(logs.String(), "past the end of its file"); warned != map[bool]int{true: 0, false: 1}[c.shown] || (!c.shown && !strings.Contains(logs.String(), "dataset=/a")) {
				t.Errorf("log:\n%s", logs.String())
			}
			if c.shown {
				if set.at != int64(c.addr) {
					t.Fatalf("a at %d, want %d", set.at, c.addr)
				}
				lib := libraryRows(t, d, "x.h5", "a", 0, 4)
				for i, f := range rowsOf(files, "a") {
					buf := make([]byte, f.Size)
					n, err := d.ReadAt(f.Path, versionOf(f), buf, 0)
					if err != nil || !bytes.Equal(buf[len(set.header):n], lib[i*100:(i+1)*100]) {
						t.Errorf("%s: %d bytes, %v; want the library's row", f.Path, n, err)
					}
				}
			}
			for i, f := range rowsOf(files, "b") {
				buf := make([]byte, f.Size)
				n, err := d.ReadAt(f.Path, versionOf(f), buf, 0)
				if err != nil || !bytes.HasSuffix(buf[:n], data["b"][i*100:(i+1)*100]) {
					t.Errorf("%s: %d bytes, %v", f.Path, n, err)
				}
			}
		})
	}
}

// TestHDF5ReadsAndClose: direct and library reads run at once, with Close
// among them: each read returns its row or an error, and Close waits for
// the direct reads in flight (run with -race).
func TestHDF5ReadsAndClose(t *testing.T) {
	dir := t.TempDir()
	specs := []h5Spec{
		{name: "direct", typ: hdf5.T_STD_U8LE, dims: []uint{16, 300}},
		{name: "library", typ: hdf5.T_STD_U8LE, dims: []uint{16, 300}, chunk: []uint{4, 300}},
	}
	data := writeH5(t, filepath.Join(dir, "x.h5"), specs)
	var logs bytes.Buffer
	d, _, files := openH5Dir(t, dir, &logs)
	read := make(chan struct{}, 64)
	done := make(chan error, 8)
	for g := 0; g < 8; g++ {
		go func() {
			set := specs[g%2].name
			for k := 0; k < 50; k++ {
				for i, f := range rowsOf(files, set) {
					buf := make([]byte, f.Size)
					n, err := d.ReadAt(f.Path, versionOf(f), buf, 0)
					if err != nil {
						continue // closed
					}
					if !bytes.HasSuffix(buf[:n], data[set][i*300:(i+1)*300]) {
						done <- fmt.Errorf("%s: wrong bytes", f.Path)
						return
					}
					select {
					case read <- struct{}{}:
					default:
					}
				}
			}
			done <- nil
		}()
	}
	<-read
	d.Close()
	for g := 0; g < 8; g++ {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	f := rowsOf(files, "direct")[0]
	if _, err := d.ReadAt(f.Path, versionOf(f), make([]byte, f.Size), 0); err == nil {
		t.Error("a read after Close succeeded")
	}
}
