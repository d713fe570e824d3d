package catalog

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// saved scans a small tree, saves it and returns the file and the catalog.
func saved(t testing.TB) (string, *Catalog, Config) {
	t.Helper()
	root := t.TempDir()
	write(t, root, "b/2.jpg", "22")
	write(t, root, "b/1.jpg", "1")
	write(t, root, "a x/ü #.jpg", "")
	write(t, root, "deep/er/still/x.png", "xyz")
	if err := os.Symlink("b/1.jpg", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig(root)
	cfg.Hide = []string{".dlfs"}
	cfg.Saved = filepath.Join(t.TempDir(), "catalog.snap")
	cfg.Identity = "dataset-1"
	c, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c.Loaded() {
		t.Fatal("loaded a snapshot that was never saved")
	}
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	return cfg.Saved, c, cfg
}

// listing flattens a snapshot: path, inode, mode, size, mtime, target.
func listing(s *Snapshot) []string {
	var out []string
	s.Walk(func(e *Entry) {
		out = append(out, e.Path()+"|"+string(rune(e.Ino))+"|"+string(rune(e.Mode))+"|"+string(rune(e.Size))+"|"+e.Target()+"|"+string(rune(e.Mtime%1e6)))
	})
	return out
}

// TestSavedRoundTrip: a remount starts from the saved snapshot, the same
// entries under the same inode numbers, and numbers new files after them.
func TestSavedRoundTrip(t *testing.T) {
	_, c, cfg := saved(t)
	again, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Loaded() {
		t.Fatal("the saved snapshot was not used")
	}
	a, b := listing(c.Snapshot()), listing(again.Snapshot())
	if len(a) != len(b) {
		t.Fatalf("%d entries saved, %d loaded", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Errorf("entry %d: saved %q, loaded %q", i, a[i], b[i])
		}
	}
	s := again.Snapshot()
	if e := s.Lookup("deep/er/still/x.png"); e == nil || s.ByIno(e.Ino) != e || e.Size != 3 {
		t.Errorf("lookup after loading: %+v", e)
	}
	if s.Files != c.Snapshot().Files || s.Dirs != c.Snapshot().Dirs || s.Bytes != c.Snapshot().Bytes {
		t.Errorf("counts %d/%d/%d, want %d/%d/%d", s.Files, s.Dirs, s.Bytes, c.Snapshot().Files, c.Snapshot().Dirs, c.Snapshot().Bytes)
	}
	write(t, cfg.Source, "b/3.jpg", "333")
	d, err := again.Refresh(context.Background())
	if err != nil || len(d.Added) != 1 || len(d.Removed) != 0 { // b changed too: its mtime
		t.Fatalf("refresh after loading: %v %+v", err, d)
	}
	if ino := d.Added[0].Ino; again.Snapshot().ByIno(ino) != d.Added[0] || c.Snapshot().ByIno(ino) != nil && ino < uint64(len(c.Snapshot().byIno)) {
		t.Errorf("the new file took inode %d, which the saved snapshot used", ino)
	}
}

// TestSavedIgnored: a snapshot of another dataset, a damaged or truncated
// one, or one whose root is not a directory, is ignored and SOURCE scanned.
func TestSavedIgnored(t *testing.T) {
	path, _, cfg := saved(t)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	other := cfg
	other.Identity = "dataset-2"
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 1
	for name, c := range map[string]struct {
		cfg  Config
		file []byte
	}{
		"another dataset":     {other, good},
		"a flipped bit":       {cfg, flipped},
		"truncated":           {cfg, good[:len(good)-5]},
		"empty":               {cfg, nil},
		"trailing bytes":      {cfg, append(bytes.Clone(good), 0)},
		"a file for the root": {cfg, snapHeader(cfg.Identity, 1, 2).rec("", snapReg, 0, 1).sealed()},
	} {
		if err := os.WriteFile(path, c.file, 0o600); err != nil {
			t.Fatal(err)
		}
		cat, err := Open(context.Background(), c.cfg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if cat.Loaded() || cat.Snapshot().Lookup("b/2.jpg") == nil {
			t.Errorf("%s: loaded %v; want a scan", name, cat.Loaded())
		}
	}
}

// FuzzLoad: any file is either refused or loads into a consistent
// snapshot; nothing panics or allocates without bound.
func FuzzLoad(f *testing.F) {
	path, _, _ := saved(f)
	good, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:40])
	f.Fuzz(func(t *testing.T, data []byte) {
		snap, next, err := load(bytes.NewReader(data), int64(len(data)), "dataset-1", 1000)
		if err != nil {
			return
		}
		n := 0
		snap.Walk(func(e *Entry) {
			n++
			if e.Ino >= next || snap.ByIno(e.Ino) != e {
				t.Fatalf("entry %q: inode %d, next %d", e.Path(), e.Ino, next)
			}
			if p := e.Path(); e != snap.Root && snap.Lookup(p) != e {
				t.Fatalf("lookup %q does not find its entry", p)
			}
		})
		if n > 1001 || !snap.Root.IsDir() {
			t.Fatalf("%d entries loaded (at most 1001), the root's mode %o", n, snap.Root.Mode)
		}
	})
}

// TestSavedClaimsBounded: a file that claims more entries than its bytes
// can hold is refused before anything is allocated for them.
func TestSavedClaimsBounded(t *testing.T) {
	var b bytes.Buffer
	b.WriteString(savedMagic)
	for _, v := range []uint32{savedVersion, uint32(len("dataset-1"))} {
		b.Write([]byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)})
	}
	b.WriteString("dataset-1")
	for _, v := range []uint64{20_000_000, 20_000_001, 0} { // entries, next inode, scan time
		for i := 0; i < 8; i++ {
			b.WriteByte(byte(v >> (8 * i)))
		}
	}
	data := b.Bytes()
	if _, _, err := load(bytes.NewReader(data), int64(len(data)), "dataset-1", 1<<30); err == nil || !strings.Contains(err.Error(), "entries in") {
		t.Errorf("20 M entries claimed in %d bytes: %v, want refused", len(data), err)
	}
}
