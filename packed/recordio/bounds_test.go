package recordio

// Unit tests of every bound the decoders check, each at its value and one
// past it (the fuzzers rarely land on one exactly).

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
)

// part is one physical record: magic, lrecord (flag, length), the data
// and its padding.
func part(flag uint32, data []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, Magic)
	b = binary.LittleEndian.AppendUint32(b, flag<<29|uint32(len(data)))
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func TestDecodeHeaderBounds(t *testing.T) {
	h := func(flag, length uint32) []byte {
		return binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, Magic), flag<<29|length)
	}
	for _, flag := range []uint32{0, 1, 2, 3} {
		p, err := DecodeHeader(h(flag, MaxLength), 8)
		if err != nil || p.Flag != flag || p.Length != MaxLength || p.Offset != 8 {
			t.Errorf("flag %d, length MaxLength: %+v, %v", flag, p, err)
		}
	}
	for _, flag := range []uint32{4, 7} {
		if _, err := DecodeHeader(h(flag, 0), 0); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "continuation flag") {
			t.Errorf("flag %d: %v", flag, err)
		}
	}
	if _, err := DecodeHeader(h(0, 0)[:HeaderSize-1], 16); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "offset 16: 7 bytes left") {
		t.Errorf("7 bytes: %v", err)
	}
	bad := h(0, 0)
	bad[0] ^= 1
	if _, err := DecodeHeader(bad, 0); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "no record magic") {
		t.Errorf("bad magic: %v", err)
	}
	if p := (Part{Offset: 4, Length: 5}); p.Next() != 4+HeaderSize+8 {
		t.Errorf("Next of 5 bytes at 4 = %d, want padding to 8", p.Next())
	}
	if p := (Part{Offset: 4, Length: 8}); p.Next() != 4+HeaderSize+8 {
		t.Errorf("Next of 8 bytes at 4 = %d", p.Next())
	}
}

func TestReadRecordBounds(t *testing.T) {
	one := part(0, []byte("abcde")) // 8 + 5 + 3 padding
	size := int64(len(one))
	if rec, err := ReadRecord(bytes.NewReader(one), size, 0); err != nil || rec.Length != 5 || rec.Next() != size {
		t.Fatalf("a whole record: %+v, %v", rec, err)
	}
	// The data may end at the file's end, padding missing.
	if rec, err := ReadRecord(bytes.NewReader(one[:13]), 13, 0); err != nil || rec.Length != 5 {
		t.Fatalf("a record without its padding: %+v, %v", rec, err)
	}
	for name, c := range map[string]struct {
		b         []byte
		size, off int64
		want      string
	}{
		"data one byte short":   {one[:12], 12, 0, "runs past the end"},
		"header one byte short": {one[:7], 7, 0, "ends (7 bytes) inside a record"},
		"a negative offset":     {one, size, -1, "offset -1"},
		"an offset at the end":  {one, size, size, "inside a record"},
		"first part flag 2":     {part(2, []byte("x")), 12, 0, "flag 2 out of sequence"},
		"first part flag 3":     {part(3, []byte("x")), 12, 0, "flag 3 out of sequence"},
		"flag 1, then 0":        {append(part(1, []byte("x")), part(0, []byte("y"))...), 24, 0, "flag 0 out of sequence"},
		"flag 1, then 1":        {append(part(1, []byte("x")), part(1, []byte("y"))...), 24, 0, "flag 1 out of sequence"},
		"flag 1, then the end":  {part(1, []byte("x")), 12, 0, "truncated"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ReadRecord(bytes.NewReader(c.b), c.size, c.off); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v, want ErrFormat saying %q", err, c.want)
			}
		})
	}
	// Parts join with the magic between them: 1, 2, 3.
	split := append(append(part(1, []byte("ab")), part(2, nil)...), part(3, []byte("c"))...)
	rec, err := ReadRecord(bytes.NewReader(split), int64(len(split)), 0)
	if err != nil || len(rec.Parts) != 3 || rec.Length != 2+4+0+4+1 || rec.Contiguous() {
		t.Fatalf("three parts: %+v, %v", rec, err)
	}
	data, err := ReadData(bytes.NewReader(split), rec)
	magic := binary.LittleEndian.AppendUint32(nil, Magic)
	if want := append(append(append([]byte("ab"), magic...), magic...), 'c'); err != nil || !bytes.Equal(data, want) {
		t.Fatalf("joined data %q, %v; want %q", data, err, want)
	}
}

