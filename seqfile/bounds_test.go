package seqfile

// Unit tests of every bound the decoders check, each at its value and one
// past it, on inputs built by hand with correct checksums, so that each
// check is reached on its own; and fuzzers that reseal what they mutate,
// so that a mutation gets past the checksums to the checks behind them.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strings"
	"syscall"
	"testing"
)

const (
	regMode  = syscall.S_IFREG | 0o644
	linkMode = syscall.S_IFLNK | 0o777
	dirMode  = syscall.S_IFDIR | 0o755
)

func TestDecodeIndexBounds(t *testing.T) {
	file := func(name string) Entry {
		return Entry{Name: name, Mode: regMode, Shard: 0, Offset: FileHeader, Length: 1}
	}
	with := func(mod func(*Entry)) []Entry {
		e := file("a")
		mod(&e)
		return []Entry{e}
	}
	cases := []struct {
		name    string
		shards  []string
		entries []Entry
		want    string // "" decodes
	}{
		{"empty", nil, nil, ""},
		{"one file", []string{"s0"}, []Entry{file("a")}, ""},
		{"a directory", nil, []Entry{{Name: "d", Mode: dirMode}}, ""},
		{"a directory with a length", nil, []Entry{{Name: "d", Mode: dirMode, Length: 1}}, "has a length"},
		{"shard name empty", []string{""}, []Entry{{Name: "d", Mode: dirMode}}, "plain file name"},
		{"shard name ..", []string{".."}, nil, "plain file name"},
		{"shard name .", []string{"."}, nil, "plain file name"},
		{"shard name with a slash", []string{"a/b"}, nil, "plain file name"},
		{"shard name with a NUL", []string{"a\x00"}, nil, "plain file name"},
		{"shard named as the index", []string{IndexName}, nil, "plain file name"},
		{"name of MaxName bytes", []string{"s0"}, []Entry{file(strings.Repeat("n", MaxName))}, ""},
		{"name past MaxName", []string{"s0"}, []Entry{file(strings.Repeat("n", MaxName+1))}, "not a clean relative path"},
		{"absolute name", []string{"s0"}, []Entry{file("/a")}, "not a clean relative path"},
		{"name climbing out", []string{"s0"}, []Entry{file("../a")}, "not a clean relative path"},
		{"names out of order", []string{"s0"}, []Entry{file("b"), file("a")}, "out of order"},
		{"a name twice", []string{"s0"}, []Entry{file("a"), file("a")}, "out of order"},
		{"last shard", []string{"s0", "s1"}, with(func(e *Entry) { e.Shard = 1 }), ""},
		{"shard past the last", []string{"s0", "s1"}, with(func(e *Entry) { e.Shard = 2 }), "shard 2 of 2"},
		{"offset at the file header", []string{"s0"}, with(func(e *Entry) { e.Offset = FileHeader }), ""},
		{"offset inside the file header", []string{"s0"}, with(func(e *Entry) { e.Offset = FileHeader - 1 }), "out of range"},
		{"offset 2^50", []string{"s0"}, with(func(e *Entry) { e.Offset = 1 << 50 }), ""},
		{"offset past 2^50", []string{"s0"}, with(func(e *Entry) { e.Offset = 1<<50 + 1 }), "out of range"},
		{"length 0", []string{"s0"}, with(func(e *Entry) { e.Length = 0 }), ""},
		{"length 2^40", []string{"s0"}, with(func(e *Entry) { e.Length = 1 << 40 }), ""},
		{"length past 2^40", []string{"s0"}, with(func(e *Entry) { e.Length = 1<<40 + 1 }), "out of range"},
		{"negative length", []string{"s0"}, with(func(e *Entry) { e.Length = -1 }), "out of range"},
		{"symlink target of MaxTarget", []string{"s0"}, with(func(e *Entry) { e.Mode, e.Length = linkMode, MaxTarget }), ""},
		{"symlink target past MaxTarget", []string{"s0"}, with(func(e *Entry) { e.Mode, e.Length = linkMode, MaxTarget+1 }), "target of 4096 bytes"},
		{"a fifo", []string{"s0"}, with(func(e *Entry) { e.Mode = syscall.S_IFIFO | 0o644 }), "not a file, directory or symlink"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := (&Index{Shards: c.shards, Entries: c.entries}).Encode()
			ix, err := DecodeIndex(b)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want == "" && len(ix.Entries) != len(c.entries):
				t.Fatalf("%d entries, want %d", len(ix.Entries), len(c.entries))
			case c.want != "" && (!errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("%v, want ErrFormat saying %q", err, c.want)
			}
		})
	}
}

