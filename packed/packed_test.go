package packed

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/dlfs/dlfs/cmd/dlfs/packer"
	"github.com/dlfs/dlfs/source"
	"github.com/dlfs/dlfs/test/datagen"
)

// TestSeqDataset: a pack lists its tree and reads every sample alone and
// in runs; a stale identity is refused.
func TestSeqDataset(t *testing.T) {
	src := t.TempDir()
	files, err := datagen.ImageFolder(filepath.Join(src, "train"), datagen.Spec{Classes: 2, Files: 30, MeanSize: 500, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "pack")
	if _, err := packer.Pack(context.Background(), packer.Config{Source: src, Out: out, Shards: 1}); err != nil {
		t.Fatal(err)
	}
	s, err := source.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d, err := Open(out, s, Config{})
	if err != nil || d == nil || d.Kind() != "seqfile" {
		t.Fatalf("Open: %v, %v", d, err)
	}
	defer d.Close()
	listed, err := d.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]source.Version{}
	for _, f := range listed {
		byPath[f.Path] = source.Version{Size: f.Size, Mtime: f.Mtime, Ctime: f.Ctime, Ino: f.Ino}
	}
	var paths []string
	var wants []source.Version
	for _, f := range files {
		p := "train/" + f.Path
		want, _ := os.ReadFile(filepath.Join(src, p))
		w := byPath[p]
		buf := make([]byte, len(want)+10)
		n, err := d.ReadAt(p, w, buf, 0)
		if err != nil || string(buf[:n]) != string(want) {
			t.Fatalf("%s: %d bytes, %v", p, n, err)
		}
		paths, wants = append(paths, p), append(wants, w)
		// A read of part of the record goes through the memo of verified
		// records.
		if n, err := d.ReadAt(p, w, buf[:10], 1); err != nil || n != min(10, len(want)-1) || string(buf[:n]) != string(want[1:1+n]) {
			t.Fatalf("%s at 1: %d bytes, %v", p, n, err)
		}
		checkMemo(t, &d.(*seqDataset).memo)
	}
	if d.(*seqDataset).memo.lru.Len() == 0 {
		t.Error("reads of part of a record left nothing in the memo")
	}
	sort.Sort(byName{paths, wants}) // the pack holds them in path order
	c := d.(interface {
		ReadRun([]string, []source.Version) ([][]byte, error)
	})
	bufs, err := c.ReadRun(paths[:5], wants[:5]) // a class directory's files are neighbours
	if err != nil || len(bufs) != 5 {
		t.Fatalf("ReadRun: %d, %v", len(bufs), err)
	}
	for i, b := range bufs {
		want, _ := os.ReadFile(filepath.Join(src, paths[i]))
		if string(b) != string(want) {
			t.Errorf("run sample %d differs", i)
		}
	}
	stale := wants[0]
	stale.Mtime++
	if _, err := d.ReadAt(paths[0], stale, make([]byte, 10), 0); !errors.Is(err, source.ErrChanged) {
		t.Errorf("stale identity: %v", err)
	}
	if d, err := Open(src, s, Config{}); d != nil || err != nil {
		t.Errorf("a plain tree opened as packed: %v, %v", d, err)
	}
}

func TestLabelNamer(t *testing.T) {
	pad := labelNamer([]float32{0, 3, 12})
	if pad(3) != "03" || pad(12) != "12" {
		t.Errorf("padded: %q %q", pad(3), pad(12))
	}
	plain := labelNamer([]float32{0, 2.5, -1})
	if plain(2.5) != "2.5" || plain(-1) != "-1" {
		t.Errorf("plain: %q %q", plain(2.5), plain(-1))
	}
}

type byName struct {
	p []string
	w []source.Version
}

func (b byName) Len() int           { return len(b.p) }
func (b byName) Less(i, j int) bool { return b.p[i] < b.p[j] }
func (b byName) Swap(i, j int) {
	b.p[i], b.p[j] = b.p[j], b.p[i]
	b.w[i], b.w[j] = b.w[j], b.w[i]
}
