package catalog

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/dlfs/dlfs/atomicfile"
)

// A saved catalog
//
// With Config.Saved set, every scan's snapshot is written there, and Open
// starts from the saved one when it is intact and of the same dataset and
// format: a remount of 10 M files is usable at once, while the caller
// rescans in the background (Refresh) and applies what changed.
//
// The file is a stream, written depth first: a header (magic, format
// version, the dataset's identity, the number of entries, the next inode
// number, when the scan began), the table of the ACLs the entries have
// (each as the value of system.posix_acl_access), the table of their
// owners (uid, gid and an index into the ACLs, 0 for none, 1 for the
// first), the root's record, then for each directory the number of its
// children, the bytes of their names, and their records in name order,
// each directory's children following its record. A record names its
// owner by its index in the table. A CRC-32C of everything before it ends
// the file. A reader trusts nothing: counts, lengths, depth, inode
// numbers, owner indexes, ACLs (as the kernel checks them), name order
// and types (the root must be a directory) are checked against bounds as
// they are read, and the snapshot is used only if the checksum holds at
// the end. Anything else is a miss: the caller scans.

const (
	savedMagic   = "dlfs-catalog\n"
	savedVersion = 3    // 2: the scan's start time; 3: owners and ACLs in tables
	maxSavedName = 4096 // bytes of a name or a symlink's target
	maxSavedDeep = 4096 // directory depth
)

// ErrSaved means a saved catalog cannot be used.
var ErrSaved = errors.New("catalog: saved snapshot unusable")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// savedTemp is the prefix of the temporary file Save writes before its
// rename (package atomicfile): RemoveTemps removes a killed daemon's.
const savedTemp = ".catalog-"

// Save writes snap to path atomically (a temporary file renamed over it),
// under the dataset identity id.
func Save(path string, snap *Snapshot, id string, nextIno uint64) error {
	err := atomicfile.Write(path, savedTemp, func(f io.Writer) error {
		crc := crc32.New(castagnoli)
		w := bufio.NewWriterSize(io.MultiWriter(f, crc), 1<<20)
		enc := encoder{w: w}
		enc.bytes([]byte(savedMagic))
		enc.u32(savedVersion)
		enc.str32(id)
		enc.u64(uint64(snap.Files + snap.Dirs + symlinks(snap)))
		enc.u64(nextIno)
		enc.u64(uint64(snap.Scanned.UnixNano()))
		enc.owners(snap)
		enc.entry(snap.Root)
		if enc.err != nil {
			return enc.err
		}
		if err := w.Flush(); err != nil {
			return err
		}
		return binary.Write(f, binary.LittleEndian, crc.Sum32())
	})
	if err != nil {
		return fmt.Errorf("catalog: save %s: %w", path, err)
	}
	return nil
}

// RemoveTemps removes from dir the temporary files of saves that a killed
// daemon left there, and only those: its own prefix, directly in dir, and
// none a live save holds. It returns the paths removed. A daemon calls it
// as it starts, for the directory of Config.Saved.
func RemoveTemps(dir string) ([]string, error) {
	removed, err := atomicfile.RemoveStale(dir, savedTemp)
	if err != nil {
		return removed, fmt.Errorf("catalog: %w", err)
	}
	return removed, nil
}

func symlinks(s *Snapshot) int {
	n := 0
	s.Walk(func(e *Entry) {
		if e.IsSymlink() {
			n++
		}
	})
	return n
}

type encoder struct {
	w   *bufio.Writer
	buf [8]byte
	err error
	// The file's index of each owner index of the process's (owner.go)
	// that the snapshot's entries have, and the last looked up.
	owner             map[uint32]uint32
	lastIdx, lastFile uint32
}

