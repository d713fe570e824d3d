package fusefs

import (
	"context"
	"path"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dlfs/dlfs/catalog"
)

// The dataset's requests. A node ID below pseudoBase is a catalog inode
// number; requests for the control tree go to control.go.

// noOpen is the answer to OPEN of regular files. ENOSYS tells the kernel
// (FUSE_NO_OPEN_SUPPORT, Linux 4.19+) never to send OPEN or RELEASE again
// on this mount, and to keep the page cache across opens (FOPEN_KEEP_CACHE
// is implied). FLUSH, sent on every close, is answered the same way (see
// Flush). A file whose pages are cached is then read with no round trip
// to the daemon at all: a second epoch runs at page-cache speed instead of
// paying three requests per file. The price is that the daemon does not
// see opens, only reads of uncached pages; an open for writing succeeds,
// and its writes fail with EROFS.
const noOpen = fuse.ENOSYS

// Flush answers ENOSYS, which tells the kernel never to send FLUSH again
// on this mount (no_flush): nothing is written through a file handle here
// (a control file's write is applied when it is written), so a close
// needs no round trip. Without it every close of a page-cached file cost
// one, and a reader of page-cached samples ran at a fraction of native
// speed.
func (f *FS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status { return fuse.ENOSYS }

// entry returns the current catalog entry of node ID ino.
func (f *FS) entry(ino uint64) (*catalog.Entry, fuse.Status) {
	if e := f.data.Snapshot().ByIno(ino); e != nil {
		return e, fuse.OK
	}
	return nil, fuse.Status(syscall.ESTALE) // removed by a refresh
}

func fillAttr(e *catalog.Entry, a *fuse.Attr) {
	a.Ino = e.Ino
	a.Mode = e.Mode
	a.Size = uint64(e.Size)
	a.Blocks = (a.Size + 511) / 512
	a.Blksize = 4096
	a.Nlink = 1
	if e.IsDir() {
		a.Nlink = 2
	}
	a.Uid, a.Gid = e.Uid(), e.Gid()
	sec, nsec := uint64(e.Mtime/1e9), uint32(e.Mtime%1e9)
	a.Mtime, a.Mtimensec = sec, nsec
	a.Ctime, a.Ctimensec = sec, nsec
	a.Atime, a.Atimensec = sec, nsec
}

// fillEntry answers a lookup of e. The kernel's lookup count is not
// tracked: the node ID is the catalog's inode number, valid as long as
// the path exists.
func (f *FS) fillEntry(e *catalog.Entry, out *fuse.EntryOut) {
	out.NodeId = e.Ino
	out.Generation = 0
	fillAttr(e, &out.Attr)
	out.SetEntryTimeout(f.cfg.TTL)
	out.SetAttrTimeout(f.cfg.TTL)
}

func (f *FS) lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	if isPseudo(h.NodeId) {
		return f.lookupControl(h, name, out)
	}
	if h.NodeId == catalog.RootIno && name == f.cfg.ControlName {
		return f.lookupControlRoot(out)
	}
	c, st := f.child(cancel, h.NodeId, name) // checked.go
	if !st.Ok() {
		return st
	}
	f.fillEntry(c, out)
	return fuse.OK
}

func (f *FS) Forget(ino, nlookup uint64) {
	if isPseudo(ino) {
		f.forgetControl(ino, nlookup)
	}
}

func (f *FS) getAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	if isPseudo(in.NodeId) {
		return f.getattrControl(in.NodeId, out)
	}
	e, st := f.current(cancel, in.NodeId)
	if !st.Ok() {
		return st
	}
	fillAttr(e, &out.Attr)
	out.SetTimeout(f.cfg.TTL)
	return fuse.OK
}

func (f *FS) setAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	if isPseudo(in.NodeId) {
		return f.setattrControl(in, out)
	}
	return fuse.EROFS
}