// reseal rewrites an index's trailing checksum.
func reseal(b []byte) []byte {
	if len(b) < 4 {
		return b
	}
	body := b[:len(b)-4]
	return binary.LittleEndian.AppendUint32(bytes.Clone(body), crc32.Checksum(body, castagnoli))
}

func TestDecodeIndexFraming(t *testing.T) {
	good := (&Index{Shards: []string{"s0"}, Entries: []Entry{{Name: "a", Mode: regMode, Offset: FileHeader, Length: 1}}}).Encode()
	empty := (&Index{}).Encode()
	if len(empty) != 28 {
		t.Fatalf("an empty index is %d bytes, want 28", len(empty))
	}
	le := binary.LittleEndian
	// raw is an index of nShards and nEntries whose body after the counts
	// is p.
	raw := func(nShards uint32, nEntries uint64, p ...byte) []byte {
		b := append(indexMagic[:], 1, 0, 0, 0)
		b = le.AppendUint64(le.AppendUint32(b, nShards), nEntries)
		return reseal(append(append(b, p...), 0, 0, 0, 0))
	}
	set32 := func(b []byte, at int, v uint32) []byte { b = bytes.Clone(b); le.PutUint32(b[at:], v); return reseal(b) }
	set64 := func(b []byte, at int, v uint64) []byte { b = bytes.Clone(b); le.PutUint64(b[at:], v); return reseal(b) }
	for name, c := range map[string]struct {
		b    []byte
		want string
	}{
		"27 bytes":                  {empty[:27], "no DLFSIDX header"},
		"bad magic":                 {append([]byte("DLFSIDY\x00"), empty[8:]...), "no DLFSIDX header"},
		"checksum":                  {append(bytes.Clone(good[:len(good)-1]), good[len(good)-1]^1), "checksum"},
		"truncated":                 {good[:len(good)-1], "checksum"},
		"version 2":                 {set32(good, 8, 2), "format version 2"},
		"shards past the bytes":     {set32(empty, 12, 1), "claims 1 shards"},
		"entries past the bytes":    {set64(empty, 16, 1), "claims 0 shards and 1 entries"},
		"ends in a shard name":      {raw(2, 0, 1, 0, 'a', 0xff, 0xff, 0), "ends inside shard name 1"},
		"ends in an entry":          {set64(good, 16, 2), "claims"},
		"trailing bytes":            {reseal(append(bytes.Clone(good[:len(good)-4]), 0, 0, 0, 0, 0)), "bytes after the last index entry"},
		"a shard name runs past":    {raw(1, 0, 0xff, 0xff, 0), "ends inside shard name 0"},
		"entry fields cut short":    {raw(0, 1, append([]byte{5, 0, 'a', 'b', 'c', 'd', 'e'}, make([]byte, entryFixed-2-4)...)...), "ends inside entry 0"},
		"entries just fit the size": {good, ""},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeIndex(c.b)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v, want ErrFormat saying %q", err, c.want)
			}
		})
	}
}

// header encodes h with a correct header checksum.
func header(h Header) []byte {
	b := make([]byte, HeaderSize)
	encodeHeader(b, h)
	return b
}

