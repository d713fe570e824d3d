package catalog

// Unit tests of every bound load checks, each at its value and one past
// it, on snapshot files built by hand and sealed with a correct checksum,
// so that each check is reached on its own (FuzzLoad's mutants almost all
// stop at the checksum). FuzzLoadResealed reseals what it mutates.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"strings"
	"syscall"
	"testing"
)

const (
	snapDir  = syscall.S_IFDIR | 0o755
	snapReg  = syscall.S_IFREG | 0o644
	snapLink = syscall.S_IFLNK | 0o777
	snapID   = "dataset-1"
)

// snapFile builds a saved catalog field by field.
type snapFile struct{ b []byte }

func (f *snapFile) u16(v uint16) *snapFile { f.b = binary.LittleEndian.AppendUint16(f.b, v); return f }
func (f *snapFile) u32(v uint32) *snapFile { f.b = binary.LittleEndian.AppendUint32(f.b, v); return f }
func (f *snapFile) u64(v uint64) *snapFile { f.b = binary.LittleEndian.AppendUint64(f.b, v); return f }
func (f *snapFile) raw(s string) *snapFile { f.b = append(f.b, s...); return f }

// snapHeader starts a file of dataset id with total entries and next
// inode, and tables of no ACL and one owner, (1000, 1000).
func snapHeader(id string, total, next uint64) *snapFile {
	return snapTop(id, total, next).u32(0).u32(1).u32(1000).u32(1000).u32(0)
}

// snapTop is the header without the tables.
func snapTop(id string, total, next uint64) *snapFile {
	f := &snapFile{}
	f.raw(savedMagic).u32(savedVersion).u32(uint32(len(id))).raw(id)
	return f.u64(total).u64(next).u64(1_700_000_000_000_000_000)
}

// rec writes a record of owner 0: name, mode, owner, size, times, source
// inode, inode.
func (f *snapFile) rec(name string, mode uint32, size int64, ino uint64) *snapFile {
	return f.recOf(name, mode, 0, size, ino)
}

// recOf writes a record of owner o.
func (f *snapFile) recOf(name string, mode, o uint32, size int64, ino uint64) *snapFile {
	f.u16(uint16(len(name))).raw(name)
	return f.u32(mode).u32(o).u64(uint64(size)).u64(5).u64(6).u64(ino + 100).u64(ino)
}

// acl writes an ACL of the table of ACLs.
func (f *snapFile) acl(b []byte) *snapFile { return f.u16(uint16(len(b))).raw(string(b)) }

// dir writes a directory's child count and bytes of names.
func (f *snapFile) dir(count, nameBytes uint32) *snapFile { return f.u32(count).u32(nameBytes) }

// target writes a symlink's target.
func (f *snapFile) target(t string) *snapFile { return f.u16(uint16(len(t))).raw(t) }

// sealed is the file with its checksum.
func (f *snapFile) sealed() []byte {
	return binary.LittleEndian.AppendUint32(bytes.Clone(f.b), crc32.Checksum(f.b, castagnoli))
}

func loadSnap(b []byte, maxEntries int) (*Snapshot, uint64, error) {
	return load(bytes.NewReader(b), int64(len(b)), snapID, maxEntries)
}

// smallSnap is a good file: the root with a file, a symlink and a directory
// holding one file.
func smallSnap() *snapFile {
	f := snapHeader(snapID, 5, 6).rec("", snapDir, 0, RootIno).dir(3, snapNames("a", "d", "l"))
	f.rec("a", snapReg, 3, 2)
	f.rec("d", snapDir, 0, 3).dir(1, 1).rec("x", snapReg, 0, 5)
	return f.rec("l", snapLink, 0, 4).target("a")
}

func snapNames(names ...string) uint32 {
	n := 0
	for _, s := range names {
		n += len(s)
	}
	return uint32(n)
}

