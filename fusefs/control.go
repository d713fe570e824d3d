package fusefs

import (
	"path"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Control files and the no-open mount
//
// Regular files on this mount are never opened (see noOpen), so a control
// file cannot ask for direct I/O, and the kernel would serve a second read
// of "stats" from the page cache. Instead, every lookup of a control file
// renders its contents and returns a new node ID holding them, immutably,
// with an entry timeout of zero. Each open walks the path, the kernel
// revalidates the name, sees a different node ID and instantiates the new
// inode: every open reads one fresh, consistent document, and no reader can
// see the head of one rendering and the tail of another. A rendering goes
// when the kernel forgets its node ID.
//
// Control directories keep one node ID per path while the kernel holds it,
// and so do named pipes (the access log, package accesslog): the kernel
// keeps a pipe in its inode, so its reader and its writer (the daemon,
// through its own mount) must meet at one node ID. A pipe's contents never
// pass through this package.

// pseudoBase is the first node ID of the control tree; the catalog's
// inode numbers lie below it.
const pseudoBase = 1 << 62

func isPseudo(ino uint64) bool { return ino >= pseudoBase }

// pseudoNode is a control directory, or one rendering of a control file.
type pseudoNode struct {
	path     string // relative to the control directory; "" is the directory itself
	dir      bool
	pipe     bool // a named pipe: one node ID per path, like a directory
	writable bool
	data     []byte // a file's rendering; never changes
	born     time.Time
	lookups  uint64 // the kernel's references
}

// pseudoTable holds the control tree's node IDs the kernel knows.
type pseudoTable struct {
	byIno map[uint64]*pseudoNode
	dirs  map[string]uint64 // a directory's or a pipe's node ID by path
	next  uint64
}

func newPseudoTable() pseudoTable {
	return pseudoTable{byIno: map[uint64]*pseudoNode{}, dirs: map[string]uint64{}, next: pseudoBase}
}

// add gives n a node ID, one lookup counted; a directory or a pipe keeps
// its ID.
func (t *pseudoTable) add(n *pseudoNode) uint64 {
	if n.dir || n.pipe {
		if ino, ok := t.dirs[n.path]; ok {
			t.byIno[ino].lookups++
			return ino
		}
	}
	ino := t.next
	t.next++
	n.lookups = 1
	t.byIno[ino] = n
	if n.dir || n.pipe {
		t.dirs[n.path] = ino
	}
	return ino
}

func (f *FS) node(ino uint64) (*pseudoNode, fuse.Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.pseudo.byIno[ino]; n != nil {
		return n, fuse.OK
	}
	return nil, fuse.Status(syscall.ESTALE)
}

func (f *FS) forgetControl(ino, nlookup uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.pseudo.byIno[ino]
	if n == nil {
		return
	}
	n.lookups -= min(nlookup, n.lookups)
	if n.lookups == 0 {
		delete(f.pseudo.byIno, ino)
		if n.dir || n.pipe {
			delete(f.pseudo.dirs, n.path)
		}
	}
}

func (f *FS) fillPseudo(ino uint64, n *pseudoNode, a *fuse.Attr) {
	a.Ino = ino
	a.Uid, a.Gid = f.cfg.Owner.Uid, f.cfg.Owner.Gid
	setTimes(a, n.born)
	if n.dir {
		a.Mode = syscall.S_IFDIR | 0o555
		a.Nlink = 2
		return
	}
	if n.pipe {
		// The mounting user's only: it shows every user's requests.
		a.Mode, a.Nlink = syscall.S_IFIFO|0o600, 1
		return
	}
	a.Mode = syscall.S_IFREG | 0o444
	if n.writable {
		a.Mode = syscall.S_IFREG | 0o600 // the mounting user's only
		if f.cfg.GroupWrite {
			a.Mode = syscall.S_IFREG | 0o660
		}
	}
	a.Nlink = 1
	a.Size = uint64(len(n.data))
}

// enter registers n and answers the lookup with it.
func (f *FS) enter(n *pseudoNode, out *fuse.EntryOut) fuse.Status {
	f.mu.Lock()
	ino := f.pseudo.add(n)
	n = f.pseudo.byIno[ino]
	f.mu.Unlock()
	out.NodeId = ino
	f.fillPseudo(ino, n, &out.Attr)
	if n.pipe {
		out.SetEntryTimeout(f.cfg.TTL) // always there, always the same node
	}
	if !n.dir {
		out.SetAttrTimeout(f.cfg.TTL) // the contents never change
	}
	return fuse.OK
}

func (f *FS) lookupControlRoot(out *fuse.EntryOut) fuse.Status {
	return f.enter(&pseudoNode{dir: true, born: f.born}, out)
}

func (f *FS) lookupControl(parent uint64, name string, out *fuse.EntryOut) fuse.Status {
	d, st := f.node(parent)
	if !st.Ok() {
		return st
	}
	if !d.dir {
		return fuse.Status(syscall.ENOTDIR)
	}
	list, err := f.ctl.List(d.path)
	if err != nil {
		return fuse.Status(toErrno(f.log, "lookup control "+d.path, err))
	}
	for _, pe := range list {
		if pe.Name != name {
			continue
		}
		p := path.Join(d.path, name)
		if pe.Dir || pe.Pipe {
			return f.enter(&pseudoNode{path: p, dir: pe.Dir, pipe: pe.Pipe, born: f.born}, out)
		}
		data, err := f.ctl.Read(p)
		if err != nil {
			return fuse.Status(toErrno(f.log, "read control "+p, err))
		}
		// A new node ID every time: see the comment at the top.
		return f.enter(&pseudoNode{path: p, writable: pe.Writable, data: data, born: time.Now()}, out)
	}
	return fuse.ENOENT
}

func (f *FS) getattrControl(ino uint64, out *fuse.AttrOut) fuse.Status {
	n, st := f.node(ino)
	if !st.Ok() {
		return st
	}
	f.fillPseudo(ino, n, &out.Attr)
	if !n.dir {
		out.SetTimeout(f.cfg.TTL)
	}
	return fuse.OK
}

// setattrControl accepts the truncation that precedes "echo cmd > control"
// and leaves the rendering as it is; anything else is refused.
func (f *FS) setattrControl(in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	n, st := f.node(in.NodeId)
	if !st.Ok() {
		return st
	}
	const truncation = fuse.FATTR_SIZE | fuse.FATTR_FH | fuse.FATTR_LOCKOWNER | fuse.FATTR_MTIME |
		fuse.FATTR_MTIME_NOW | fuse.FATTR_CTIME | fuse.FATTR_ATIME | fuse.FATTR_ATIME_NOW
	sz, ok := in.GetSize()
	if n.dir || !n.writable || !ok || sz != 0 || in.Valid&^truncation != 0 {
		return fuse.EPERM
	}
	f.fillPseudo(in.NodeId, n, &out.Attr)
	out.Size = 0
	out.SetTimeout(0)
	return fuse.OK
}

func (f *FS) openControl(in *fuse.OpenIn) fuse.Status {
	n, st := f.node(in.NodeId)
	if !st.Ok() {
		return st
	}
	if in.Flags&syscall.O_ACCMODE != syscall.O_RDONLY && !n.writable {
		return fuse.EACCES
	}
	return noOpen
}

func (f *FS) readControl(in *fuse.ReadIn) ([]byte, fuse.Status) {
	n, st := f.node(in.NodeId)
	if !st.Ok() {
		return nil, st
	}
	off := int64(in.Offset)
	if n.dir {
		return nil, fuse.Status(syscall.EISDIR)
	}
	if off >= int64(len(n.data)) {
		return nil, fuse.OK
	}
	return n.data[off:min(off+int64(in.Size), int64(len(n.data)))], fuse.OK
}

func (f *FS) writeControl(in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	n, st := f.node(in.NodeId)
	if !st.Ok() {
		return 0, st
	}
	if !n.writable {
		return 0, fuse.EACCES
	}
	if err := f.ctl.Write(n.path, data); err != nil {
		return 0, fuse.Status(toErrno(f.log, "write control "+n.path, err))
	}
	return uint32(len(data)), fuse.OK
}

// opendirControl lists a control directory as of now.
func (f *FS) opendirControl(ino uint64) (*dirHandle, fuse.Status) {
	n, st := f.node(ino)
	if !st.Ok() {
		return nil, st
	}
	if !n.dir {
		return nil, fuse.Status(syscall.ENOTDIR)
	}
	list, err := f.ctl.List(n.path)
	if err != nil {
		return nil, fuse.Status(toErrno(f.log, "readdir control "+n.path, err))
	}
	if list == nil {
		list = []PseudoEntry{}
	}
	return &dirHandle{self: ino, parent: ino, pseudo: list}, fuse.OK
}
