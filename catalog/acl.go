package catalog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ACLs
//
// An entry of SOURCE may carry a POSIX access ACL (the xattr
// system.posix_acl_access): named users and groups with their own
// permissions, under a mask. The scan reads it for directories and
// regular files and keeps it only when it says more than the mode does
// (an ACL of just the owner, group and other entries, equal to the mode,
// is the mode). A directory's default ACL only shapes what is created in
// it: a read-only view has no use for it.
//
// Few entries have ACLs, and those that do mostly share a handful, so an
// ACL is interned like an owner: the table of owners holds (uid, gid,
// ACL) triples, and an entry's 4-byte owner index names its ACL too. An
// entry costs no more bytes for it, and an entry without one costs no
// lookup. Reads take no lock (pages published through atomic pointers);
// the table only grows. The kernel of a mount asks for an entry's ACL
// through getxattr (FUSE_POSIX_ACL) and enforces it; package access
// checks it the same way for the plans of jobs.
//
// Reading an ACL is one getxattr per directory and regular file, relative
// to the directory's descriptor (getxattrat, Linux 6.13; a path lookup
// before): on ext4, about 2 µs of CPU per entry, a scan of 100,000 files
// from 0.33 to 0.55 CPU-s. A SOURCE that keeps no ACLs (EOPNOTSUPP: NFSv4,
// a filesystem mounted noacl) costs one call per scan: the scan stops
// asking.

// Tags of ACL entries, as <linux/posix_acl.h> numbers them. In a valid
// ACL they come in this order.
const (
	ACLUserObj  = 0x01 // the owner
	ACLUser     = 0x02 // a named user
	ACLGroupObj = 0x04 // the owning group
	ACLGroup    = 0x08 // a named group
	ACLMask     = 0x10 // the most a named user or any group may get
	ACLOther    = 0x20 // everyone else
)

// XattrACL is the name of the extended attribute holding an access ACL.
const XattrACL = "system.posix_acl_access"

const (
	aclXattrVersion = 2
	aclUndefinedID  = 1<<32 - 1
	// MaxACLEntries is the most entries an ACL may have: what fits the
	// page the kernel reads an ACL of a FUSE file into.
	MaxACLEntries = (4096 - 4) / 8
)

// ACLEntry is one entry of an ACL. ID is the uid of an ACLUser entry and
// the gid of an ACLGroup one.
type ACLEntry struct {
	Tag  uint16
	Perm uint16 // 4 read, 2 write, 1 execute
	ID   uint32
}

// ACL is a valid access ACL. Immutable and safe for concurrent use.
type ACL struct {
	entries []ACLEntry
	xattr   string // the value of system.posix_acl_access, canonical
}

// Entries returns the ACL's entries in order. The caller must not change
// them.
func (a *ACL) Entries() []ACLEntry { return a.entries }

// Xattr is the ACL as the value of system.posix_acl_access.
func (a *ACL) Xattr() string { return a.xattr }

// ErrACL means an ACL's bytes are not a valid access ACL.
var ErrACL = errors.New("catalog: invalid POSIX ACL")

// ParseACL reads the value of system.posix_acl_access and checks it the
// way the kernel's posix_acl_valid does: one owner, owning group and
// other entry, named entries between them in tag order, a mask if any
// entry is named, and permissions of 7 at most.
func ParseACL(b []byte) (*ACL, error) {
	if len(b) < 4 || (len(b)-4)%8 != 0 {
		return nil, fmt.Errorf("%w: %d bytes", ErrACL, len(b))
	}
	if v := binary.LittleEndian.Uint32(b); v != aclXattrVersion {
		return nil, fmt.Errorf("%w: version %d", ErrACL, v)
	}
	n := (len(b) - 4) / 8
	if n > MaxACLEntries {
		return nil, fmt.Errorf("%w: %d entries, at most %d", ErrACL, n, MaxACLEntries)
	}
	es := make([]ACLEntry, n)
	var seen, last uint16
	named := false
	for i := range es {
		r := b[4+8*i:]
		e := ACLEntry{Tag: binary.LittleEndian.Uint16(r), Perm: binary.LittleEndian.Uint16(r[2:]), ID: binary.LittleEndian.Uint32(r[4:])}
		if e.Perm&^7 != 0 {
			return nil, fmt.Errorf("%w: permissions %#o", ErrACL, e.Perm)
		}
		switch e.Tag {
		case ACLUser, ACLGroup:
			named = true
		case ACLUserObj, ACLGroupObj, ACLMask, ACLOther:
			if seen&e.Tag != 0 {
				return nil, fmt.Errorf("%w: tag %#x twice", ErrACL, e.Tag)
			}
			e.ID = aclUndefinedID
		default:
			return nil, fmt.Errorf("%w: tag %#x", ErrACL, e.Tag)
		}
		if e.Tag < last {
			return nil, fmt.Errorf("%w: tag %#x after %#x", ErrACL, e.Tag, last)
		}
		seen, last = seen|e.Tag, e.Tag
		es[i] = e
	}
	if seen&(ACLUserObj|ACLGroupObj|ACLOther) != ACLUserObj|ACLGroupObj|ACLOther {
		return nil, fmt.Errorf("%w: no owner, group or other entry", ErrACL)
	}
	if named && seen&ACLMask == 0 {
		return nil, fmt.Errorf("%w: named entries without a mask", ErrACL)
	}
	return &ACL{entries: es, xattr: string(encodeACL(es))}, nil
}

