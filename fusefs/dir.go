package fusefs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// dirNode is a directory of the dataset. The root is a dirNode that also
// resolves the control directory.
type dirNode struct{ node }

var (
	_ = (fs.NodeLookuper)((*dirNode)(nil))
	_ = (fs.NodeReaddirer)((*dirNode)(nil))
	_ = (fs.NodeOpendirHandler)((*dirNode)(nil))
	_ = (fs.NodeGetattrer)((*dirNode)(nil))
	_ = (fs.NodeStatfser)((*dirNode)(nil))
	_ = (fs.NodeMkdirer)((*dirNode)(nil))
	_ = (fs.NodeCreater)((*dirNode)(nil))
	_ = (fs.NodeUnlinker)((*dirNode)(nil))
	_ = (fs.NodeRmdirer)((*dirNode)(nil))
	_ = (fs.NodeRenamer)((*dirNode)(nil))
	_ = (fs.NodeSymlinker)((*dirNode)(nil))
	_ = (fs.NodeLinker)((*dirNode)(nil))
	_ = (fs.NodeMknoder)((*dirNode)(nil))
)

func (d *dirNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if d.ino == d.fs.root.ino && name == d.fs.cfg.ControlName {
		return d.fs.controlDir(ctx, d.EmbeddedInode(), out), 0
	}
	e, errno := d.entry()
	if errno != 0 {
		return nil, errno
	}
	c := e.Child(name)
	if c == nil {
		return nil, syscall.ENOENT
	}
	return d.fs.child(ctx, d.EmbeddedInode(), c, out), 0
}

func (d *dirNode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	e, errno := d.entry()
	if errno != 0 {
		return nil, errno
	}
	// The control directory is deliberately absent: see the package doc.
	children := e.Children()
	list := make([]fuse.DirEntry, len(children))
	for i, c := range children {
		list[i] = fuse.DirEntry{Name: c.Name, Mode: c.Mode, Ino: c.Ino}
	}
	return fs.NewListDirStream(list), 0
}

// OpendirHandle lets the kernel cache the listing (FOPEN_CACHE_DIR): the
// dataset does not change while mounted, and Invalidate clears the cache of
// directories a refresh changed.
func (d *dirNode) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	ds, errno := d.Readdir(ctx)
	if errno != 0 {
		return nil, 0, errno
	}
	return ds, fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, 0
}

func (d *dirNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.fs.data.Source(), &st); err != nil {
		return toErrno(d.fs.log, "statfs", err)
	}
	out.FromStatfsT(&st)
	return 0
}

// The dataset is read-only.

func (d *dirNode) Mkdir(context.Context, string, uint32, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (d *dirNode) Create(context.Context, string, uint32, uint32, *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EROFS
}

func (d *dirNode) Unlink(context.Context, string) syscall.Errno { return syscall.EROFS }

func (d *dirNode) Rmdir(context.Context, string) syscall.Errno { return syscall.EROFS }

func (d *dirNode) Rename(context.Context, string, fs.InodeEmbedder, string, uint32) syscall.Errno {
	return syscall.EROFS
}

func (d *dirNode) Symlink(context.Context, string, string, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (d *dirNode) Link(context.Context, fs.InodeEmbedder, string, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (d *dirNode) Mknod(context.Context, string, uint32, uint32, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

// linkNode is a symlink of the dataset. The kernel resolves its target, as
// it would on SOURCE; dlfs itself never follows it.
type linkNode struct{ node }

var _ = (fs.NodeReadlinker)((*linkNode)(nil))

func (l *linkNode) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	e, errno := l.entry()
	if errno != 0 {
		return nil, errno
	}
	return []byte(e.Target), 0
}