// resealHeader rewrites a record header's own checksum.
func resealHeader(b []byte) []byte {
	b = bytes.Clone(b)
	binary.LittleEndian.PutUint32(b[36:], crc32.Checksum(b[:36], castagnoli))
	return b
}

func TestDecodeHeaderBounds(t *testing.T) {
	ok := Header{Length: 5, Mode: regMode, NameLen: 3, Mtime: 7, CRC: 9}
	with := func(mod func(*Header)) []byte {
		h := ok
		mod(&h)
		return header(h)
	}
	flags := resealHeader(header(ok))
	flags[4] = 1
	reserved := resealHeader(header(ok))
	reserved[22] = 1
	for name, c := range map[string]struct {
		b    []byte
		want string
	}{
		"good":                   {header(ok), ""},
		"39 bytes":               {header(ok)[:HeaderSize-1], "record header of 39 bytes"},
		"bad magic":              {resealHeader(append([]byte{0, 0, 0, 0}, header(ok)[4:]...)), "no record magic"},
		"flags set":              {resealHeader(flags), "reserved"},
		"reserved set":           {resealHeader(reserved), "reserved"},
		"length 0":               {with(func(h *Header) { h.Length = 0 }), ""},
		"length 2^40":            {with(func(h *Header) { h.Length = 1 << 40 }), ""},
		"length past 2^40":       {with(func(h *Header) { h.Length = 1<<40 + 1 }), "record length"},
		"negative length":        {with(func(h *Header) { h.Length = -1 }), "record length"},
		"name of 1 byte":         {with(func(h *Header) { h.NameLen = 1 }), ""},
		"no name":                {with(func(h *Header) { h.NameLen = 0 }), "record name length 0"},
		"name of MaxName":        {with(func(h *Header) { h.NameLen = MaxName }), ""},
		"name past MaxName":      {with(func(h *Header) { h.NameLen = MaxName + 1 }), "record name length 4097"},
		"a directory":            {with(func(h *Header) { h.Mode = dirMode }), "neither a file nor a symlink"},
		"symlink of MaxTarget":   {with(func(h *Header) { h.Mode, h.Length = linkMode, MaxTarget }), ""},
		"symlink past MaxTarget": {with(func(h *Header) { h.Mode, h.Length = linkMode, MaxTarget+1 }), "target of 4096 bytes"},
	} {
		t.Run(name, func(t *testing.T) {
			h, err := DecodeHeader(c.b)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if h.Mode&syscall.S_IFMT == syscall.S_IFREG && (h.Mtime != 7 || h.CRC != 9) {
					t.Fatalf("decoded %+v", h)
				}
				return
			}
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v, want ErrFormat saying %q", err, c.want)
			}
		})
	}
}