func TestLoadHandBuilt(t *testing.T) {
	snap, next, err := loadSnap(smallSnap().sealed(), 100)
	if err != nil {
		t.Fatal(err)
	}
	if next != 6 || snap.Files != 2 || snap.Dirs != 2 {
		t.Fatalf("next %d, %d files, %d dirs; want 6, 2, 2 (the root counted)", next, snap.Files, snap.Dirs)
	}
	x := snap.Lookup("d/x")
	if x == nil || x.Ino != 5 || snap.ByIno(5) != x || x.Uid() != 1000 || x.Mtime != 5 || x.Ctime != 6 || x.SrcIno != 105 {
		t.Fatalf("d/x: %+v", x)
	}
	if l := snap.Lookup("l"); l == nil || l.Target() != "a" || !l.IsSymlink() {
		t.Fatalf("l: %+v", l)
	}
	if a := snap.Lookup("a"); a == nil || a.Size != 3 {
		t.Fatalf("a: %+v", a)
	}
}

// TestLoadBounds: each bound of the format, at its value (loads) and past
// it (refused with ErrSaved, saying what).
func TestLoadBounds(t *testing.T) {
	longName := strings.Repeat("n", maxSavedName)
	cases := []struct {
		name string
		file []byte
		max  int
		want string // "" loads
	}{
		{"good", smallSnap().sealed(), 100, ""},
		{"bad magic", append([]byte("dlfs-catalog?"), smallSnap().sealed()[len(savedMagic):]...), 100, "not a saved catalog"},
		{"other version", (&snapFile{}).raw(savedMagic).u32(savedVersion + 1).sealed(), 100, "format version 4"},
		{"other dataset", snapHeader("dataset-2", 1, 2).rec("", snapDir, 0, 1).dir(0, 0).sealed(), 100, "another dataset"},
		{"identity of 4096 bytes read", snapHeader(strings.Repeat("i", 1<<12), 1, 2).sealed(), 100, "another dataset"},
		{"identity of 4097 bytes", snapHeader(strings.Repeat("i", 1<<12+1), 1, 2).sealed(), 100, "a string of 4097 bytes"},
		{"no entries", snapHeader(snapID, 0, 2).sealed(), 100, "0 entries"},
		{"entries at maxEntries+1", snapHeader(snapID, 1, 2).rec("", snapDir, 0, 1).dir(0, 0).sealed(), 0, ""},
		{"entries past maxEntries+1", snapHeader(snapID, 2, 3).rec("", snapDir, 0, 1).dir(1, 1).rec("a", snapReg, 0, 2).sealed(), 0, "2 entries"},
		{"next inode 2", snapHeader(snapID, 1, 2).rec("", snapDir, 0, 1).dir(0, 0).sealed(), 100, ""},
		{"next inode 1", snapHeader(snapID, 1, 1).rec("", snapDir, 0, 1).dir(0, 0).sealed(), 100, "next inode number 1"},
		{"next inode at 2×total+1024", snapHeader(snapID, 1, 1026).rec("", snapDir, 0, 1).dir(0, 0).sealed(), 100, ""},
		{"next inode past 2×total+1024", snapHeader(snapID, 1, 1027).rec("", snapDir, 0, 1).dir(0, 0).sealed(), 100, "next inode number 1027"},
		{"root not inode 1", snapHeader(snapID, 1, 3).rec("", snapDir, 0, 2).dir(0, 0).sealed(), 100, "the root is not inode 1"},
		{"root with a name", snapHeader(snapID, 1, 2).rec("r", snapDir, 0, 1).dir(0, 0).sealed(), 100, "the root has a name"},
		{"root a file", snapHeader(snapID, 1, 2).rec("", snapReg, 0, 1).sealed(), 100, "the root is not a directory"},
		{"root a symlink", snapHeader(snapID, 1, 2).rec("", snapLink, 0, 1).target("a").sealed(), 100, "the root is not a directory"},
		{"fewer entries than announced", snapHeader(snapID, 2, 3).rec("", snapDir, 0, 1).dir(0, 0).sealed(), 100, "2 entries announced, 1 read"},
		{"a directory of more than left", snapHeader(snapID, 2, 4).rec("", snapDir, 0, 1).dir(2, 2).rec("a", snapReg, 0, 2).rec("b", snapReg, 0, 3).sealed(), 100, "a directory of 2 entries"},
		{"more entries than announced", snapHeader(snapID, 3, 5).rec("", snapDir, 0, 1).dir(2, 2).
			rec("a", snapDir, 0, 2).dir(1, 1).rec("x", snapReg, 0, 3).rec("b", snapReg, 0, 4).sealed(), 100, "more entries than announced"},
		{"names at count×maxSavedName", snapHeader(snapID, 2, 3).rec("", snapDir, 0, 1).dir(1, maxSavedName).rec("a", snapReg, 0, 2).sealed(), 100, ""},
		{"names past count×maxSavedName", snapHeader(snapID, 2, 3).rec("", snapDir, 0, 1).dir(1, maxSavedName+1).rec("a", snapReg, 0, 2).sealed(), 100, "4097 bytes of names"},
		{"inode 0", snapHeader(snapID, 2, 3).rec("", snapDir, 0, 1).dir(1, 1).rec("a", snapReg, 0, 0).sealed(), 100, "inode number 0"},
		{"inode at next-1", snapHeader(snapID, 2, 9).rec("", snapDir, 0, 1).dir(1, 1).rec("a", snapReg, 0, 8).sealed(), 100, ""},
		{"inode at next", snapHeader(snapID, 2, 9).rec("", snapDir, 0, 1).dir(1, 1).rec("a", snapReg, 0, 9).sealed(), 100, "inode number 9"},
		{"inode repeated", snapHeader(snapID, 3, 4).rec("", snapDir, 0, 1).dir(2, 2).rec("a", snapReg, 0, 2).rec("b", snapReg, 0, 2).sealed(), 100, "inode number 2"},
		{"size 0", snapHeader(snapID, 2, 3).rec("", snapDir, 0, 1).dir(1, 1).rec("a", snapReg, 0, 2).sealed(), 100, ""},
		{"size -1", snapHeader(snapID, 2, 3).rec("", snapDir, 0, 1).dir(1, 1).rec("a", snapReg, -1, 2).sealed(), 100, "size -1"},
		{"target of maxSavedName", snapHeader(snapID, 2, 3).rec("", snapDir, 0, 1).dir(1, 1).rec("l", snapLink, 0, 2).target(longName).sealed(), 100, ""},
		{"target past maxSavedName", snapHeader(snapID, 2, 3).rec("", snapDir, 0, 1).dir(1, 1).rec("l", snapLink, 0, 2).target(longName + "n").sealed(), 100, "a string of 4097 bytes"},
		{"names in order", snapHeader(snapID, 3, 4).rec("", snapDir, 0, 1).dir(2, 2).rec("a", snapReg, 0, 2).rec("b", snapReg, 0, 3).sealed(), 100, ""},
		{"names out of order", snapHeader(snapID, 3, 4).rec("", snapDir, 0, 1).dir(2, 2).rec("b", snapReg, 0, 2).rec("a", snapReg, 0, 3).sealed(), 100, "names out of order"},
		{"a name twice", snapHeader(snapID, 3, 4).rec("", snapDir, 0, 1).dir(2, 2).rec("a", snapReg, 0, 2).rec("a", snapReg, 0, 3).sealed(), 100, "names out of order"},
		{"a fifo", snapHeader(snapID, 2, 3).rec("", snapDir, 0, 1).dir(1, 1).rec("p", syscall.S_IFIFO|0o644, 0, 2).sealed(), 100, "mode 10644"},
		{"owner 0 of 1", snapHeader(snapID, 2, 3).rec("", snapDir, 0, 1).dir(1, 1).recOf("a", snapReg, 0, 0, 2).sealed(), 100, ""},
		{"owner 1 of 1", snapHeader(snapID, 2, 3).rec("", snapDir, 0, 1).dir(1, 1).recOf("a", snapReg, 1, 0, 2).sealed(), 100, "owner 1 of 1"},
		{"no owners", snapTop(snapID, 1, 2).u32(0).u32(0).rec("", snapDir, 0, 1).dir(0, 0).sealed(), 100, "0 owners"},
		{"owners at total", snapTop(snapID, 1, 2).u32(0).u32(1).u32(1).u32(1).u32(0).rec("", snapDir, 0, 1).dir(0, 0).sealed(), 100, ""},
		{"owners past total", snapTop(snapID, 1, 2).u32(0).u32(2).u32(1).u32(1).u32(0).u32(2).u32(2).u32(0).rec("", snapDir, 0, 1).dir(0, 0).sealed(), 100, "2 owners for 1 entries"},
		{"an ACL", snapTop(snapID, 2, 3).u32(1).acl(namedACL).u32(2).u32(1).u32(1).u32(0).u32(1).u32(1).u32(1).
			rec("", snapDir, 0, 1).dir(1, 1).recOf("a", snapReg, 1, 0, 2).sealed(), 100, ""},
		{"ACLs past total", snapTop(snapID, 1, 2).u32(2).acl(namedACL).acl(namedACL).u32(1).u32(1).u32(1).u32(0).
			rec("", snapDir, 0, 1).dir(0, 0).sealed(), 100, "2 ACLs for 1 entries"},
		{"an owner's ACL past the table", snapTop(snapID, 2, 3).u32(1).acl(namedACL).u32(2).u32(1).u32(1).u32(0).u32(1).u32(1).u32(2).
			rec("", snapDir, 0, 1).dir(1, 1).recOf("a", snapReg, 1, 0, 2).sealed(), 100, "owner 1 has ACL 2 of 1"},
		{"an invalid ACL", snapTop(snapID, 1, 2).u32(1).acl(namedACL[:len(namedACL)-8]).u32(1).u32(1).u32(1).u32(0).
			rec("", snapDir, 0, 1).dir(0, 0).sealed(), 100, "invalid POSIX ACL"},
		{"checksum wrong", append(smallSnap().b, 0, 0, 0, 0), 100, "checksum mismatch"},
		{"checksum short", smallSnap().sealed()[:len(smallSnap().b)+3], 100, "checksum mismatch"},
		{"bytes after the checksum", append(smallSnap().sealed(), 0), 100, "bytes after the checksum"},
	}
	for _, bad := range []string{".", "..", "a/b", "a\x00b", "/a", "\x00a", "a/"} {
		f := snapHeader(snapID, 2, 3).rec("", snapDir, 0, 1).dir(1, snapNames(bad)).rec(bad, snapReg, 0, 2)
		cases = append(cases, struct {
			name string
			file []byte
			max  int
			want string
		}{"name " + bad, f.sealed(), 100, "bad name"})
	}
	cases = append(cases, struct {
		name string
		file []byte
		max  int
		want string
	}{"empty name", snapHeader(snapID, 2, 3).rec("", snapDir, 0, 1).dir(1, 0).rec("", snapReg, 0, 2).sealed(), 100, "bad name"})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := loadSnap(c.file, c.max)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (!errors.Is(err, ErrSaved) || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("%v, want ErrSaved saying %q", err, c.want)
			case err != nil && strings.Contains(err.Error(), "\n"):
				t.Fatalf("a multi-line error: %q", err)
			}
		})
	}
}

