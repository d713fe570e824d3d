package packed

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/dlfs/dlfs/seqfile"
	"github.com/dlfs/dlfs/source"
)

// listAndRead opens dir as a packed dataset under a small entry bound,
// lists it and reads every sample: whatever the bytes, nothing panics and
// nothing allocates past the bound's worth.
func listAndRead(t *testing.T, dir string) {
	s, err := source.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d, err := Open(dir, s, Config{MaxEntries: 1000})
	if err != nil || d == nil {
		return
	}
	defer d.Close()
	files, err := d.List(context.Background())
	if err != nil {
		return
	}
	if len(files) > 1000 {
		t.Fatalf("%d entries listed past the bound of 1000", len(files))
	}
	for _, f := range files {
		if f.Mode&0o170000 != 0o100000 || f.Size > 1<<20 {
			continue
		}
		v := source.Version{Size: f.Size, Mtime: f.Mtime, Ctime: f.Ctime, Ino: f.Ino}
		d.ReadAt(f.Path, v, make([]byte, f.Size), 0)
	}
}

func write(t *testing.T, dir, name string, b []byte) {
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// FuzzSeqListing: a crafted index and shard.
func FuzzSeqListing(f *testing.F) {
	dir := f.TempDir()
	w, err := seqfile.Create(filepath.Join(dir, seqfile.ShardName(0)), 0)
	if err != nil {
		f.Fatal(err)
	}
	e1, _ := w.Append("a/b.jpg", 0o100644, 1, []byte("hello"))
	e2, _ := w.Append("link", 0o120777, 1, []byte("a/b.jpg"))
	w.Close()
	ix, err := seqfile.NewIndex([]string{seqfile.ShardName(0)}, []seqfile.Entry{e1, e2})
	if err != nil {
		f.Fatal(err)
	}
	shard, _ := os.ReadFile(filepath.Join(dir, seqfile.ShardName(0)))
	f.Add(ix.Encode(), shard)
	f.Add([]byte("DLFSIDX\x00"), []byte("DLFSSEQ\x00"))
	f.Fuzz(func(t *testing.T, index, shard []byte) {
		dir := t.TempDir()
		write(t, dir, seqfile.IndexName, index)
		write(t, dir, seqfile.ShardName(0), shard)
		listAndRead(t, dir)
	})
}

// FuzzRecordIOListing: a crafted .rec file, with or without an .idx.
func FuzzRecordIOListing(f *testing.F) {
	rec := func(label float32, id uint64, img string) []byte {
		payload := binary.LittleEndian.AppendUint32(nil, 0) // flag
		payload = binary.LittleEndian.AppendUint32(payload, math.Float32bits(label))
		payload = binary.LittleEndian.AppendUint64(payload, id)
		payload = binary.LittleEndian.AppendUint64(payload, 0)
		payload = append(payload, img...)
		b := binary.LittleEndian.AppendUint32(nil, 0xced7230a)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
		b = append(b, payload...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	two := append(rec(0, 1, "jpeg-one"), rec(1, 2, "jpeg-two!")...)
	f.Add(two, []byte("1\t0\n2\t40\n"))
	f.Add(two, []byte{})
	f.Add([]byte{0x0a, 0x23, 0xd7, 0xce, 0xff, 0xff, 0xff, 0x1f}, []byte("0\t99999999999\n"))
	f.Fuzz(func(t *testing.T, recBytes, idx []byte) {
		dir := t.TempDir()
		write(t, dir, "train.rec", recBytes)
		if len(idx) > 0 {
			write(t, dir, "train.idx", idx)
		}
		listAndRead(t, dir)
	})
}

// FuzzHDF5Listing: a crafted HDF5 file, read by libhdf5 through the same
// path as a mount.
func FuzzHDF5Listing(f *testing.F) {
	small, err := os.ReadFile("testdata/small.h5")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(small)
	f.Add([]byte("\x89HDF\r\n\x1a\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		write(t, dir, "x.h5", b)
		listAndRead(t, dir)
	})
}