// NewACL returns the ACL of entries, which must be valid (ParseACL).
func NewACL(entries ...ACLEntry) (*ACL, error) {
	return ParseACL(encodeACL(entries))
}

// encodeACL is entries as the value of system.posix_acl_access.
func encodeACL(es []ACLEntry) []byte {
	out := make([]byte, 4+8*len(es))
	binary.LittleEndian.PutUint32(out, aclXattrVersion)
	for i, e := range es {
		r := out[4+8*i:]
		binary.LittleEndian.PutUint16(r, e.Tag)
		binary.LittleEndian.PutUint16(r[2:], e.Perm)
		binary.LittleEndian.PutUint32(r[4:], e.ID)
	}
	return out
}

// equivalent reports whether a says no more than mode's permission bits:
// only the owner, owning group and other entries, each equal to mode's.
func (a *ACL) equivalent(mode uint32) bool {
	if len(a.entries) != 3 {
		return false
	}
	return uint32(a.entries[0].Perm) == mode>>6&7 && uint32(a.entries[1].Perm) == mode>>3&7 &&
		uint32(a.entries[2].Perm) == mode&7
}

const (
	aclPage  = 1 << 10
	aclPages = 1 << 10
)

// maxACLBytes bounds the bytes of the distinct ACLs a process keeps (a
// variable for a test).
var maxACLBytes = 64 << 20

// acls is the table of distinct ACLs; index 0 is none.
var acls struct {
	mu    sync.Mutex
	ids   map[string]uint32 // by Xattr (mu)
	n     uint32            // indexes given, none's included (mu)
	bytes int               // of the ACLs kept (mu)
	pages [aclPages]atomic.Pointer[[aclPage]*ACL]
}

// errACLs means the process has seen more distinct ACLs than it keeps.
var errACLs = fmt.Errorf("more than %d distinct ACLs or %d MiB of them", aclPages*aclPage-1, maxACLBytes>>20)

// aclOf returns the index of a (0 for nil), giving it one if new.
func aclOf(a *ACL) (uint32, error) {
	if a == nil {
		return 0, nil
	}
	acls.mu.Lock()
	defer acls.mu.Unlock()
	if i, ok := acls.ids[a.xattr]; ok {
		return i, nil
	}
	if acls.n == 0 {
		acls.n = 1 // none's
	}
	i := acls.n
	if i >= aclPages*aclPage || acls.bytes+len(a.xattr) > maxACLBytes {
		return 0, errACLs
	}
	p := acls.pages[i/aclPage].Load()
	if p == nil {
		p = new([aclPage]*ACL)
	}
	p[i%aclPage] = a // not yet published: no reader has index i
	acls.pages[i/aclPage].Store(p)
	if acls.ids == nil {
		acls.ids = map[string]uint32{}
	}
	acls.ids[a.xattr] = i
	acls.n++
	acls.bytes += len(a.xattr)
	return i, nil
}

// aclAt returns the ACL with index i, which aclOf gave; nil for 0.
func aclAt(i uint32) *ACL {
	if i == 0 {
		return nil
	}
	return acls.pages[i/aclPage].Load()[i%aclPage]
}

