package fusefs

import (
	"bytes"
	"context"
	"hash/fnv"
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
// renders its contents, with an entry timeout of zero, and answers with
// the node ID of that rendering: each open walks the path, the kernel
// revalidates the name, and a node ID that changed makes it instantiate
// the new inode. Every open reads one fresh, consistent document, and no
// reader can see the head of one rendering and the tail of another.
//
// A rendering is immutable and shared: a lookup whose rendering is byte
// for byte one the kernel still holds gets that one's node ID (so 600
// open descriptors of one plan file hold one copy of it), and a new node
// ID only when the contents changed. The writable control file is the
// exception: its writer truncates the node it opens, so every lookup of
// it gets a node of its own. A rendering goes when the kernel
// forgets its node ID. Renderings held together are bounded by
// MaxRenderBytes: past it, the least recently looked-up ones lose their
// contents (their reads fail with ESTALE; an open looks up a new one).
//
// A ViewControl answers for the user who asks: a file's contents may be
// that user's view (a lookup carries the caller), and entries may have an
// owner and mode of their own (a job's plans are its user's), which the
// kernel enforces (default_permissions). Contents that differ per user
// get different node IDs, so one user is never handed another's view.
//
// Node IDs change; inode numbers do not. Every control entry reports the
// same inode number (st_ino) for its path, whatever rendering answers
// (stableIno): tools compare the inode number of the path they stat with
// that of the descriptor they open (cp fails "replaced while being copied"
// when they differ), and each open of a control file is a new rendering.
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

// stableBase is the first of the control entries' inode numbers, above
// any node ID the table hands out.
const stableBase = pseudoBase | 1<<61

// stableIno is the inode number of the control entry at path ("" is the
// control directory): the same for every rendering of it, for the life of
// the mount and across mounts.
func stableIno(path string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(path))
	return stableBase | h.Sum64()&(1<<61-1)
}

// ViewControl is a ControlPlane that answers for the user who asks. FS
// uses it when its ControlPlane implements it.
type ViewControl interface {
	// ReadFor returns a control file's contents as caller may see them
	// (Read is then never asked).
	ReadFor(caller *fuse.Caller, path string) ([]byte, error)
	// Perm returns the owner, group and permission bits of a control
	// entry (a directory, or a file that is not writable); ok false keeps
	// the defaults: the mounting user's, 0555 or 0444.
	Perm(path string) (p PseudoPerm, ok bool)
}

// PseudoPerm is a control entry's owner, group and permission bits.
type PseudoPerm struct {
	Uid, Gid uint32
	Mode     uint32 // permission bits only
}

// MaxRenderBytes bounds the bytes of the control files' renderings held
// at once (see the top of this file).
const MaxRenderBytes = 64 << 20

// pseudoNode is a control directory, or one rendering of a control file.
type pseudoNode struct {
	path     string // relative to the control directory; "" is the directory itself
	dir      bool
	pipe     bool // a named pipe: one node ID per path, like a directory
	writable bool
	data     []byte      // a file's rendering; never changes (nil once evicted; mu)
	size     int         // len(data) as rendered
	sum      uint64      // a file's: FNV-1a of data, to find an equal rendering
	perm     *PseudoPerm // a file's owner and mode, as of its rendering; nil: the defaults
	evicted  bool        // data was dropped to keep renderings within MaxRenderBytes (mu)
	used     uint64      // the table's clock at its last lookup or read (mu)
	born     time.Time
	lookups  uint64 // the kernel's references
}

// pseudoTable holds the control tree's node IDs the kernel knows.
//
// INVARIANT: bytes == the sum of len(data) of the files in byIno;
// renders[k] is a file in byIno with k's path and sum, not evicted.
type pseudoTable struct {
	byIno   map[uint64]*pseudoNode
	dirs    map[string]uint64    // a directory's or a pipe's node ID by path
	renders map[renderKey]uint64 // a file's renderings held, by path and contents
	bytes   int64                // of the renderings held
	limit   int64                // MaxRenderBytes (tests lower it)
	clock   uint64
	next    uint64
}

// renderKey finds a rendering of path with the same contents.
type renderKey struct {
	path string
	sum  uint64
	size int
}