func (f *FS) open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if isPseudo(in.NodeId) {
		return f.openControl(in)
	}
	if in.Flags&syscall.O_ACCMODE != syscall.O_RDONLY || in.Flags&syscall.O_TRUNC != 0 {
		return fuse.EROFS
	}
	if !f.passthroughOn() {
		return noOpen
	}
	e, st := f.current(cancel, in.NodeId)
	if !st.Ok() {
		return st
	}
	if !e.IsRegular() {
		out.OpenFlags = fuse.FOPEN_KEEP_CACHE
		return fuse.OK
	}
	return f.openRegular(in, e, out) // passthrough.go
}

// Release forgets an open (passthrough.go); with noOpen, none comes.
func (f *FS) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	t0 := f.begin()
	if !isPseudo(in.NodeId) {
		f.release(in)
	}
	f.done(t0, opRelease, &in.InHeader, in.NodeId, "", -1, 0, "", fuse.OK)
}

// read answers a read with the bytes and the tier that served them.
func (f *FS) read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) ([]byte, string, fuse.Status) {
	if isPseudo(in.NodeId) {
		b, st := f.readControl(in)
		return b, "control", st
	}
	e, st := f.entry(in.NodeId)
	if !st.Ok() {
		return nil, "", st
	}
	if e.IsDir() {
		return nil, "", fuse.Status(syscall.EISDIR)
	}
	if b, ok, st := f.passthroughRead(in, buf); ok {
		return b, "passthrough", st // reported at its open
	}
	b, source, err := f.data.ReadAt(requestContext{cancel}, e, buf[:min(int(in.Size), len(buf))], int64(in.Offset), in.Caller.Pid)
	if err != nil {
		return nil, source, fuse.Status(toErrno(f.log, "read "+e.Path(), err))
	}
	return b, source, fuse.OK
}

func (f *FS) write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if isPseudo(in.NodeId) {
		return f.writeControl(cancel, in, data)
	}
	return 0, fuse.EROFS
}

// readlink returns a symlink's target. The kernel resolves it, as it
// would on SOURCE; dlfs itself never follows it.
func (f *FS) readlink(cancel <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	e, st := f.current(cancel, h.NodeId)
	if !st.Ok() {
		return nil, st
	}
	if !e.IsSymlink() {
		return nil, fuse.EINVAL
	}
	return []byte(e.Target()), fuse.OK
}

// dirHandle is an open directory: its listing as of the open.
type dirHandle struct {
	self, parent uint64
	dir          *catalog.Entry // a catalog directory (immutable)
	pseudo       []PseudoEntry  // a control directory's listing
	pseudoDir    string         // that directory's path in the control tree
}

// len is the number of entries, "." and ".." included.
func (d *dirHandle) len() int {
	if d.dir != nil {
		return 2 + d.dir.NumChildren()
	}
	return 2 + len(d.pseudo)
}

// at returns entry i of the listing, and the catalog entry behind it if
// there is one.
func (d *dirHandle) at(i int) (fuse.DirEntry, *catalog.Entry) {
	de := fuse.DirEntry{Off: uint64(i + 1), Mode: syscall.S_IFDIR}
	switch {
	case i == 0:
		de.Name, de.Ino = ".", d.self
	case i == 1:
		de.Name, de.Ino = "..", d.parent
	case d.dir != nil:
		c := d.dir.ChildAt(i - 2)
		de.Name, de.Ino, de.Mode = c.Name, c.Ino, c.Mode
		return de, c
	default:
		pe := d.pseudo[i-2]
		de.Name, de.Ino = pe.Name, stableIno(path.Join(d.pseudoDir, pe.Name))
		switch {
		case pe.Pipe:
			de.Mode = syscall.S_IFIFO
		case !pe.Dir:
			de.Mode = syscall.S_IFREG
		}
	}
	return de, nil
}

// openDir lets the kernel cache a catalog directory's listing
// (FOPEN_CACHE_DIR): the dataset does not change while mounted, and
// Invalidate clears the cache of directories a refresh changed. The
// control directory is deliberately absent from the root's listing: see
// the package doc.
func (f *FS) openDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	var h *dirHandle
	if isPseudo(in.NodeId) {
		var st fuse.Status
		if h, st = f.opendirControl(in.NodeId); !st.Ok() {
			return st
		}
	} else {
		e, st := f.current(cancel, in.NodeId)
		if !st.Ok() {
			return st
		}
		if !e.IsDir() {
			return fuse.Status(syscall.ENOTDIR)
		}
		h = &dirHandle{self: e.Ino, parent: e.Ino, dir: e}
		if p := e.Parent(); p != nil {
			h.parent = p.Ino
		}
		out.OpenFlags = fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE
	}
	f.mu.Lock()
	f.nextFh++
	out.Fh = f.nextFh
	f.dirs[out.Fh] = h
	f.mu.Unlock()
	return fuse.OK
}