// shard returns a shard file holding records of the given names and
// payloads, padded, with correct checksums.
func shard(recs ...[2]string) []byte {
	b := append(fileMagic[:], 1, 0, 0, 0, 0, 0, 0, 0)
	for _, r := range recs {
		h := header(Header{Length: int64(len(r[1])), Mode: regMode, NameLen: len(r[0]), CRC: RecordCRC(r[0], []byte(r[1]))})
		b = append(append(append(b, h...), r[0]...), r[1]...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
	}
	return b
}

func TestReadRecordBounds(t *testing.T) {
	b := shard([2]string{"a", "xyz"}) // 16 + 40 + 1 + 3 bytes, no padding
	if len(b) != FileHeader+HeaderSize+4 {
		t.Fatalf("shard of %d bytes", len(b))
	}
	size := int64(len(b))
	rec, err := ReadRecord(bytes.NewReader(b), size, FileHeader)
	if err != nil || rec.Name != "a" || string(rec.Data) != "xyz" {
		t.Fatalf("ReadRecord = %+v, %v", rec, err)
	}
	for name, c := range map[string]struct {
		size, off int64
		want      string
	}{
		"offset inside the file header":  {size, FileHeader - 1, "no room for a record header"},
		"offset with no room for one":    {size, size - HeaderSize + 1, "no room for a record header"},
		"a record running past the end":  {size - 1, FileHeader, "runs past the end"},
		"a header at the very end":       {size + HeaderSize, size, "offset"},
		"a negative offset":              {size, -1, "no room"},
		"a size smaller than the header": {HeaderSize - 1, FileHeader, "no room"},
	} {
		t.Run(name, func(t *testing.T) {
			r := bytes.NewReader(append(bytes.Clone(b), make([]byte, max(0, c.size-size))...))
			if _, err := ReadRecord(r, c.size, c.off); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v, want an error saying %q", err, c.want)
			}
		})
	}
	bad := bytes.Clone(b)
	bad[len(bad)-1] ^= 1
	if _, err := ReadRecord(bytes.NewReader(bad), size, FileHeader); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "record checksum") {
		t.Fatalf("a flipped payload byte: %v", err)
	}
	// Records and their padding walk to the end, and no further.
	two := shard([2]string{"a", "xy"}, [2]string{"b", ""})
	var seen []string
	if err := walk(bytes.NewReader(two), int64(len(two)), func(off int64, r Record) error {
		seen = append(seen, r.Name)
		return nil
	}); err != nil || strings.Join(seen, ",") != "a,b" {
		t.Fatalf("walk saw %v, %v", seen, err)
	}
}

// FuzzDecodeIndexResealed: as FuzzDecodeIndex, with the checksum made
// right first, so that the fields' own checks are what refuse.
func FuzzDecodeIndexResealed(f *testing.F) {
	ix, _ := pack(f, f.TempDir(), 5, 2)
	f.Add(ix.Encode())
	f.Add((&Index{}).Encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		b = reseal(b)
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
		for _, e := range ix.Entries {
			if got, ok := ix.Lookup(e.Name); !ok || got != e {
				t.Fatalf("Lookup(%q) = %+v, %v", e.Name, got, ok)
			}
		}
	})
}

// resealShard rewrites every record's checksums, walking the records as
// their headers place them.
func resealShard(b []byte) []byte {
	b = bytes.Clone(b)
	le := binary.LittleEndian
	for off := int64(FileHeader); off+HeaderSize <= int64(len(b)); {
		h := b[off : off+HeaderSize]
		n, l := int64(le.Uint16(h[20:])), int64(le.Uint64(h[8:]))
		if l < 0 || l > int64(len(b)) {
			break
		}
		end := min(off+HeaderSize+n+l, int64(len(b)))
		le.PutUint32(h[32:], crc32.Checksum(b[off+HeaderSize:end], castagnoli))
		le.PutUint32(h[36:], crc32.Checksum(h[:36], castagnoli))
		off += pad4(HeaderSize + n + l)
	}
	return b
}

// FuzzScanResealed: any shard, its checksums made right, scans into
// records that lie inside it, or fails with one line.
func FuzzScanResealed(f *testing.F) {
	f.Add(shard([2]string{"a", "xyz"}, [2]string{"b/c", ""}))
	f.Add(shard([2]string{strings.Repeat("n", 300), strings.Repeat("d", 1000)}))
	f.Fuzz(func(t *testing.T, b []byte) {
		b = resealShard(b)
		err := walk(bytes.NewReader(b), int64(len(b)), func(off int64, r Record) error {
			if off < FileHeader || off+HeaderSize+int64(r.NameLen)+r.Length > int64(len(b)) {
				t.Fatalf("record at %d of %d bytes out of bounds", off, r.RecordSize())
			}
			if len(r.Name) != r.NameLen || int64(len(r.Data)) != r.Length || RecordCRC(r.Name, r.Data) != r.CRC {
				t.Fatalf("record at %d: %+v", off, r.Header)
			}
			return nil
		})
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Fatalf("error %q spans lines", err)
		}
	})
}