// owners writes the tables of ACLs and owners of snap's entries.
func (e *encoder) owners(snap *Snapshot) {
	e.owner = map[uint32]uint32{}
	aclFile := map[uint32]uint32{} // process ACL index -> file's (1-based)
	var list [][3]uint32
	var aclList []*ACL
	snap.Walk(func(x *Entry) {
		if _, ok := e.owner[x.owner]; ok {
			return
		}
		uid, gid := ownerAt(x.owner)
		ai := ownerACL(x.owner)
		fa := uint32(0)
		if ai != 0 {
			var ok bool
			if fa, ok = aclFile[ai]; !ok {
				aclList = append(aclList, aclAt(ai))
				fa = uint32(len(aclList))
				aclFile[ai] = fa
			}
		}
		e.owner[x.owner] = uint32(len(list))
		list = append(list, [3]uint32{uid, gid, fa})
	})
	e.u32(uint32(len(aclList)))
	for _, a := range aclList {
		e.str16(a.xattr)
	}
	e.u32(uint32(len(list)))
	for _, o := range list {
		e.u32(o[0])
		e.u32(o[1])
		e.u32(o[2])
	}
	e.lastIdx, e.lastFile = snap.Root.owner, e.owner[snap.Root.owner]
}

// ownerIdx is the file's index of the owner with process index i.
func (e *encoder) ownerIdx(i uint32) uint32 {
	if i != e.lastIdx {
		e.lastIdx, e.lastFile = i, e.owner[i]
	}
	return e.lastFile
}

func (e *encoder) bytes(b []byte) {
	if e.err == nil {
		_, e.err = e.w.Write(b)
	}
}
func (e *encoder) u16(v uint16) { binary.LittleEndian.PutUint16(e.buf[:], v); e.bytes(e.buf[:2]) }
func (e *encoder) u32(v uint32) { binary.LittleEndian.PutUint32(e.buf[:], v); e.bytes(e.buf[:4]) }
func (e *encoder) u64(v uint64) { binary.LittleEndian.PutUint64(e.buf[:], v); e.bytes(e.buf[:8]) }
func (e *encoder) str16(s string) {
	e.u16(uint16(len(s)))
	e.bytes([]byte(s))
}
func (e *encoder) str32(s string) {
	e.u32(uint32(len(s)))
	e.bytes([]byte(s))
}

// entry writes e's record and, for a directory, its children.
func (e *encoder) entry(x *Entry) {
	e.str16(x.Name)
	e.u32(x.Mode)
	e.u32(e.ownerIdx(x.owner))
	e.u64(uint64(x.Size))
	e.u64(uint64(x.Mtime))
	e.u64(uint64(x.Ctime))
	e.u64(x.SrcIno)
	e.u64(x.Ino)
	switch {
	case x.IsSymlink():
		e.str16(x.Target())
	case x.IsDir():
		n, names := x.NumChildren(), 0
		for c := range x.Children() {
			names += len(c.Name)
		}
		e.u32(uint32(n))
		e.u32(uint32(names))
		for c := range x.Children() {
			e.entry(c)
		}
	}
}

// fixedRecord is the bytes of a record's fixed fields (mode, owner, size,
// mtime, ctime, source inode, inode); minRecord is the fewest bytes a
// record takes (with its name's length): what a file of n bytes can hold
// bounds what a reader allocates for it. An owner takes ownerRecord bytes
// in its table, an ACL at least aclRecord.
const (
	fixedRecord = 2*4 + 5*8
	minRecord   = 2 + fixedRecord
	ownerRecord = 3 * 4
	aclRecord   = 2 + 4 + 3*8
)

