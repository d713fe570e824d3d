package seqfile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// pack writes n records over shards and returns the index.
func pack(t testing.TB, dir string, n, shards int) (*Index, map[string][]byte) {
	t.Helper()
	ws := make([]*Writer, shards)
	names := make([]string, shards)
	for i := range ws {
		names[i] = ShardName(i)
		w, err := Create(filepath.Join(dir, names[i]), i)
		if err != nil {
			t.Fatal(err)
		}
		ws[i] = w
	}
	want := map[string][]byte{}
	entries := []Entry{{Name: "train", Mode: syscall.S_IFDIR | 0o755}, {Name: "empty", Mode: syscall.S_IFDIR | 0o700}}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("train/c%d/img_%04d.jpg", i%3, i)
		data := bytes.Repeat([]byte{byte(i)}, i*37%500)
		e, err := ws[i%shards].Append(name, syscall.S_IFREG|0o644, int64(i)*1e9, data)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, e)
		want[name] = data
	}
	for _, w := range ws {
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	ix, err := NewIndex(names, entries)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteIndex(dir, ix); err != nil {
		t.Fatal(err)
	}
	return ix, want
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	_, want := pack(t, dir, 100, 3)
	ix, err := ReadIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range want {
		e, ok := ix.Lookup(name)
		if !ok {
			t.Fatalf("%s not in the index", name)
		}
		f, _ := os.Open(filepath.Join(dir, ix.Shards[e.Shard]))
		fi, _ := f.Stat()
		rec, err := ReadRecord(f, fi.Size(), e.Offset)
		f.Close()
		if err != nil || rec.Name != name || !bytes.Equal(rec.Data, data) || rec.Mode != syscall.S_IFREG|0o644 {
			t.Fatalf("%s: %+v, %v", name, rec.Header, err)
		}
		// The payload sits at DataOffset.
		b, _ := os.ReadFile(filepath.Join(dir, ix.Shards[e.Shard]))
		if !bytes.Equal(b[e.DataOffset():e.DataOffset()+e.Length], data) {
			t.Fatalf("%s: payload not at DataOffset", name)
		}
	}
	if e, ok := ix.Lookup("empty"); !ok || !e.IsDir() || e.Mode&0o777 != 0o700 {
		t.Errorf("empty directory: %+v %v", e, ok)
	}
	// Each shard starts with the file header, then its records in order.
	var scanned int
	for i := range ix.Shards {
		f, _ := os.Open(filepath.Join(dir, ix.Shards[i]))
		fi, _ := f.Stat()
		var fh [FileHeader]byte
		if _, err := f.ReadAt(fh[:], 0); err != nil || [8]byte(fh[:8]) != fileMagic || binary.LittleEndian.Uint32(fh[8:]) != Version {
			t.Fatalf("shard %d: file header %q, %v", i, fh, err)
		}
		if err := walk(f, fi.Size(), func(off int64, r Record) error { scanned++; return nil }); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if scanned != 100 {
		t.Errorf("scanned %d records, want 100", scanned)
	}
}

// TestSplit: any number of partitions covers every record exactly once,
// with about equal bytes, whatever the number of shards.
func TestSplit(t *testing.T) {
	ix, _ := pack(t, t.TempDir(), 200, 3)
	var total int64
	for _, r := range ix.Records() {
		total += r.RecordSize()
	}
	for _, n := range []int{1, 2, 4, 7, 10} {
		seen := map[string]int{}
		for k := 0; k < n; k++ {
			var bytes int64
			for _, e := range ix.Split(k, n) {
				seen[e.Name]++
				bytes += e.RecordSize()
			}
			if n > 1 && (float64(bytes) < 0.8*float64(total)/float64(n) || float64(bytes) > 1.2*float64(total)/float64(n)) {
				t.Errorf("n=%d: partition %d holds %d of %d bytes", n, k, bytes, total)
			}
		}
		if len(seen) != 200 {
			t.Fatalf("n=%d: %d records covered, want 200", n, len(seen))
		}
		for name, c := range seen {
			if c != 1 {
				t.Fatalf("n=%d: %s in %d partitions", n, name, c)
			}
		}
	}
}

// TestCorruption: a flipped payload byte, a truncated shard and a
// truncated or corrupt index give errors that say what and where.
func TestCorruption(t *testing.T) {
	dir := t.TempDir()
	ix, _ := pack(t, dir, 20, 1)
	shard := filepath.Join(dir, ix.Shards[0])
	b, _ := os.ReadFile(shard)
	e, _ := ix.Lookup("train/c1/img_0010.jpg")
	bad := append([]byte(nil), b...)
	bad[e.DataOffset()+1] ^= 0xff
	_, err := ReadRecord(bytes.NewReader(bad), int64(len(bad)), e.Offset)
	if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), fmt.Sprint(e.Offset)) || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("flipped byte: %v", err)
	}
	cut := b[:e.Offset+HeaderSize+5]
	if _, err := ReadRecord(bytes.NewReader(cut), int64(len(cut)), e.Offset); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated shard: %v", err)
	}
	if err := walk(bytes.NewReader(cut), int64(len(cut)), func(int64, Record) error { return nil }); !errors.Is(err, ErrFormat) {
		t.Errorf("scanning a truncated shard: %v", err)
	}
	idx, _ := os.ReadFile(filepath.Join(dir, IndexName))
	for _, c := range [][]byte{idx[:len(idx)-9], append(append([]byte(nil), idx[:40]...), idx[41:]...), []byte("junk")} {
		if _, err := DecodeIndex(c); !errors.Is(err, ErrFormat) {
			t.Errorf("bad index of %d bytes: %v", len(c), err)
		}
	}
}

