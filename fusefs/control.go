package fusefs

import (
	"context"
	"path"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// pseudoNode is a directory or file in the control tree. Its attributes are
// never cached by the kernel: the tree and the contents change all the time.
type pseudoNode struct {
	fs.Inode
	fs       *FS
	path     string // relative to the control directory; "" is the directory itself
	dir      bool
	writable bool
	born     time.Time
}

var (
	_ = (fs.NodeLookuper)((*pseudoNode)(nil))
	_ = (fs.NodeReaddirer)((*pseudoNode)(nil))
	_ = (fs.NodeGetattrer)((*pseudoNode)(nil))
	_ = (fs.NodeSetattrer)((*pseudoNode)(nil))
	_ = (fs.NodeOpener)((*pseudoNode)(nil))
	_ = (fs.NodeReader)((*pseudoNode)(nil))
	_ = (fs.NodeWriter)((*pseudoNode)(nil))
)

func (f *FS) controlDir(ctx context.Context, parent *fs.Inode, out *fuse.EntryOut) *fs.Inode {
	n := &pseudoNode{fs: f, dir: true, born: time.Now()}
	n.fill(&out.Attr)
	return parent.NewInode(ctx, n, fs.StableAttr{Mode: syscall.S_IFDIR})
}

func (n *pseudoNode) fill(a *fuse.Attr) {
	a.Mode = syscall.S_IFREG | 0444
	if n.writable {
		a.Mode = syscall.S_IFREG | 0644
	}
	if n.dir {
		a.Mode = syscall.S_IFDIR | 0555
		a.Nlink = 2
	} else {
		a.Nlink = 1
	}
	a.Ino = n.StableAttr().Ino
	// Size 0 with direct I/O: readers read until EOF, as with /proc files.
	t := uint64(n.born.Unix())
	a.Mtime, a.Ctime, a.Atime = t, t, t
}

func (n *pseudoNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fill(&out.Attr)
	return 0
}

func (n *pseudoNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	// Truncation precedes every "echo cmd > control"; it is a no-op.
	if sz, ok := in.GetSize(); ok && sz == 0 && n.writable && in.Valid&^(fuse.FATTR_SIZE|fuse.FATTR_FH|fuse.FATTR_LOCKOWNER|fuse.FATTR_MTIME|fuse.FATTR_MTIME_NOW|fuse.FATTR_CTIME) == 0 {
		n.fill(&out.Attr)
		return 0
	}
	return syscall.EPERM
}

func (n *pseudoNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if !n.dir {
		return nil, syscall.ENOTDIR
	}
	list, err := n.fs.ctl.List(n.path)
	if err != nil {
		return nil, toErrno(n.fs.log, "lookup control "+n.path, err)
	}
	for _, pe := range list {
		if pe.Name != name {
			continue
		}
		c := &pseudoNode{fs: n.fs, path: path.Join(n.path, name), dir: pe.Dir, writable: pe.Writable, born: n.born}
		mode := uint32(syscall.S_IFREG)
		if pe.Dir {
			mode = syscall.S_IFDIR
		}
		ch := n.NewInode(ctx, c, fs.StableAttr{Mode: mode})
		// NewInode may return an existing inode; describe what it holds.
		ch.Operations().(*pseudoNode).fill(&out.Attr)
		return ch, 0
	}
	return nil, syscall.ENOENT
}

func (n *pseudoNode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	if !n.dir {
		return nil, syscall.ENOTDIR
	}
	list, err := n.fs.ctl.List(n.path)
	if err != nil {
		return nil, toErrno(n.fs.log, "readdir control "+n.path, err)
	}
	out := make([]fuse.DirEntry, len(list))
	for i, pe := range list {
		out[i] = fuse.DirEntry{Name: pe.Name, Mode: syscall.S_IFREG}
		if pe.Dir {
			out[i].Mode = syscall.S_IFDIR
		}
	}
	return fs.NewListDirStream(out), 0
}

// pseudoHandle holds the contents of a control file as of its open, so a
// reader that reads in pieces sees one consistent document.
type pseudoHandle struct {
	once sync.Once
	data []byte
	err  error
}

func (n *pseudoNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if n.dir {
		return nil, 0, syscall.EISDIR
	}
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY && !n.writable {
		return nil, 0, syscall.EACCES
	}
	return &pseudoHandle{}, fuse.FOPEN_DIRECT_IO, 0
}

func (n *pseudoNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h, ok := fh.(*pseudoHandle)
	if !ok {
		return nil, syscall.EBADF
	}
	// Read the contents at the first read, not at open: "echo cmd > control"
	// opens without reading, and a later read should see its effect.
	h.once.Do(func() { h.data, h.err = n.fs.ctl.Read(n.path) })
	if h.err != nil {
		return nil, toErrno(n.fs.log, "read control "+n.path, h.err)
	}
	if off >= int64(len(h.data)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(h.data[off:min(off+int64(len(dest)), int64(len(h.data)))]), 0
}

func (n *pseudoNode) Write(ctx context.Context, fh fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if !n.writable {
		return 0, syscall.EACCES
	}
	if err := n.fs.ctl.Write(n.path, data); err != nil {
		return 0, toErrno(n.fs.log, "write control "+n.path, err)
	}
	return uint32(len(data)), 0
}
