package integrity

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/source"
)

type file struct {
	path string
	v    source.Version
}

func (f file) Path() string            { return f.path }
func (f file) Version() source.Version { return f.v }

// identity is the dataset of files, each file's head being its path.
func identity(format, id string, files []file) Dataset {
	return identityHeads(format, id, files, func(f file) []byte { return []byte(f.path) })
}

func identityHeads(format, id string, files []file, head func(file) []byte) Dataset {
	var ider Identifier
	for _, f := range files {
		ider.Add(f)
	}
	heads := map[File]uint64{}
	for _, f := range ider.Oldest() {
		if h := head(f.(file)); h != nil {
			heads[f] = HeadSum(h)
		}
	}
	return ider.Dataset(format, id, heads)
}

// dataset is n files, the i-th with mtime base+i seconds.
func dataset(n int, base int64) []file {
	fs := make([]file, n)
	for i := range fs {
		fs[i] = file{fmt.Sprintf("train/c%d/%05d.jpg", i%7, i), source.Version{
			Size: int64(1000 + i), Mtime: (base + int64(i)) * 1e9, Ctime: (base+int64(i))*1e9 + 5, Ino: uint64(100 + i)}}
	}
	return fs
}

// TestIdentityIgnoresHostParts: two hosts that number inodes differently
// compute one identity; the mount path is not an input at all.
func TestIdentityIgnoresHostParts(t *testing.T) {
	a := dataset(500, 1_600_000_000)
	b := make([]file, len(a))
	for i, f := range a {
		f.v.Ino = uint64(9_000_000 + 7*i) // another host's numbering
		b[i] = f
	}
	if identity("directory", "", a) != identity("directory", "", b) {
		t.Fatal("inode numbers change the dataset identity: hosts would not agree")
	}
	if identity("directory", "", a) == identity("seqfile", "", a) {
		t.Error("two formats of one tree share an identity")
	}
}

// TestIdentitySeparatesCopies: a copy with the same names, sizes and
// mtimes but other bytes has other ctimes (the filesystem sets them on
// every write), so another identity; as does a change of any field of an
// oldest file.
func TestIdentitySeparatesCopies(t *testing.T) {
	a := dataset(100, 1_600_000_000)
	base := identity("directory", "", a)
	cp := make([]file, len(a))
	for i, f := range a {
		f.v.Ctime = 1_700_000_000e9 + int64(i) // written later
		cp[i] = f
	}
	if identity("directory", "", cp) == base {
		t.Error("a copy with the same names, sizes and mtimes but new ctimes has the same identity")
	}
	for name, change := range map[string]func(*file){
		"size":  func(f *file) { f.v.Size++ },
		"mtime": func(f *file) { f.v.Mtime++ },
		"ctime": func(f *file) { f.v.Ctime++ },
		"path":  func(f *file) { f.path += "x" },
	} {
		b := append([]file(nil), a...)
		change(&b[3]) // among the 32 oldest
		if identity("directory", "", b) == base {
			t.Errorf("a change of an oldest file's %s leaves the identity", name)
		}
	}
}

// TestIdentityStableAsDatasetGrows: files younger than the oldest 32, in
// any number, and the order in which distinct files are offered, change
// nothing; an older file does.
func TestIdentityStableAsDatasetGrows(t *testing.T) {
	a := dataset(200, 1_600_000_000)
	base := identity("directory", "", a)
	grown := append(append([]file(nil), a...), dataset(5000, 1_700_000_000)...)
	for i := range grown[200:] {
		grown[200+i].path = fmt.Sprintf("new/%05d.jpg", i)
	}
	if identity("directory", "", grown) != base {
		t.Error("adding younger files changed the identity")
	}
	shuffled := append([]file(nil), grown...)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	if identity("directory", "", shuffled) != base {
		t.Error("the order of distinct files changed the identity")
	}
	// The young files that are not among the oldest 32 can change.
	young := append([]file(nil), a...)
	young[150].v.Size = 1
	if identity("directory", "", young) != base {
		t.Error("a change to a file younger than the oldest 32 changed the identity")
	}
	older := append([]file{{"old.jpg", source.Version{Size: 1, Mtime: 1e9, Ctime: 1e9}}}, a...)
	if identity("directory", "", older) == base {
		t.Error("an older file did not change the identity")
	}
}