// load reads a saved snapshot of dataset id, size bytes long, with at most
// maxEntries entries. It returns the snapshot and the next inode number to
// give.
func load(r io.Reader, size int64, id string, maxEntries int) (*Snapshot, uint64, error) {
	crc := crc32.New(castagnoli)
	d := &decoder{r: bufio.NewReaderSize(r, 1<<20), crc: crc}
	if string(d.bytes(len(savedMagic))) != savedMagic {
		return nil, 0, d.fail("not a saved catalog")
	}
	if v := d.u32(); v != savedVersion {
		return nil, 0, d.fail(fmt.Sprintf("format version %d, this dlfs reads %d", v, savedVersion))
	}
	if got := d.str(d.u32(), 1<<12); got != id {
		return nil, 0, d.fail(fmt.Sprintf("another dataset (%q, this is %q)", got, id))
	}
	total := d.u64()
	next := d.u64()
	scanned := time.Unix(0, int64(d.u64()))
	if d.err != nil {
		return nil, 0, d.err
	}
	if total == 0 || total > uint64(maxEntries)+1 || total > uint64(max(size, 0))/minRecord {
		return nil, 0, d.fail(fmt.Sprintf("%d entries in %d bytes, at most %d allowed", total, size, maxEntries))
	}
	// Inode numbers lie below next, which may run ahead of the entries
	// (refreshes retire numbers), but not without bound.
	if next < 2 || next > 2*total+1024 {
		return nil, 0, d.fail(fmt.Sprintf("next inode number %d for %d entries", next, total))
	}
	d.owners(total, size)
	if d.err != nil {
		return nil, 0, d.err
	}
	d.left, d.byIno = total, make([]*Entry, next)
	root := &Entry{}
	d.entry(root, nil, 0)
	if d.err == nil && root.Ino != RootIno {
		d.err = d.fail("the root is not inode 1")
	}
	if d.err == nil && !root.IsDir() {
		d.err = d.fail(fmt.Sprintf("the root is not a directory (mode %o)", root.Mode))
	}
	if d.err == nil && d.left != 0 {
		d.err = d.fail(fmt.Sprintf("%d entries announced, %d read", total, total-d.left))
	}
	if d.err != nil {
		return nil, 0, d.err
	}
	sum := crc.Sum32()
	var stored uint32
	if err := binary.Read(d.r, binary.LittleEndian, &stored); err != nil || stored != sum {
		return nil, 0, fmt.Errorf("%w: checksum mismatch", ErrSaved)
	}
	if _, err := d.r.ReadByte(); err != io.EOF {
		return nil, 0, fmt.Errorf("%w: bytes after the checksum", ErrSaved)
	}
	snap := &Snapshot{Root: root, byIno: d.byIno, Scanned: scanned}
	snap.count()
	return snap, next, nil
}

type decoder struct {
	r       *bufio.Reader
	crc     hash.Hash32
	scratch []byte // bytes' buffer
	err     error
	left    uint64   // entries still to read
	byIno   []*Entry // every entry read, by inode number
	owner   []uint32 // the process's owner index of each of the file's
}

// owners reads the tables of ACLs and owners of a file of size bytes
// holding total entries: no more of either than entries, nor than the
// bytes hold.
func (d *decoder) owners(total uint64, size int64) {
	n := uint64(d.u32())
	if d.err != nil {
		return
	}
	if n > total || n > uint64(max(size, 0))/aclRecord {
		d.fail(fmt.Sprintf("%d ACLs for %d entries in %d bytes", n, total, size))
		return
	}
	aclIdx := make([]uint32, n+1) // the file's index -> the process's; 0 is none
	for i := uint64(1); i <= n; i++ {
		b := d.bytes(int(d.u16()))
		if d.err != nil {
			return
		}
		a, err := ParseACL(b)
		if err != nil {
			d.fail(err.Error())
			return
		}
		if aclIdx[i], err = aclOf(a); err != nil {
			d.fail(err.Error())
			return
		}
	}
	m := uint64(d.u32())
	if d.err != nil {
		return
	}
	if m == 0 || m > total || m > uint64(max(size, 0))/ownerRecord {
		d.fail(fmt.Sprintf("%d owners for %d entries in %d bytes", m, total, size))
		return
	}
	d.owner = make([]uint32, m)
	for i := range d.owner {
		b := d.bytes(ownerRecord)
		if d.err != nil {
			return
		}
		le := binary.LittleEndian
		a := le.Uint32(b[8:])
		if uint64(a) > n {
			d.fail(fmt.Sprintf("owner %d has ACL %d of %d", i, a, n))
			return
		}
		o, err := ownerOf(le.Uint32(b), le.Uint32(b[4:]), aclIdx[a])
		if err != nil {
			d.fail(err.Error())
			return
		}
		d.owner[i] = o
	}
}

func (d *decoder) fail(why string) error {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrSaved, why)
	}
	return d.err
}

