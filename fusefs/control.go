package fusefs

import (
	"context"
	"path"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Control files and the no-open mount
//
// Regular files on this mount are never opened (see noOpen), so a control
// file cannot ask for direct I/O, and the kernel would serve a second read
// of "stats" from the page cache. Instead, every lookup of a control file
// renders its contents and returns a new inode holding them, immutably, with
// an entry timeout of zero. Each open walks the path, the kernel revalidates
// the name, sees a different node ID and instantiates the new inode: every
// open reads one fresh, consistent document, and no reader can see the head
// of one rendering and the tail of another. Old inodes go when the kernel
// forgets them.

// pseudoDir is a directory of the control tree. Its listing is asked of the
// ControlPlane on every lookup and readdir.
type pseudoDir struct {
	fs.Inode
	fs   *FS
	path string // relative to the control directory; "" is the directory itself
	born time.Time
}

var (
	_ = (fs.NodeLookuper)((*pseudoDir)(nil))
	_ = (fs.NodeReaddirer)((*pseudoDir)(nil))
	_ = (fs.NodeGetattrer)((*pseudoDir)(nil))
)

func (f *FS) controlDir(ctx context.Context, parent *fs.Inode, out *fuse.EntryOut) *fs.Inode {
	ch := parent.NewInode(ctx, &pseudoDir{fs: f, born: time.Now()}, fs.StableAttr{Mode: syscall.S_IFDIR})
	ch.Operations().(*pseudoDir).fill(&out.Attr)
	return ch
}

func (d *pseudoDir) fill(a *fuse.Attr) {
	a.Mode = syscall.S_IFDIR | 0o555
	a.Uid, a.Gid = d.fs.cfg.Owner.Uid, d.fs.cfg.Owner.Gid
	a.Nlink = 2
	a.Ino = d.StableAttr().Ino
	setTimes(a, d.born)
}

func setTimes(a *fuse.Attr, t time.Time) {
	sec, nsec := uint64(t.Unix()), uint32(t.Nanosecond())
	a.Mtime, a.Ctime, a.Atime = sec, sec, sec
	a.Mtimensec, a.Ctimensec, a.Atimensec = nsec, nsec, nsec
}

func (d *pseudoDir) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.fill(&out.Attr)
	return 0
}

func (d *pseudoDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	list, err := d.fs.ctl.List(d.path)
	if err != nil {
		return nil, toErrno(d.fs.log, "lookup control "+d.path, err)
	}
	for _, pe := range list {
		if pe.Name != name {
			continue
		}
		p := path.Join(d.path, name)
		if pe.Dir {
			ch := d.NewInode(ctx, &pseudoDir{fs: d.fs, path: p, born: d.born}, fs.StableAttr{Mode: syscall.S_IFDIR})
			ch.Operations().(*pseudoDir).fill(&out.Attr)
			return ch, 0
		}
		data, err := d.fs.ctl.Read(p)
		if err != nil {
			return nil, toErrno(d.fs.log, "read control "+p, err)
		}
		// A new inode number every time: see the comment at the top.
		pf := &pseudoFile{fs: d.fs, path: p, writable: pe.Writable, data: data, born: time.Now()}
		ch := d.NewInode(ctx, pf, fs.StableAttr{Mode: syscall.S_IFREG})
		pf.fill(&out.Attr)
		out.Attr.Ino = ch.StableAttr().Ino
		out.SetAttrTimeout(d.fs.cfg.TTL) // the contents never change
		return ch, 0
	}
	return nil, syscall.ENOENT
}

func (d *pseudoDir) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	list, err := d.fs.ctl.List(d.path)
	if err != nil {
		return nil, toErrno(d.fs.log, "readdir control "+d.path, err)
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

// pseudoFile is one rendering of a control file. data never changes.
type pseudoFile struct {
	fs.Inode
	fs       *FS
	path     string
	writable bool
	data     []byte
	born     time.Time
}

var (
	_ = (fs.NodeGetattrer)((*pseudoFile)(nil))
	_ = (fs.NodeSetattrer)((*pseudoFile)(nil))
	_ = (fs.NodeOpener)((*pseudoFile)(nil))
	_ = (fs.NodeReader)((*pseudoFile)(nil))
	_ = (fs.NodeWriter)((*pseudoFile)(nil))
	_ = (fs.NodeFlusher)((*pseudoFile)(nil))
)

func (p *pseudoFile) fill(a *fuse.Attr) {
	a.Mode = syscall.S_IFREG | 0o444
	if p.writable {
		a.Mode = syscall.S_IFREG | 0o600 // the mounting user's only
		if p.fs.cfg.GroupWrite {
			a.Mode = syscall.S_IFREG | 0o660
		}
	}
	a.Uid, a.Gid = p.fs.cfg.Owner.Uid, p.fs.cfg.Owner.Gid
	a.Nlink = 1
	a.Ino = p.StableAttr().Ino
	a.Size = uint64(len(p.data))
	setTimes(a, p.born)
}

func (p *pseudoFile) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	p.fill(&out.Attr)
	out.SetTimeout(p.fs.cfg.TTL)
	return 0
}

// Setattr accepts the truncation that precedes "echo cmd > control" and
// leaves the rendering as it is; anything else is refused.
func (p *pseudoFile) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	const truncation = fuse.FATTR_SIZE | fuse.FATTR_FH | fuse.FATTR_LOCKOWNER | fuse.FATTR_MTIME |
		fuse.FATTR_MTIME_NOW | fuse.FATTR_CTIME | fuse.FATTR_ATIME | fuse.FATTR_ATIME_NOW
	sz, ok := in.GetSize()
	if !p.writable || !ok || sz != 0 || in.Valid&^truncation != 0 {
		return syscall.EPERM
	}
	p.fill(&out.Attr)
	out.Size = 0
	out.SetTimeout(0)
	return 0
}

func (p *pseudoFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY && !p.writable {
		return nil, 0, syscall.EACCES
	}
	return nil, 0, noOpen
}

func (p *pseudoFile) Flush(ctx context.Context, fh fs.FileHandle) syscall.Errno { return noOpen }

func (p *pseudoFile) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off >= int64(len(p.data)) {
		return readResult(nil), 0
	}
	return readResult(p.data[off:min(off+int64(len(dest)), int64(len(p.data)))]), 0
}

func (p *pseudoFile) Write(ctx context.Context, fh fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if !p.writable {
		return 0, syscall.EACCES
	}
	if err := p.fs.ctl.Write(p.path, data); err != nil {
		return 0, toErrno(p.fs.log, "write control "+p.path, err)
	}
	return uint32(len(data)), 0
}