// TestIdentityTies: files alike in mtime, ctime and size (an archive
// unpacked with its times) are taken in the order offered, the catalog's
// path order on every host.
func TestIdentityTies(t *testing.T) {
	fs := make([]file, 100)
	for i := range fs {
		fs[i] = file{fmt.Sprintf("f%03d", i), source.Version{Size: 10, Mtime: 5e9, Ctime: 6e9}}
	}
	first := identity("directory", "", fs[:IdentityFiles])
	if identity("directory", "", fs) != first {
		t.Error("with every file alike, the identity is not that of the first 32 offered")
	}
	if identity("directory", "", fs[1:]) == first {
		t.Error("dropping the first file of a tie did not change the identity")
	}
}

// TestIdentityGolden pins the definition (FNV-1a 64, fields as in
// package doc), so that hosts with other builds agree.
func TestIdentityGolden(t *testing.T) {
	str := func(b []byte, s string) []byte {
		return append(binary.LittleEndian.AppendUint64(b, uint64(len(s))), s...)
	}
	fs := []file{
		{"b/2", source.Version{Size: 2, Mtime: 20, Ctime: 21, Ino: 9}},
		{"a/1", source.Version{Size: 1, Mtime: 10, Ctime: 11, Ino: 8}},
	}
	var ref []byte
	ref = str(ref, "dlfs dataset files")
	ref = str(ref, "directory")
	ref = binary.LittleEndian.AppendUint64(ref, 2)
	for _, f := range []file{fs[1], fs[0]} { // sorted by path
		ref = str(ref, f.path)
		for _, x := range []int64{f.v.Size, f.v.Mtime, f.v.Ctime} {
			ref = binary.LittleEndian.AppendUint64(ref, uint64(x))
		}
		ref = binary.LittleEndian.AppendUint64(ref, 1) // read
		ref = binary.LittleEndian.AppendUint64(ref, fnv1a(str(nil, f.path)))
	}
	if got, want := identity("directory", "", fs), Dataset(fnv1a(ref)); got != want {
		t.Errorf("identity of two files = %v, want %v", got, want)
	}
	ref = str(str(str(nil, "dlfs dataset id"), "hdf5"), "imagenet-v3")
	if got, want := identity("hdf5", "imagenet-v3", fs), Dataset(fnv1a(ref)); got != want {
		t.Errorf("identity of an operator's id = %v, want %v", got, want)
	}
}

// TestOperatorID: an operator's id replaces the files: hosts agree on it
// whatever they see, formats still differ, and ids differ.
func TestOperatorID(t *testing.T) {
	a, b := dataset(50, 1_600_000_000), dataset(80, 1_650_000_000)
	if identity("directory", "imagenet", a) != identity("directory", "imagenet", b) {
		t.Error("one operator id, two identities")
	}
	if identity("directory", "imagenet", a) == identity("directory", "imagenet2", a) ||
		identity("directory", "imagenet", a) == identity("seqfile", "imagenet", a) ||
		identity("directory", "imagenet", a) == identity("directory", "", a) {
		t.Error("another id or format, the same identity")
	}
	for _, bad := range []string{"", "has space", "tab\t", "nl\n", strings.Repeat("x", MaxDatasetID+1), "\x00"} {
		if err := ValidDatasetID(bad); err == nil || !strings.Contains(err.Error(), "dataset id") {
			t.Errorf("ValidDatasetID(%q) = %v", bad, err)
		}
	}
	for _, good := range []string{"imagenet-2012", strings.Repeat("x", MaxDatasetID), "données/v1"} {
		if err := ValidDatasetID(good); err != nil {
			t.Errorf("ValidDatasetID(%q) = %v", good, err)
		}
	}
}

// statFile is a File on disk.
type statFile struct{ dir, rel string }

func (f statFile) Path() string { return f.rel }
func (f statFile) Version() source.Version {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(f.dir, f.rel), &st); err != nil {
		panic(err)
	}
	return source.VersionOf(&st)
}