func newPseudoTable() pseudoTable {
	return pseudoTable{byIno: map[uint64]*pseudoNode{}, dirs: map[string]uint64{}, renders: map[renderKey]uint64{},
		limit: MaxRenderBytes, next: pseudoBase}
}

func (n *pseudoNode) key() renderKey { return renderKey{n.path, n.sum, n.size} }

// add gives n a node ID, one lookup counted: a directory or a pipe keeps
// its ID, and a file's rendering equal to one held gets that one's.
func (t *pseudoTable) add(n *pseudoNode) uint64 {
	t.clock++
	if n.dir || n.pipe {
		if ino, ok := t.dirs[n.path]; ok {
			t.byIno[ino].lookups++
			return ino
		}
	} else {
		h := fnv.New64a()
		h.Write(n.data)
		n.sum, n.size = h.Sum64(), len(n.data)
		// A writable file is never shared: the writer's truncation (echo >
		// control) sets its node's size to 0 in the kernel.
		if ino, ok := t.renders[n.key()]; ok && !n.writable {
			if o := t.byIno[ino]; bytes.Equal(o.data, n.data) && samePerm(o.perm, n.perm) {
				o.lookups++
				o.used = t.clock
				return ino
			}
		}
	}
	ino := t.next
	t.next++
	n.lookups, n.used = 1, t.clock
	t.byIno[ino] = n
	switch {
	case n.dir || n.pipe:
		t.dirs[n.path] = ino
	default:
		if !n.writable {
			t.renders[n.key()] = ino
		}
		t.bytes += int64(len(n.data))
		t.evict(ino)
	}
	return ino
}

// evict drops the contents of the least recently looked-up renderings
// (but keep's) while they hold more than limit bytes.
func (t *pseudoTable) evict(keep uint64) {
	for t.bytes > t.limit {
		var oldest *pseudoNode
		for ino, n := range t.byIno {
			if ino != keep && n.data != nil && (oldest == nil || n.used < oldest.used) {
				oldest = n
			}
		}
		if oldest == nil {
			return // keep alone is over the limit: it stays, for its open
		}
		t.drop(oldest)
		oldest.evicted = true
	}
}

// drop lets go of a rendering's contents.
func (t *pseudoTable) drop(n *pseudoNode) {
	if k := n.key(); n.data != nil && t.byIno[t.renders[k]] == n {
		delete(t.renders, k)
	}
	t.bytes -= int64(len(n.data))
	n.data = nil
}

func samePerm(a, b *PseudoPerm) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }

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
		if n.dir || n.pipe {
			delete(f.pseudo.dirs, n.path)
		} else {
			f.pseudo.drop(n)
		}
		delete(f.pseudo.byIno, ino)
	}
}

// perm returns path's owner and mode, if the control plane gives them.
func (f *FS) perm(path string) *PseudoPerm {
	if v, ok := f.ctl.(ViewControl); ok {
		if p, ok := v.Perm(path); ok {
			return &p
		}
	}
	return nil
}

// fillPseudo fills a with n's attributes. It reports
// whether they never change, so that the kernel may cache
// them: a file's rendering never changes, nor does a directory whose owner
// and mode are not a job's. The daemon's own access-log writer then walks
// to the pipe with no request to itself, which the kernel would never see
// answered if the daemon were killed meanwhile.
func (f *FS) fillPseudo(n *pseudoNode, a *fuse.Attr) (fixed bool) {
	a.Ino = stableIno(n.path)
	a.Uid, a.Gid = f.cfg.Owner.Uid, f.cfg.Owner.Gid
	setTimes(a, n.born)
	if n.dir {
		a.Mode = syscall.S_IFDIR | 0o555
		a.Nlink = 2
		if p := f.perm(n.path); p != nil { // as of now: the kernel asks again (no attribute timeout)
			a.Uid, a.Gid, a.Mode = p.Uid, p.Gid, syscall.S_IFDIR|p.Mode&0o777
			return false
		}
		return true
	}
	if n.pipe {
		// The mounting user's only: it shows every user's requests.
		a.Mode, a.Nlink = syscall.S_IFIFO|0o600, 1
		return true
	}
	a.Mode = syscall.S_IFREG | 0o444
	if n.writable {
		a.Mode = syscall.S_IFREG | 0o600 // the mounting user's only
		if f.cfg.GroupWrite {
			a.Mode = syscall.S_IFREG | 0o660
		}
	}
	if p := n.perm; p != nil && !n.writable {
		a.Uid, a.Gid, a.Mode = p.Uid, p.Gid, syscall.S_IFREG|p.Mode&0o777
	}
	a.Nlink = 1
	a.Size = uint64(n.size)
	return true
}

