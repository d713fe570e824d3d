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

// noOpen is the answer to OPEN and FLUSH of regular files. ENOSYS tells the
// kernel (FUSE_NO_OPEN_SUPPORT, Linux 4.19+) never to send OPEN, RELEASE or
// FLUSH again on this mount, and to keep the page cache across opens
// (FOPEN_KEEP_CACHE is implied). A file whose pages are cached is then read
// with no round trip to the daemon at all: a second epoch runs at page-cache
// speed instead of paying three requests per file. The price is that the
// daemon does not see opens, only reads of uncached pages; an open for
// writing succeeds, and its writes fail with EROFS.
const noOpen = syscall.ENOSYS

var (
	_ = (fs.NodeOpener)((*fileNode)(nil))
	_ = (fs.NodeReader)((*fileNode)(nil))
	_ = (fs.NodeGetattrer)((*fileNode)(nil))
	_ = (fs.NodeSetattrer)((*fileNode)(nil))
	_ = (fs.NodeFlusher)((*fileNode)(nil))
	_ = (fs.NodeWriter)((*fileNode)(nil))
)

func (f *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0 {
		return nil, 0, syscall.EROFS
	}
	return nil, 0, noOpen
}

func (f *fileNode) Flush(ctx context.Context, fh fs.FileHandle) syscall.Errno { return noOpen }

func (f *fileNode) Write(ctx context.Context, fh fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	return 0, syscall.EROFS
}

func (f *fileNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	e, errno := f.entry()
	if errno != 0 {
		return nil, errno
	}
	var pid uint32
	if c, ok := fuse.FromContext(ctx); ok {
		pid = c.Pid
	}
	b, err := f.fs.data.ReadAt(e, dest, off, pid)
	if err != nil {
		return nil, toErrno(f.fs.log, "read "+e.Path, err)
	}
	return readResult(b), 0
}

// readResult answers a read with b. go-fuse (v2.12) tries to splice any
// result that is not a vector: for bytes in memory that costs four wasted
// system calls per read (growing a pipe, writing the header into it,
// then draining it), which the vector's single writev avoids.
func readResult(b []byte) fuse.ReadResult { return fuse.ReadResultVector([][]byte{b}) }
