package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/fusefs"
)

// The FUSE floor (scale suite): a filesystem that shows the same tree as
// SOURCE, two levels deep, and answers every read with zeros from one
// buffer, mounted with dlfs's options (no OPEN, no FLUSH, entries and
// attributes cached for an hour). It does nothing a cache could skip, so
// an epoch through it with the page cache dropped is what one READ round
// trip per file costs on this machine: the most any FUSE filesystem that
// serves the bytes itself can reach. It runs in its own process, as dlfs
// does (dlfsbench -serve-floor MNT -floor-src SOURCE), and says "mounted"
// on stdout when ready.
//
// With -floor-passthrough it is the per-open floor of passthrough: OPEN is
// answered with FOPEN_PASSTHROUGH on a memory file of the file's size,
// filled with zeros and registered once per file, kept for the mount's
// life; no READ reaches it. An epoch through it is what OPEN and RELEASE
// cost per file: the most a filesystem serving its files by passthrough
// can reach.

// floorFS is a read-only tree of directories of files, by inode number:
// 1 is the root, then the directories, then the files.
type floorFS struct {
	fuse.RawFileSystem
	names []map[string]uint64 // children of directory inode i (index i-1)
	sizes []int64             // sizes by inode (directories: 0)
	dirs  int                 // inodes 1..dirs are directories
	zeros []byte

	// With passthrough: the server, and each file's backing id once made.
	passthrough bool
	server      *fuse.Server
	mu          sync.Mutex
	backing     map[uint64]int32 // (mu) by inode
}

func newFloorFS(src string) (*floorFS, error) {
	f := &floorFS{RawFileSystem: fuse.NewDefaultRawFileSystem(), zeros: make([]byte, 1<<20)}
	classes, err := os.ReadDir(src)
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	f.dirs = 1 + len(classes)
	f.names = make([]map[string]uint64, f.dirs)
	f.names[0] = map[string]uint64{}
	f.sizes = make([]int64, f.dirs+1)
	next := uint64(f.dirs + 1)
	for i, c := range classes {
		if !c.IsDir() {
			return nil, fmt.Errorf("floor: %s: want only directories at the top", c.Name())
		}
		dir := uint64(2 + i)
		f.names[0][c.Name()] = dir
		files, err := os.ReadDir(filepath.Join(src, c.Name()))
		if err != nil {
			return nil, fmt.Errorf("floor: %w", err)
		}
		m := make(map[string]uint64, len(files))
		for _, e := range files {
			fi, err := e.Info()
			if err != nil {
				return nil, fmt.Errorf("floor: %w", err)
			}
			m[e.Name()] = next
			f.sizes = append(f.sizes, fi.Size())
			next++
		}
		f.names[dir-1] = m
	}
	return f, nil
}

func (f *floorFS) fill(ino uint64, a *fuse.Attr) {
	a.Ino = ino
	a.Nlink = 1
	a.Mode = syscall.S_IFREG | 0o644
	if ino <= uint64(f.dirs) {
		a.Mode, a.Nlink = syscall.S_IFDIR|0o755, 2
	} else {
		a.Size = uint64(f.sizes[ino])
		a.Blocks = (a.Size + 511) / 512
	}
	a.Blksize = 4096
}

func (f *floorFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	if h.NodeId > uint64(f.dirs) {
		return fuse.Status(syscall.ENOTDIR)
	}
	ino, ok := f.names[h.NodeId-1][name]
	if !ok {
		return fuse.ENOENT
	}
	out.NodeId = ino
	f.fill(ino, &out.Attr)
	out.SetEntryTimeout(time.Hour)
	out.SetAttrTimeout(time.Hour)
	return fuse.OK
}

func (f *floorFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	if in.NodeId == 0 || in.NodeId >= uint64(len(f.sizes)) {
		return fuse.ENOENT
	}
	f.fill(in.NodeId, &out.Attr)
	out.SetTimeout(time.Hour)
	return fuse.OK
}

func (f *floorFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if !f.passthrough {
		return fuse.ENOSYS // no_open, as dlfs
	}
	if in.NodeId <= uint64(f.dirs) || in.NodeId >= uint64(len(f.sizes)) {
		return fuse.Status(syscall.EISDIR)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	id, ok := f.backing[in.NodeId]
	if !ok {
		fd, err := unix.MemfdCreate("floor", unix.MFD_CLOEXEC)
		if err != nil {
			return fuse.ToStatus(err)
		}
		for off := int64(0); off < f.sizes[in.NodeId]; off += int64(len(f.zeros)) {
			n := min(int64(len(f.zeros)), f.sizes[in.NodeId]-off)
			if _, err := unix.Pwrite(fd, f.zeros[:n], off); err != nil {
				unix.Close(fd)
				return fuse.ToStatus(err)
			}
		}
		var errno syscall.Errno
		if id, errno = f.server.RegisterBackingFd(&fuse.BackingMap{Fd: int32(fd)}); errno != 0 {
			unix.Close(fd)
			return fuse.Status(errno)
		}
		f.backing[in.NodeId] = id // the kernel holds the file: fd may go
		unix.Close(fd)
	}
	out.Fh, out.BackingID, out.OpenFlags = in.NodeId, id, fuse.FOPEN_PASSTHROUGH
	return fuse.OK
}

func (f *floorFS) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {}

func (f *floorFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	return fuse.ENOSYS // no_flush, as dlfs
}

func (f *floorFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	if in.NodeId <= uint64(f.dirs) || in.NodeId >= uint64(len(f.sizes)) {
		return nil, fuse.Status(syscall.EISDIR)
	}
	size := f.sizes[in.NodeId]
	off := min(int64(in.Offset), size)
	n := min(int64(in.Size), size-off, int64(len(f.zeros)))
	return fuse.ReadResultVector([][]byte{f.zeros[:n]}), fuse.OK
}

// serveFloor mounts the floor over mnt and serves until SIGTERM or SIGINT;
// with passthrough, it is the per-open floor.
func serveFloor(src, mnt string, passthrough bool) error {
	f, err := newFloorFS(src)
	if err != nil {
		return err
	}
	f.passthrough, f.backing = passthrough, map[uint64]int32{}
	server, err := fuse.NewServer(f, mnt, &fuse.MountOptions{
		FsName: "floor", Name: "floor", DirectMount: true,
		MaxReadAhead: 1 << 20, MaxWrite: 1 << 20, MaxBackground: 64,
		IgnoreSecurityLabels: true, ExtraCapabilities: fuse.CAP_READDIRPLUS_AUTO,
	})
	if err != nil {
		return fmt.Errorf("floor: mount %s: %w", mnt, err)
	}
	f.server = server
	go server.Serve()
	if err := server.WaitMount(); err != nil {
		return fmt.Errorf("floor: mount %s: %w", mnt, err)
	}
	// Mounted as dlfs is: its read-ahead window raised as dlfs raises its own.
	if _, err := fusefs.SetReadAhead(mnt, 1<<20); err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
	}
	fmt.Println("mounted")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return server.Unmount()
}