// enter registers n and answers the lookup with it.
func (f *FS) enter(n *pseudoNode, out *fuse.EntryOut) fuse.Status {
	f.mu.Lock()
	ino := f.pseudo.add(n)
	n = f.pseudo.byIno[ino]
	f.mu.Unlock()
	out.NodeId = ino
	fixed := f.fillPseudo(n, &out.Attr)
	if n.pipe || n.dir && n.path == "" {
		// The pipe and the control directory: always there, always the
		// same node. The daemon's access-log writer walks to the pipe
		// by its path on every poll (holding nothing open in the mount,
		// which would keep it busy) with no request to itself.
		out.SetEntryTimeout(f.cfg.TTL)
	}
	if fixed {
		out.SetAttrTimeout(f.cfg.TTL)
	}
	return fuse.OK
}

func (f *FS) lookupControlRoot(out *fuse.EntryOut) fuse.Status {
	return f.enter(&pseudoNode{dir: true, born: f.born}, out)
}

func (f *FS) lookupControl(h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	d, st := f.node(h.NodeId)
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
		var data []byte
		var err error
		if v, ok := f.ctl.(ViewControl); ok {
			data, err = v.ReadFor(&h.Caller, p)
		} else {
			data, err = f.ctl.Read(p)
		}
		if err != nil {
			return fuse.Status(toErrno(f.log, "read control "+p, err))
		}
		// A new node ID unless the kernel holds this very rendering: see
		// the comment at the top.
		return f.enter(&pseudoNode{path: p, writable: pe.Writable, data: data, perm: f.perm(p), born: time.Now()}, out)
	}
	return fuse.ENOENT
}

func (f *FS) getattrControl(ino uint64, out *fuse.AttrOut) fuse.Status {
	n, st := f.node(ino)
	if !st.Ok() {
		return st
	}
	if f.fillPseudo(n, &out.Attr) {
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
	f.fillPseudo(n, &out.Attr)
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
	if f.passthroughOn() {
		return fuse.OK // the mount answers OPEN; every lookup renders anew all the same
	}
	return noOpen
}

func (f *FS) readControl(in *fuse.ReadIn) ([]byte, fuse.Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.pseudo.byIno[in.NodeId]
	switch {
	case n == nil || n.evicted:
		return nil, fuse.Status(syscall.ESTALE) // forgotten, or its contents dropped: open it again
	case n.dir:
		return nil, fuse.Status(syscall.EISDIR)
	}
	off := int64(in.Offset)
	if off >= int64(len(n.data)) {
		return nil, fuse.OK // not a use: its reader is done with it
	}
	f.pseudo.clock++
	n.used = f.pseudo.clock
	return n.data[off:min(off+int64(in.Size), int64(len(n.data)))], fuse.OK
}

// callerKey holds a control write's fuse.Caller in its context.
type callerKey struct{}

// CallerOf returns who made a control write, from the context
// ControlPlane.Write is given.
func CallerOf(ctx context.Context) (fuse.Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(fuse.Caller)
	return c, ok
}

func (f *FS) writeControl(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	n, st := f.node(in.NodeId)
	if !st.Ok() {
		return 0, st
	}
	if !n.writable {
		return 0, fuse.EACCES
	}
	ctx := context.WithValue(requestContext{cancel}, callerKey{}, in.Caller)
	if err := f.ctl.Write(ctx, n.path, data); err != nil {
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
	self := stableIno(n.path)
	return &dirHandle{self: self, parent: self, pseudo: list, pseudoDir: n.path}, fuse.OK
}