// TestIdentityOfRealCopies: on a real filesystem, a copy of a tree with
// every name, size and mtime kept but other bytes (cp -p, then rewritten
// with touch -r) has another identity, even made within the same tick of
// the filesystem's ctime; the tree itself, stat'ed again, has the same one.
func TestIdentityOfRealCopies(t *testing.T) {
	root := t.TempDir()
	mtime := time.Unix(1_600_000_000, 123)
	tree := func(dir string, fill byte) Dataset {
		var id Identifier
		for i := range 40 {
			rel := fmt.Sprintf("c%d/%02d.bin", i%3, i)
			p := filepath.Join(dir, rel)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
				if err := os.WriteFile(p, []byte{fill, byte(i)}, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Chtimes(p, mtime, mtime.Add(time.Duration(i)*time.Second)); err != nil {
					t.Fatal(err)
				}
			}
			id.Add(statFile{dir, rel})
		}
		heads := map[File]uint64{}
		for _, f := range id.Oldest() {
			b, err := os.ReadFile(filepath.Join(dir, f.Path()))
			if err != nil {
				t.Fatal(err)
			}
			heads[f] = HeadSum(b)
		}
		return id.Dataset("directory", "", heads)
	}
	a := tree(filepath.Join(root, "a"), 'a')
	if again := tree(filepath.Join(root, "a"), 'a'); again != a {
		t.Fatalf("one tree, stat'ed twice: %v then %v", a, again)
	}
	if b := tree(filepath.Join(root, "b"), 'b'); b == a {
		t.Errorf("a tree with the same names, sizes and mtimes but other bytes has the same identity %v", a)
	}
}

// TestMountOf: this host's identity of a directory is stable, differs
// between directories and formats, and a missing one is an error that
// says what failed where.
func TestMountOf(t *testing.T) {
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	for _, d := range []string{a, b} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ma, err := MountOf(a, "directory")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := MountOf(a, "directory"); err != nil || again != ma {
		t.Errorf("MountOf(a) twice: %q then %q (%v)", ma, again, err)
	}
	if mb, _ := MountOf(b, "directory"); mb == ma {
		t.Errorf("two directories, one mount identity %q", ma)
	}
	if ms, _ := MountOf(a, "seqfile"); ms == ma {
		t.Errorf("two formats, one mount identity %q", ma)
	}
	missing := filepath.Join(root, "absent")
	_, err = MountOf(missing, "directory")
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) || !strings.HasPrefix(err.Error(), "integrity: stat ") {
		t.Errorf("MountOf(missing) = %v, want an error wrapping ErrNotExist that names it", err)
	}
}

// TestIdentityHeads: two datasets alike in names, sizes, mtimes and ctimes
// (copies made within one tick of a coarse ctime) but other bytes have
// other identities; a head read partly, or not at all, counts; only the
// first HeadBytes count.
func TestIdentityHeads(t *testing.T) {
	a := dataset(40, 1_600_000_000)
	base := identityHeads("directory", "", a, func(f file) []byte { return []byte("a:" + f.path) })
	if other := identityHeads("directory", "", a, func(f file) []byte { return []byte("b:" + f.path) }); other == base {
		t.Error("other bytes, the same identity")
	}
	one := func(f file) []byte {
		if f.path == a[3].path {
			return []byte("B:" + f.path)
		}
		return []byte("a:" + f.path)
	}
	if identityHeads("directory", "", a, one) == base {
		t.Error("one oldest file's other bytes leave the identity")
	}
	unread := func(f file) []byte {
		if f.path == a[3].path {
			return nil
		}
		return []byte("a:" + f.path)
	}
	if identityHeads("directory", "", a, unread) == base {
		t.Error("an unread head counts as the read one")
	}
	empty := func(f file) []byte { return []byte{} }
	if identityHeads("directory", "", a, empty) == identityHeads("directory", "", a, func(file) []byte { return nil }) {
		t.Error("empty heads and unread ones are alike")
	}
	long := func(tail byte) func(file) []byte {
		return func(f file) []byte { return append(make([]byte, HeadBytes), tail) }
	}
	if identityHeads("directory", "", a, long(1)) != identityHeads("directory", "", a, long(2)) {
		t.Error("bytes past HeadBytes change the identity")
	}
}
