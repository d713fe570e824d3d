package packed

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"path/filepath"
	"testing"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/seqfile"
	"github.com/dlfs/dlfs/source"
)

// listWith opens dir as a packed dataset with at most max entries and
// lists it.
func listWith(t *testing.T, dir string, max int) ([]catalog.File, error) {
	t.Helper()
	s, err := source.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d, err := Open(dir, s, Config{MaxEntries: max})
	if err != nil || d == nil {
		t.Fatalf("Open: %v, %v", d, err)
	}
	defer d.Close()
	return d.List(context.Background())
}

// checkBound: a dataset of exactly n entries lists under MaxEntries n, and
// is refused with catalog.ErrTooMany under n-1.
func checkBound(t *testing.T, dir string, n int) {
	t.Helper()
	if _, err := listWith(t, dir, n); err != nil {
		t.Fatalf("%d entries under a bound of %d: %v", n, n, err)
	}
	if _, err := listWith(t, dir, n-1); !errors.Is(err, catalog.ErrTooMany) {
		t.Fatalf("%d entries under a bound of %d: %v, want ErrTooMany", n, n-1, err)
	}
}

func TestSeqEntryBound(t *testing.T) {
	dir := t.TempDir()
	w, err := seqfile.Create(filepath.Join(dir, seqfile.ShardName(0)), 0)
	if err != nil {
		t.Fatal(err)
	}
	var entries []seqfile.Entry
	for _, name := range []string{"a/1.jpg", "a/2.jpg", "b/3.jpg"} {
		e, err := w.Append(name, 0o100644, 1, []byte(name))
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, e)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	entries = append(entries, seqfile.Entry{Name: "a", Mode: 0o40755}, seqfile.Entry{Name: "b", Mode: 0o40755})
	ix, err := seqfile.NewIndex([]string{seqfile.ShardName(0)}, entries)
	if err != nil {
		t.Fatal(err)
	}
	if err := seqfile.WriteIndex(dir, ix); err != nil {
		t.Fatal(err)
	}
	checkBound(t, dir, len(entries)) // the index's entries, directories included
}

func TestRecordIOEntryBound(t *testing.T) {
	rec := func(label float32, id uint64) []byte {
		payload := binary.LittleEndian.AppendUint32(nil, 0)
		payload = binary.LittleEndian.AppendUint32(payload, math.Float32bits(label))
		payload = binary.LittleEndian.AppendUint64(payload, id)
		payload = binary.LittleEndian.AppendUint64(payload, 0)
		payload = append(payload, "jpeg"...)
		b := binary.LittleEndian.AppendUint32(nil, 0xced7230a)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
		return append(b, payload...) // 28 + 4 bytes: no padding
	}
	dir := t.TempDir()
	var b []byte
	for i := 0; i < 4; i++ {
		b = append(b, rec(float32(i%2), uint64(i))...)
	}
	write(t, dir, "train.rec", b)
	checkBound(t, dir, 4) // the images
}