// TestLoadSizeBound: a file may claim only as many entries as its bytes
// can hold (minRecord each), whatever maxEntries allows.
func TestLoadSizeBound(t *testing.T) {
	f := smallSnap().sealed() // 5 entries
	if _, _, err := load(bytes.NewReader(f), 5*minRecord, snapID, 100); err != nil {
		t.Fatalf("5 entries in 5×minRecord bytes: %v", err)
	}
	if _, _, err := load(bytes.NewReader(f), 5*minRecord-1, snapID, 100); !errors.Is(err, ErrSaved) || !strings.Contains(err.Error(), "5 entries in") {
		t.Fatalf("5 entries in 5×minRecord-1 bytes: %v", err)
	}
	if _, _, err := load(bytes.NewReader(f), -1, snapID, 100); !errors.Is(err, ErrSaved) {
		t.Fatalf("a negative size: %v", err)
	}
}

// TestLoadDepthBound: directories nest up to maxSavedDeep levels, the
// root's counted, no deeper.
func TestLoadDepthBound(t *testing.T) {
	chain := func(dirs int) []byte {
		total := uint64(dirs + 1)
		f := snapHeader(snapID, total, total+1).rec("", snapDir, 0, 1)
		for i := 0; i < dirs; i++ {
			f.dir(1, 1).rec("d", snapDir, 0, uint64(i+2))
		}
		return f.dir(0, 0).sealed()
	}
	snap, _, err := loadSnap(chain(maxSavedDeep-1), 1<<20)
	if err != nil {
		t.Fatalf("%d directories nested below the root: %v", maxSavedDeep-1, err)
	}
	if e := snap.Lookup(strings.TrimSuffix(strings.Repeat("d/", maxSavedDeep-1), "/")); e == nil || !e.IsDir() {
		t.Fatal("the deepest directory is missing")
	}
	if _, _, err := loadSnap(chain(maxSavedDeep), 1<<20); !errors.Is(err, ErrSaved) || !strings.Contains(err.Error(), "too deep") {
		t.Fatalf("%d directories nested below the root: %v, want too deep", maxSavedDeep, err)
	}
}

