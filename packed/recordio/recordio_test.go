package recordio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
)

// write appends data as dmlc's RecordIOWriter::WriteRecord does: split at
// every 4-byte-aligned magic, which is dropped, then padded to 4 bytes.
func write(w *bytes.Buffer, data []byte) {
	le := binary.LittleEndian
	head := func(flag uint32, n int) {
		w.Write(le.AppendUint32(nil, Magic))
		w.Write(le.AppendUint32(nil, flag<<29|uint32(n)))
	}
	dptr := 0
	for i := 0; i+4 <= len(data)&^3; i += 4 {
		if le.Uint32(data[i:]) == Magic {
			flag := uint32(2)
			if dptr == 0 {
				flag = 1
			}
			head(flag, i-dptr)
			w.Write(data[dptr:i])
			dptr = i + 4
		}
	}
	flag := uint32(0)
	if dptr != 0 {
		flag = 3
	}
	head(flag, len(data)-dptr)
	w.Write(data[dptr:])
	w.Write(make([]byte, (4-len(data)%4)%4))
}

// image returns an im2rec record: IRHeader and image bytes.
func image(label float32, id uint64, img []byte, labels ...float32) []byte {
	le := binary.LittleEndian
	b := le.AppendUint32(nil, uint32(len(labels)))
	b = le.AppendUint32(b, math.Float32bits(label))
	b = le.AppendUint64(b, id)
	b = le.AppendUint64(b, 0)
	for _, l := range labels {
		b = le.AppendUint32(b, math.Float32bits(l))
	}
	return append(b, img...)
}

func TestReadRecords(t *testing.T) {
	magic := binary.LittleEndian.AppendUint32(nil, Magic)
	datas := [][]byte{
		image(3, 7, []byte("jpeg bytes")),
		image(0, 8, bytes.Join([][]byte{[]byte("abcd"), magic, []byte("efgh"), magic, []byte("ij")}, nil)), // split in 3 parts
		image(0, 9, []byte("x"), 5, 6),
		image(1, 10, append([]byte("abcd"), magic...)), // the magic last: an empty final part
	}
	var f bytes.Buffer
	for _, d := range datas {
		write(&f, d)
	}
	r := bytes.NewReader(f.Bytes())
	size := int64(f.Len())
	off := int64(0)
	for i, want := range datas {
		rec, err := ReadRecord(r, size, off)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		got, err := ReadData(r, rec)
		if err != nil || !bytes.Equal(got, want) || rec.Length != int64(len(want)) {
			t.Fatalf("record %d: %q (%d parts), want %q", i, got, len(rec.Parts), want)
		}
		h, err := DecodeIRHeader(got, rec.Length)
		if err != nil {
			t.Fatal(err)
		}
		if i == 2 && (h.FirstLabel() != 5 || h.Size() != 32 || h.ID != 9) {
			t.Errorf("label vector record: %+v", h)
		}
		if i == 0 && (h.FirstLabel() != 3 || !rec.Contiguous() || !bytes.Equal(got[h.Size():], []byte("jpeg bytes"))) {
			t.Errorf("plain record: %+v", h)
		}
		off = rec.Next()
	}
	if off != size {
		t.Errorf("records end at %d, file at %d", off, size)
	}
	// Truncation and garbage give errors naming the offset.
	if _, err := ReadRecord(r, size-3, 0); err == nil {
		t.Log("first record fits")
	}
	if _, err := ReadRecord(bytes.NewReader(f.Bytes()[:10]), 10, 0); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated: %v", err)
	}
	if _, err := ReadRecord(bytes.NewReader([]byte("garbage!")), 8, 0); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "offset 0") {
		t.Errorf("garbage: %v", err)
	}
}

func FuzzReadRecord(f *testing.F) {
	var b bytes.Buffer
	write(&b, image(1, 2, []byte("abcdefg")))
	f.Add(b.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		for off := int64(0); off < int64(len(b)); {
			rec, err := ReadRecord(r, int64(len(b)), off)
			if err != nil {
				if !errors.Is(err, ErrFormat) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("error %q", err)
				}
				return
			}
			data, err := ReadData(r, rec)
			if err != nil || int64(len(data)) != rec.Length {
				t.Fatalf("data of %d bytes for a record of %d: %v", len(data), rec.Length, err)
			}
			if _, err := DecodeIRHeader(data, rec.Length); err != nil && !errors.Is(err, ErrFormat) {
				t.Fatal(err)
			}
			if rec.Next() <= off {
				t.Fatal("no progress")
			}
			off = rec.Next()
		}
	})
}

func TestParseIndex(t *testing.T) {
	got, err := ParseIndex([]byte("0\t0\n1\t44\r\n\n7\t1000\n"))
	if err != nil || len(got) != 3 || got[1] != (IndexEntry{1, 44}) || got[2] != (IndexEntry{7, 1000}) {
		t.Fatalf("%v, %v", got, err)
	}
	for _, bad := range []string{"1 2\n", "x\t1\n", "1\t-4\n", "1\t\n"} {
		if _, err := ParseIndex([]byte(bad)); !errors.Is(err, ErrFormat) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func FuzzParseIndex(f *testing.F) {
	f.Add([]byte("0\t0\n1\t44\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		es, err := ParseIndex(b)
		if err != nil {
			if !errors.Is(err, ErrFormat) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q", err)
			}
			return
		}
		for _, e := range es {
			if e.Offset < 0 {
				t.Fatal("negative offset")
			}
		}
	})
}
