package fusefs

import (
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dlfs/dlfs/catalog"
)

// Extended attributes: the view shows one, an entry's POSIX access ACL
// as SOURCE has it (catalog.XattrACL), and only where it says more than
// the mode. The mount negotiates FUSE_POSIX_ACL (MountOptions.EnableAcl),
// so the kernel asks for it once per inode, caches it until the inode is
// invalidated (a refresh that changes an ACL changes the entry's ctime,
// hence its invalidation), and enforces it itself, as for a local file:
// a user SOURCE's ACL denies is denied through the mount too. The
// control tree has none.

// aclNames is the list of the names of an entry with an ACL, as
// listxattr returns it.
const aclNames = catalog.XattrACL + "\x00"

// xattr returns the value of attribute attr of node ino.
func (f *FS) xattr(ino uint64, attr string) (string, fuse.Status) {
	if isPseudo(ino) {
		return "", fuse.ENOATTR
	}
	e, st := f.entry(ino)
	if !st.Ok() {
		return "", st
	}
	if a := e.ACL(); a != nil && attr == catalog.XattrACL {
		return a.Xattr(), fuse.OK
	}
	return "", fuse.ENOATTR
}

// GetXAttr answers getxattr: the value, or with an empty dest its size.
func (f *FS) GetXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	v, st := f.xattr(h.NodeId, attr)
	if !st.Ok() {
		return 0, st
	}
	return copyValue(v, dest)
}

// ListXAttr answers listxattr: the names, or with an empty dest their
// size.
func (f *FS) ListXAttr(cancel <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	if _, st := f.xattr(h.NodeId, catalog.XattrACL); st == fuse.ENOATTR {
		return 0, fuse.OK
	} else if !st.Ok() {
		return 0, st
	}
	return copyValue(aclNames, dest)
}

// copyValue copies v to dest; with dest too short, it reports v's size
// and ERANGE (go-fuse answers a size query, an empty dest, with the size).
func copyValue(v string, dest []byte) (uint32, fuse.Status) {
	if len(dest) < len(v) {
		return uint32(len(v)), fuse.ERANGE
	}
	return uint32(copy(dest, v)), fuse.OK
}