// walk reads a shard's records in order with ReadRecord, from the end of
// the file header to the end of the shard, and calls fn with each and its
// offset. It stops at the first bad record, returning its error.
func walk(r io.ReaderAt, size int64, fn func(off int64, rec Record) error) error {
	for off := int64(FileHeader); off < size; {
		rec, err := ReadRecord(r, size, off)
		if err != nil {
			return err
		}
		if err := fn(off, rec); err != nil {
			return err
		}
		off += rec.RecordSize()
	}
	return nil
}

func FuzzDecodeIndex(f *testing.F) {
	ix, _ := pack(f, f.TempDir(), 5, 2)
	f.Add(ix.Encode())
	f.Add([]byte("DLFSIDX\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ix, err := DecodeIndex(b)
		if err != nil {
			if !errors.Is(err, ErrFormat) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q: want one line wrapping ErrFormat", err)
			}
			return
		}
		if !bytes.Equal(ix.Encode(), b) {
			t.Fatal("a decoded index does not encode back to its bytes")
		}
	})
}

func FuzzReadRecord(f *testing.F) {
	dir := f.TempDir()
	ix, _ := pack(f, dir, 3, 1)
	b, _ := os.ReadFile(filepath.Join(dir, ix.Shards[0]))
	f.Add(b)
	f.Add(b[:30])
	f.Fuzz(func(t *testing.T, b []byte) {
		err := walk(bytes.NewReader(b), int64(len(b)), func(off int64, r Record) error {
			if off < FileHeader || off+r.RecordSize() > int64(len(b))+3 {
				t.Fatalf("record at %d of %d bytes out of bounds", off, r.RecordSize())
			}
			return nil
		})
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Fatalf("error %q spans lines", err)
		}
	})
}

// TestHeaderChecksum: a flipped bit anywhere in a record header's first 36
// bytes fails the header's checksum (or a field check), never decodes as
// another header.
func TestHeaderChecksum(t *testing.T) {
	var b [HeaderSize]byte
	encodeHeader(b[:], Header{Length: 5, Mode: 0o100644, NameLen: 3, Mtime: 7, CRC: 9})
	if _, err := DecodeHeader(b[:]); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 36; i++ {
		for bit := 0; bit < 8; bit++ {
			c := b
			c[i] ^= 1 << bit
			if h, err := DecodeHeader(c[:]); err == nil {
				t.Fatalf("byte %d bit %d flipped decodes as %+v", i, bit, h)
			}
		}
	}
	c := b
	c[37] ^= 1 // in the checksum itself
	if _, err := DecodeHeader(c[:]); err == nil {
		t.Fatal("a flipped checksum decodes")
	}
}