// TestLoadLyingNameCount: a directory whose bytes of names undercount its
// children's names still loads them right: names past the buffer are
// copied, never left pointing into the read buffer that the next read
// overwrites.
func TestLoadLyingNameCount(t *testing.T) {
	names := []string{"alpha", "beta", "gamma", "zeta"}
	f := snapHeader(snapID, 5, 6).rec("", snapDir, 0, 1).dir(4, 3)
	for i, n := range names {
		f.rec(n, snapReg, int64(i), uint64(i+2))
	}
	snap, _, err := loadSnap(f.sealed(), 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for c := range snap.Root.Children() {
		got = append(got, c.Name)
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Fatalf("children %q, want %q", got, names)
	}
	for i, n := range names {
		if e := snap.Lookup(n); e == nil || e.Size != int64(i) {
			t.Fatalf("lookup %q: %+v", n, e)
		}
	}
}

// FuzzLoadResealed: as FuzzLoad, but every input is resealed with its
// checksum first, so that a mutation reaches the checks of the fields it
// changes, and loads when it passes them: any snapshot that loads is
// consistent.
func FuzzLoadResealed(f *testing.F) {
	path, _, _ := saved(f)
	good, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(smallSnap().sealed())
	f.Add(snapHeader(snapID, 3, 4).rec("", snapDir, 0, 1).dir(2, 2).rec("a", snapReg, 0, 2).rec("b", snapLink, 0, 3).target("a").sealed())
	f.Add(snapHeader(snapID, 1, 2).rec("", snapReg, 0, 1).sealed()) // a file for the root: refused
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 4 {
			return
		}
		body := data[:len(data)-4]
		data = binary.LittleEndian.AppendUint32(bytes.Clone(body), crc32.Checksum(body, castagnoli))
		snap, next, err := load(bytes.NewReader(data), int64(len(data)), snapID, 1000)
		if err != nil {
			if !errors.Is(err, ErrSaved) {
				t.Fatalf("error %v does not wrap ErrSaved", err)
			}
			return
		}
		n := 0
		snap.Walk(func(e *Entry) {
			n++
			if e.Ino == 0 || e.Ino >= next || snap.ByIno(e.Ino) != e {
				t.Fatalf("entry %q: inode %d, next %d", e.Path(), e.Ino, next)
			}
			if e.Size < 0 {
				t.Fatalf("entry %q: size %d", e.Path(), e.Size)
			}
			if p := e.Path(); e != snap.Root && snap.Lookup(p) != e {
				t.Fatalf("lookup %q does not find its entry", p)
			}
			prev := ""
			for c := range e.Children() {
				if c.Name <= prev || c.Parent() != e {
					t.Fatalf("%q: child %q after %q, or not its parent's", e.Path(), c.Name, prev)
				}
				prev = c.Name
			}
		})
		if n > 1001 || snap.Root.Ino != RootIno || !snap.Root.IsDir() {
			t.Fatalf("%d entries loaded (at most 1001), root inode %d, mode %o", n, snap.Root.Ino, snap.Root.Mode)
		}
	})
}
