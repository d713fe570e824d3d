package catalog

import (
	"iter"
	"sort"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/dlfs/dlfs/source"
)

// The model: entries and the immutable snapshot that holds them.

// Entry is one directory, regular file or symlink. It is immutable and safe
// for concurrent use.
//
// Memory is what bounds a catalog of 10 M files, so an entry holds no
// path: Path walks up the parents. A directory's children are one array
// of entries (one allocation per directory, no pointer per child), and
// their names share one buffer.
type Entry struct {
	Name   string // base name; "" for the root
	Ino    uint64
	Size   int64
	Mtime  int64  // nanoseconds since the epoch
	Ctime  int64  // nanoseconds since the epoch; with SrcIno, completes Version (a directory's: see distrust)
	SrcIno uint64 // the inode number in SOURCE (Ino is the view's)
	Mode   uint32 // syscall.S_IF* type bits | permission bits
	owner  uint32 // an index into owners: Uid, Gid

	parent *Entry
	more   *more // directories and symlinks
}

// more is what only directories and symlinks have.
type more struct {
	kids   []Entry // a directory's, sorted by Name
	target string  // a symlink's
}

// At returns a detached entry like e at path, under directories made for
// it: for tests and tools that need an entry outside any snapshot.
func At(path string, e Entry) *Entry {
	var dir *Entry = &Entry{Mode: syscall.S_IFDIR | 0o755}
	parts := strings.Split(path, "/")
	for _, name := range parts[:len(parts)-1] {
		dir = &Entry{Name: name, Mode: syscall.S_IFDIR | 0o755, parent: dir}
	}
	e.Name, e.parent = parts[len(parts)-1], dir
	return &e
}

// Path is e's slash-separated path relative to SOURCE; "" for the root.
func (e *Entry) Path() string {
	if e.parent == nil {
		return ""
	}
	n := -1
	for p := e; p.parent != nil; p = p.parent {
		n += len(p.Name) + 1
	}
	b := make([]byte, n)
	i := n
	for p := e; p.parent != nil; p = p.parent {
		i -= len(p.Name)
		copy(b[i:], p.Name)
		if i > 0 {
			i--
			b[i] = '/'
		}
	}
	return unsafe.String(&b[0], n)
}

// Parent returns the directory holding e, or nil for the root.
func (e *Entry) Parent() *Entry { return e.parent }

// Target is a symlink's target; "" for anything else.
func (e *Entry) Target() string {
	if e.more == nil {
		return ""
	}
	return e.more.target
}

// IsDir reports whether e is a directory.
func (e *Entry) IsDir() bool { return e.Mode&syscall.S_IFMT == syscall.S_IFDIR }

// IsRegular reports whether e is a regular file.
func (e *Entry) IsRegular() bool { return e.Mode&syscall.S_IFMT == syscall.S_IFREG }

// IsSymlink reports whether e is a symlink.
func (e *Entry) IsSymlink() bool { return e.Mode&syscall.S_IFMT == syscall.S_IFLNK }

// NumChildren is how many entries directory e holds.
func (e *Entry) NumChildren() int {
	if e.more == nil {
		return 0
	}
	return len(e.more.kids)
}

// ChildAt returns child i of directory e in name order.
func (e *Entry) ChildAt(i int) *Entry { return &e.more.kids[i] }

// Children returns the entries of a directory in name order.
func (e *Entry) Children() iter.Seq[*Entry] {
	return func(yield func(*Entry) bool) {
		for i := 0; i < e.NumChildren(); i++ {
			if !yield(&e.more.kids[i]) {
				return
			}
		}
	}
}

// Child returns the entry called name in directory e, or nil.
func (e *Entry) Child(name string) *Entry {
	n := e.NumChildren()
	i := sort.Search(n, func(i int) bool { return e.more.kids[i].Name >= name })
	if i < n && e.more.kids[i].Name == name {
		return &e.more.kids[i]
	}
	return nil
}

// Version is the version of the file's bytes that e describes.
func (e *Entry) Version() source.Version {
	return source.Version{Size: e.Size, Mtime: e.Mtime, Ctime: e.Ctime, Ino: e.SrcIno}
}

// Snapshot is an immutable view of SOURCE at one scan.
type Snapshot struct {
	Root     *Entry
	Files    int
	Dirs     int
	Bytes    int64 // total size of regular files
	ScanTime time.Duration
	Skipped  int       // entries that could not be scanned or are not mirrored
	Reused   int       // directories kept unread from the previous snapshot (Revalidate)
	Scanned  time.Time // when the scan that made it began
	// UnreadableEntries counts the directories and entries the scan could
	// not read; the first of them (up to 32) are listed in Unreadable.
	// Each keeps what the previous snapshot had of it, if anything.
	UnreadableEntries int
	Unreadable        []string

	byIno []*Entry // indexed by Ino; holes are nil
}

// ByIno returns the entry with inode number ino, or nil.
func (s *Snapshot) ByIno(ino uint64) *Entry {
	if ino < uint64(len(s.byIno)) {
		return s.byIno[ino]
	}
	return nil
}

// Lookup returns the entry at the slash-separated relative path, or nil.
func (s *Snapshot) Lookup(path string) *Entry {
	e := s.Root
	for _, name := range strings.Split(path, "/") {
		if name == "" || name == "." {
			continue
		}
		if e = e.Child(name); e == nil {
			return nil
		}
	}
	return e
}

// Walk calls fn for every entry in path order, parents before children.
func (s *Snapshot) Walk(fn func(*Entry)) {
	var walk func(*Entry)
	walk = func(e *Entry) {
		fn(e)
		for i := 0; i < e.NumChildren(); i++ {
			walk(&e.more.kids[i])
		}
	}
	walk(s.Root)
}

// count sets Files, Dirs and Bytes.
func (s *Snapshot) count() {
	s.Walk(func(e *Entry) {
		switch {
		case e.IsDir():
			s.Dirs++
		case e.IsRegular():
			s.Files++
			s.Bytes = AddSize(s.Bytes, e.Size)
		}
	})
}

// names is one buffer holding a directory's names.
type names struct{ buf []byte }

func newNames(list []string) *names {
	n := 0
	for _, s := range list {
		n += len(s)
	}
	return &names{buf: make([]byte, 0, n)}
}

// intern copies s into the buffer, which never grows past the capacity
// newNames gave it, so the strings it returned stay valid.
func (a *names) intern(s string) string {
	if s == "" || len(a.buf)+len(s) > cap(a.buf) {
		return s
	}
	off := len(a.buf)
	a.buf = append(a.buf, s...)
	return unsafe.String(&a.buf[off], len(s))
}