// TestMaxParts: a record of maxParts parts reads, one of more is refused.
func TestMaxParts(t *testing.T) {
	chain := func(parts int) []byte {
		b := make([]byte, 0, parts*HeaderSize)
		b = append(b, part(1, nil)...)
		for i := 2; i < parts; i++ {
			b = append(b, part(2, nil)...)
		}
		return append(b, part(3, nil)...)
	}
	b := chain(maxParts)
	rec, err := ReadRecord(bytes.NewReader(b), int64(len(b)), 0)
	if err != nil || len(rec.Parts) != maxParts || rec.Length != 4*(maxParts-1) {
		t.Fatalf("%d parts: %d parts, %v", maxParts, len(rec.Parts), err)
	}
	b = chain(maxParts + 1)
	if _, err := ReadRecord(bytes.NewReader(b), int64(len(b)), 0); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("%d parts: %v", maxParts+1, err)
	}
}

func TestDecodeIRHeaderBounds(t *testing.T) {
	ir := func(flag uint32, labels ...float32) []byte {
		b := binary.LittleEndian.AppendUint32(nil, flag)
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(2.5))
		b = binary.LittleEndian.AppendUint64(b, 11)
		b = binary.LittleEndian.AppendUint64(b, 12)
		for _, l := range labels {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(l))
		}
		return b
	}
	if h, err := DecodeIRHeader(ir(0), IRHeaderSize); err != nil || h.FirstLabel() != 2.5 || h.ID != 11 || h.ID2 != 12 || h.Size() != IRHeaderSize {
		t.Fatalf("a header filling its record: %+v, %v", h, err)
	}
	if _, err := DecodeIRHeader(ir(0), IRHeaderSize-1); !errors.Is(err, ErrFormat) {
		t.Fatalf("a record of 23 bytes: %v", err)
	}
	if _, err := DecodeIRHeader(ir(0)[:IRHeaderSize-1], 100); !errors.Is(err, ErrFormat) {
		t.Fatalf("23 bytes given: %v", err)
	}
	// Two labels that fill the record exactly; one more does not fit.
	h, err := DecodeIRHeader(ir(2, 7, 8), IRHeaderSize+8)
	if err != nil || len(h.Labels) != 2 || h.FirstLabel() != 7 || h.Size() != IRHeaderSize+8 {
		t.Fatalf("two labels: %+v, %v", h, err)
	}
	if _, err := DecodeIRHeader(ir(3, 7, 8), IRHeaderSize+8); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "3 labels") {
		t.Fatalf("three labels in room for two: %v", err)
	}
	// Labels the caller did not read are not made up.
	if h, err := DecodeIRHeader(ir(2, 7), 100); err != nil || len(h.Labels) != 1 {
		t.Fatalf("one of two labels read: %+v, %v", h, err)
	}
	if h, _ := DecodeIRHeader(ir(math.MaxUint32), 100); h.Labels != nil {
		t.Fatal("a huge label count decoded labels")
	}
}

func TestParseIndexBounds(t *testing.T) {
	got, err := ParseIndex([]byte("18446744073709551615\t9223372036854775807\n 3 \t 0 \n"))
	if err != nil || len(got) != 2 || got[0].Key != math.MaxUint64 || got[0].Offset != math.MaxInt64 || got[1] != (IndexEntry{3, 0}) {
		t.Fatalf("%v, %v", got, err)
	}
	for _, bad := range []string{"18446744073709551616\t0", "0\t9223372036854775808", "0\t-1", "\t0", "0", "0\t1\t2"} {
		_, err := ParseIndex([]byte("1\t0\n" + bad + "\n"))
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%q: %v, want ErrFormat naming line 2", bad, err)
		}
	}
	if _, err := ParseIndex([]byte(strings.Repeat("x", 100))); err == nil || !strings.Contains(err.Error(), strings.Repeat("x", 64)+"...") {
		t.Errorf("a long bad line is not clipped: %v", err)
	}
}