// ACL returns the entry's access ACL as SOURCE has it, or nil if the mode
// says it all.
func (e *Entry) ACL() *ACL { return aclAt(ownerACL(e.owner)) }

// SetACL gives a detached entry (At) an access ACL: for tests and tools.
// A nil a removes it.
func (e *Entry) SetACL(a *ACL) error {
	return e.setOwnerACL(e.Uid(), e.Gid(), a, nil)
}

// acl reads the access ACL of the entry name in directory dir (open as
// dirfd, or -1), of mode, for a scan: a directory's or a regular file's
// (a symlink has none), until SOURCE says it keeps none.
func (sc *scanner) acl(dirfd int, dir, name string, mode uint32) (*ACL, error) {
	if t := mode & unix.S_IFMT; t != unix.S_IFDIR && t != unix.S_IFREG || sc.noACL.Load() {
		return nil, nil
	}
	a, unsupported, err := readACL(dirfd, dir, name, mode)
	sc.ops.Add(1)
	if unsupported {
		sc.noACL.Store(true)
	}
	return a, err
}

// readACL reads the access ACL of the directory or regular file name in
// dir (open as dirfd, or -1), of mode, without following a symlink there;
// with name "", of dir itself, following one. It returns nil if the entry
// has none or it says no more than mode, and reports unsupported when
// SOURCE keeps no ACLs. An ACL that is not valid is an error: the entry
// cannot be mirrored.
func readACL(dirfd int, dir, name string, mode uint32) (a *ACL, unsupported bool, err error) {
	var buf [4 + 8*32]byte
	b := buf[:]
	for {
		var n int
		switch {
		case name == "":
			n, err = unix.Getxattr(dir, XattrACL, b)
		default:
			n, err = lgetxattr(dirfd, dir, name, b)
		}
		switch {
		case err == unix.ENODATA:
			return nil, false, nil
		case err == unix.EOPNOTSUPP:
			return nil, true, nil
		case err == unix.EINTR:
			continue
		case err == unix.ERANGE && len(b) < 4+8*MaxACLEntries:
			b = make([]byte, 4+8*MaxACLEntries)
			continue
		case err != nil:
			return nil, false, fmt.Errorf("getxattr %s %s: %w", filepath.Join(dir, name), XattrACL, err)
		}
		if a, err = aclFor(b[:n], mode); err != nil {
			return nil, false, fmt.Errorf("%s: %w", filepath.Join(dir, name), err)
		}
		return a, false, nil
	}
}

// aclFor is the ACL an entry of mode keeps for the value b of its
// system.posix_acl_access: nil if it says no more than mode.
func aclFor(b []byte, mode uint32) (*ACL, error) {
	a, err := ParseACL(b)
	if err != nil || a.equivalent(mode) {
		return nil, err
	}
	return a, nil
}

// noGetxattrat is set once the kernel has said it has no getxattrat
// (before Linux 6.13).
var noGetxattrat atomic.Bool

// lgetxattr reads the ACL of the entry name in dir without following a
// symlink: through getxattrat relative to the directory's descriptor
// dirfd where the kernel has it, the way the scan stats (fstatat), which
// is one lookup per entry instead of one per path component.
func lgetxattr(dirfd int, dir, name string, dest []byte) (int, error) {
	if dirfd >= 0 && !noGetxattrat.Load() {
		n, err := getxattrat(dirfd, name, XattrACL, dest)
		if err != unix.ENOSYS {
			return n, err
		}
		noGetxattrat.Store(true)
	}
	return unix.Lgetxattr(filepath.Join(dir, name), XattrACL, dest)
}

// getxattrat is getxattrat(2), without following a symlink at path.
func getxattrat(dirfd int, path, attr string, dest []byte) (int, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return 0, err
	}
	a, err := unix.BytePtrFromString(attr)
	if err != nil {
		return 0, err
	}
	var args struct {
		value uint64
		size  uint32
		flags uint32
	}
	if len(dest) > 0 {
		args.value = uint64(uintptr(unsafe.Pointer(&dest[0])))
		args.size = uint32(len(dest))
	}
	r, _, e := unix.Syscall6(unix.SYS_GETXATTRAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)), unix.AT_SYMLINK_NOFOLLOW,
		uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args))
	runtime.KeepAlive(dest)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
