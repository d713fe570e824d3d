package fusefs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// fileNode is a regular file of the dataset. It needs no file handle: reads
// address the catalog entry directly.
type fileNode struct{ node }

var (
	_ = (fs.NodeOpener)((*fileNode)(nil))
	_ = (fs.NodeReader)((*fileNode)(nil))
	_ = (fs.NodeGetattrer)((*fileNode)(nil))
	_ = (fs.NodeSetattrer)((*fileNode)(nil))
)

func (f *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0 {
		return nil, 0, syscall.EROFS
	}
	if _, errno := f.entry(); errno != 0 {
		return nil, 0, errno
	}
	// The file cannot change while mounted (see the package doc), so the
	// page cache stays valid across opens, and a read-only file has nothing
	// to flush on close.
	return nil, fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH, 0
}

func (f *fileNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	e, errno := f.entry()
	if errno != 0 {
		return nil, errno
	}
	b, err := f.fs.data.ReadAt(e, dest, off)
	if err != nil {
		return nil, toErrno(f.fs.log, "read "+e.Path, err)
	}
	return fuse.ReadResultData(b), 0
}
