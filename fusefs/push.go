package fusefs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/catalog"
)

// Pushing: the daemon writes a sample's bytes into the kernel's page cache
// (FUSE_NOTIFY_STORE) before the reader asks, so that the read is a
// page-cache hit with no round trip to the daemon.
//
// The kernel accepts a store only for an inode it knows, and it knows only
// what a lookup or a READDIRPLUS answered and has not forgotten. Push
// therefore opens the file through the mount itself: the open resolves the
// path (a LOOKUP this daemon answers, unless the kernel has the entry
// cached, as it has for any file read before) and holds the inode while
// the bytes are stored. Regular files are never opened on the daemon's
// side (noOpen), so the open costs no request of its own. The same open
// asks the kernel how much of the file it caches already (cachestat,
// Linux 6.5+): a file the page cache holds whole is not stored again.

// ErrNoMount is returned by Push when the filesystem is not mounted.
var ErrNoMount = errors.New("fusefs: not mounted")

// Push stores e's bytes in the kernel's page cache: block i (of blockSize
// bytes) comes from block(i), which reports false when it has no intact
// copy. It returns the bytes it stored; 0 and no error when the page cache
// held all of e already. An error means the kernel refused the store or e
// could not be opened: the reader then reads through the daemon as it
// would have anyway.
//
// A store that races a refresh changing e is undone: after storing, Push
// checks that e is still the snapshot's entry for its inode number, and
// drops the pages if not (a refresh swaps the snapshot before it
// invalidates the kernel's caches, so one of the two sees the other).
func (f *FS) Push(e *catalog.Entry, blockSize int64, block func(i int64) ([]byte, bool)) (int64, error) {
	f.mu.Lock()
	s, mnt := f.server, f.mnt
	f.mu.Unlock()
	if s == nil || mnt == "" {
		return 0, ErrNoMount
	}
	if e.IsDir() || e.IsSymlink() {
		return 0, fmt.Errorf("fusefs: push %s: not a regular file", e.Path())
	}
	if blockSize <= 0 {
		return 0, fmt.Errorf("fusefs: push %s: block size %d; it must be positive", e.Path(), blockSize)
	}
	path := filepath.Join(mnt, e.Path())
	// A raw open, not os.Open: os.Open registers the descriptor with the
	// runtime's poller, whose epoll_ctl asks the file for POLL while
	// holding a P; the request comes to this process, and with every P so
	// held nothing would answer it.
	// On a thread marked as the daemon's own while it opens (ownOpens).
	runtime.LockOSThread()
	tid := f.own.enter()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	f.own.leave(tid)
	runtime.UnlockOSThread()
	if err != nil {
		return 0, fmt.Errorf("fusefs: push %s: open through the mount: %w", e.Path(), err)
	}
	defer unix.Close(fd)
	if e.Size == 0 {
		return 0, nil
	}
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(fd), &unix.CachestatRange{Off: 0, Len: uint64(e.Size)}, &cs, 0); err == nil &&
		int64(cs.Cache) >= e.Size/pageSize+min(e.Size%pageSize, 1) {
		return 0, nil // cached whole already
	}
	var stored int64
	for off := int64(0); off < e.Size; off += blockSize {
		b, ok := block(off / blockSize)
		if !ok {
			return stored, fmt.Errorf("fusefs: push %s: block %d is not cached", e.Path(), off/blockSize)
		}
		if want := min(blockSize, e.Size-off); int64(len(b)) != want {
			return stored, fmt.Errorf("fusefs: push %s: block %d has %d bytes, want %d", e.Path(), off/blockSize, len(b), want)
		}
		if st := s.InodeNotifyStoreCache(e.Ino, off, b); !st.Ok() {
			return stored, fmt.Errorf("fusefs: push %s: the kernel refused the store: %w", e.Path(), syscall.Errno(st))
		}
		stored += int64(len(b))
	}
	if cur := f.data.Snapshot().ByIno(e.Ino); cur == nil || cur.Version() != e.Version() {
		s.InodeNotify(e.Ino, 0, 0)
		return 0, fmt.Errorf("fusefs: push %s: changed at the source meanwhile; dropped again", e.Path())
	}
	return stored, nil
}

var pageSize = int64(os.Getpagesize())