// bytes reads n bytes into a scratch buffer, valid until the next read.
func (d *decoder) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > cap(d.scratch) {
		d.scratch = make([]byte, n)
	}
	b := d.scratch[:n]
	if _, err := io.ReadFull(d.r, b); err != nil {
		d.fail("truncated")
		return nil
	}
	d.crc.Write(b)
	return b
}

func (d *decoder) u16() uint16 {
	if b := d.bytes(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.bytes(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if b := d.bytes(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// str reads n bytes as a string, n at most limit.
func (d *decoder) str(n uint32, limit int) string {
	if int(n) > limit {
		d.fail(fmt.Sprintf("a string of %d bytes, at most %d allowed", n, limit))
		return ""
	}
	return string(d.bytes(int(n)))
}

// entry reads x's record (its name interned in names, when a directory's
// child) and, for a directory, its children.
func (d *decoder) entry(x *Entry, arena *names, depth int) {
	if d.left == 0 {
		d.fail("more entries than announced")
		return
	}
	d.left--
	// The name and the fixed fields in one read: a call per field was most
	// of the time a load took.
	n := int(d.u16())
	rec := d.bytes(n + fixedRecord)
	if d.err != nil {
		return
	}
	if arena != nil {
		name := rec[:n]
		s := unsafe.String(unsafe.SliceData(name), len(name)) // the scratch buffer's: copied below
		if s == "" || s == "." || s == ".." || strings.IndexByte(s, '/') >= 0 || strings.IndexByte(s, 0) >= 0 {
			d.fail(fmt.Sprintf("bad name %q", s))
			return
		}
		if x.Name = arena.intern(s); x.Name == s && unsafe.StringData(x.Name) == unsafe.SliceData(name) {
			x.Name = strings.Clone(s) // no room in the directory's buffer (a lying name count)
		}
	} else if n != 0 {
		d.fail("the root has a name")
		return
	}
	f := rec[n:]
	le := binary.LittleEndian
	x.Mode = le.Uint32(f)
	o := le.Uint32(f[4:])
	if uint64(o) >= uint64(len(d.owner)) {
		d.fail(fmt.Sprintf("owner %d of %d", o, len(d.owner)))
		return
	}
	x.owner = d.owner[o]
	x.Size, x.Mtime, x.Ctime = int64(le.Uint64(f[8:])), int64(le.Uint64(f[16:])), int64(le.Uint64(f[24:]))
	x.SrcIno, x.Ino = le.Uint64(f[32:]), le.Uint64(f[40:])
	if x.Ino == 0 || x.Ino >= uint64(len(d.byIno)) || d.byIno[x.Ino] != nil {
		d.fail(fmt.Sprintf("inode number %d out of range or repeated", x.Ino))
		return
	}
	if x.Size < 0 {
		d.fail(fmt.Sprintf("size %d", x.Size))
		return
	}
	d.byIno[x.Ino] = x
	switch x.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
	case syscall.S_IFLNK:
		t := d.str(uint32(d.u16()), maxSavedName)
		if d.err == nil {
			x.more = &more{target: t}
		}
	case syscall.S_IFDIR:
		if depth >= maxSavedDeep {
			d.fail("directories nested too deep")
			return
		}
		count, nameBytes := d.u32(), d.u32()
		if d.err != nil {
			return
		}
		if uint64(count) > d.left || uint64(nameBytes) > uint64(count)*maxSavedName {
			d.fail(fmt.Sprintf("a directory of %d entries and %d bytes of names", count, nameBytes))
			return
		}
		if count == 0 {
			return
		}
		kids := make([]Entry, count)
		kidNames := &names{buf: make([]byte, 0, nameBytes)}
		for i := range kids {
			kids[i].parent = x
			d.entry(&kids[i], kidNames, depth+1)
			if d.err != nil {
				return
			}
			if i > 0 && kids[i-1].Name >= kids[i].Name {
				d.fail(fmt.Sprintf("names out of order: %q after %q", kids[i].Name, kids[i-1].Name))
				return
			}
		}
		x.more = &more{kids: kids}
	default:
		d.fail(fmt.Sprintf("mode %o", x.Mode))
	}
}