func (f *FS) handle(fh uint64) (*dirHandle, fuse.Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.dirs[fh]; h != nil {
		return h, fuse.OK
	}
	return nil, fuse.EBADF
}

func (f *FS) readDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	h, st := f.handle(in.Fh)
	if !st.Ok() {
		return st
	}
	for i := int(in.Offset); i < h.len(); i++ {
		de, _ := h.at(i)
		if !out.AddDirEntry(de) {
			break
		}
	}
	return fuse.OK
}

// readDirPlus answers the entries with their attributes, as lookups would;
// the control tree's and the dot entries come without (node ID 0: the
// kernel looks them up when asked). The names are the handle's, as of the
// open, but the attributes are the current snapshot's: a refresh during a
// listing has invalidated what changed, and the old attributes must not
// come back (the kernel drops an answer to a request older than an
// invalidation, not one made after it from old figures). An entry a
// refresh removed comes without attributes.
//
// Without Config.ListingAttrs the kernel asks for attributes with a
// directory's first chunk only (READDIRPLUS_AUTO), and makes an inode for
// each entry in it. That first answer is then the dot entries alone: the
// kernel reads on with plain READDIR, unless lookups came between, when it
// asks for attributes again and gets them all.
func (f *FS) readDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	h, st := f.handle(in.Fh)
	if !st.Ok() {
		return st
	}
	end := h.len()
	if !f.cfg.ListingAttrs && in.Offset == 0 {
		end = min(end, 2)
	}
	snap := f.data.Snapshot()
	for i := int(in.Offset); i < end; i++ {
		de, e := h.at(i)
		eo := out.AddDirLookupEntry(de)
		if eo == nil {
			break
		}
		if e == nil {
			continue
		}
		// An inode number names one path and type for good (package
		// catalog), so the current entry is the one of that number.
		// One not checked against SOURCE yet comes without (checked.go).
		if cur := snap.ByIno(e.Ino); cur != nil && f.servable(cur) {
			f.fillEntry(cur, eo)
		}
	}
	return fuse.OK
}

func (f *FS) releaseDir(in *fuse.ReleaseIn) {
	f.mu.Lock()
	delete(f.dirs, in.Fh)
	f.mu.Unlock()
}

// The dataset is read-only.

func (f *FS) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	return fuse.EROFS
}

func (f *FS) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	return fuse.EROFS
}

func (f *FS) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return fuse.EROFS
}

func (f *FS) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return fuse.EROFS
}

func (f *FS) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	return fuse.EROFS
}

func (f *FS) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	return fuse.EROFS
}

func (f *FS) Symlink(cancel <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	return fuse.EROFS
}

func (f *FS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	return fuse.EROFS
}

func (f *FS) Tmpfile(cancel <-chan struct{}, in *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	return fuse.EROFS
}

func (f *FS) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	return fuse.EROFS
}

func (f *FS) RemoveXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string) fuse.Status {
	return fuse.EROFS
}

func (f *FS) Fallocate(cancel <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	return fuse.EROFS
}

func (f *FS) CopyFileRange(cancel <-chan struct{}, in *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	return 0, fuse.EROFS
}

// requestContext is a FUSE request's context: done when go-fuse closes the
// request's cancel channel, which it does when the kernel interrupts the
// request (the process reading got a signal) or the connection dies. It
// needs no goroutine of its own.
type requestContext struct{ cancel <-chan struct{} }

func (c requestContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c requestContext) Done() <-chan struct{}       { return c.cancel }
func (c requestContext) Value(any) any               { return nil }
func (c requestContext) Err() error {
	select {
	case <-c.cancel:
		return context.Canceled
	default:
		return nil
	}
}
