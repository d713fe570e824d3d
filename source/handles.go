package source

import (
	"container/list"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Open handles.
//
// A file read block by block would cost an open per block: a metadata
// round trip to the PFS for each MiB of a large sample. So ReadAt keeps
// the files it opened in a bounded cache, keyed by path and the Version
// checked at open, and reads them again through the same descriptor.
//
// A cached descriptor still reads the file it was opened on after a
// rename or unlink put another file (or none) at its path. So a read
// through a cached descriptor checks the path, not the descriptor, after
// the bytes (statx on the path, forcing the PFS client to ask): the
// version there must be the one the caller expects, inode included, or
// the read fails with ErrChanged and the handle is dropped. A fresh open
// needs no such care: it resolved the path just before.
//
// On NFS the check sees a rename by another client only once the client's
// cache of directory entries expires (a fresh open looks the name up
// again); what it returns is still the expected version's bytes.
//
// At most Config.Handles descriptors are kept. Only idle ones (no read in
// progress) are closed: at eviction, once idle for Config.HandleIdle, on
// DropHandles (a refresh) and on Close. A descriptor is never closed
// under a read, whose pread would then reach whatever file took its
// number.

// handleKey is what a cached descriptor was opened for.
type handleKey struct {
	path string
	v    Version
}

// handle is one cached descriptor.
type handle struct {
	key   handleKey
	fd    int
	refs  int           // reads in progress (handles.mu)
	used  time.Time     // when the last read ended (handles.mu)
	idle  *list.Element // in handles.idle while refs is 0
	stale bool          // dropped: closed by its last reader
}

// handles is the cache of open descriptors.
type handles struct {
	max     int
	idleFor time.Duration

	mu     sync.Mutex
	byKey  map[handleKey]*handle // mu guards all below
	idle   *list.List            // of *handle, least recently used first
	timer  *time.Timer           // closes idle handles; nil when none is armed
	closed bool
}

func newHandles(max int, idleFor time.Duration) *handles {
	return &handles{max: max, idleFor: idleFor, byKey: map[handleKey]*handle{}, idle: list.New()}
}

// get returns a cached descriptor for k, marked in use, or nil.
func (hs *handles) get(k handleKey) *handle {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	h := hs.byKey[k]
	if h == nil {
		return nil
	}
	if h.idle != nil {
		hs.idle.Remove(h.idle)
		h.idle = nil
	}
	h.refs++
	return h
}

// add caches fd, opened for k, in use by its caller. It returns nil (and
// the caller keeps fd to itself) when the cache is closed, full of busy
// descriptors, or already holds k.
func (hs *handles) add(k handleKey, fd int) *handle {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.closed || hs.max <= 0 || hs.byKey[k] != nil {
		return nil
	}
	for len(hs.byKey) >= hs.max {
		e := hs.idle.Front()
		if e == nil {
			return nil // all busy
		}
		hs.dropLocked(e.Value.(*handle))
	}
	h := &handle{key: k, fd: fd, refs: 1}
	hs.byKey[k] = h
	return h
}

// put ends a read on h. A handle that failed its check is dropped.
func (hs *handles) put(h *handle, failed bool) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	h.refs--
	if failed && !h.stale {
		hs.dropLocked(h) // closes it now if this was its last reader
		return
	}
	if h.stale {
		if h.refs == 0 {
			unix.Close(h.fd)
		}
		return
	}
	if h.refs == 0 {
		h.used = time.Now()
		h.idle = hs.idle.PushBack(h)
		hs.armLocked()
	}
}

// dropLocked takes h out of the cache; it is closed now if idle, else by
// its last reader.
func (hs *handles) dropLocked(h *handle) {
	delete(hs.byKey, h.key)
	h.stale = true
	if h.idle != nil {
		hs.idle.Remove(h.idle)
		h.idle = nil
	}
	if h.refs == 0 {
		unix.Close(h.fd)
	}
}

// armLocked makes sure a timer will close the idle handles in time.
func (hs *handles) armLocked() {
	if hs.timer == nil && hs.idle.Len() > 0 && hs.idleFor > 0 {
		hs.timer = time.AfterFunc(hs.idleFor, hs.expire)
	}
}

// expire closes the handles idle for idleFor and arms the timer again for
// the rest. It runs on its timer's goroutine; Close stops that timer.
func (hs *handles) expire() {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	hs.timer = nil
	if hs.closed {
		return
	}
	cutoff := time.Now().Add(-hs.idleFor)
	for e := hs.idle.Front(); e != nil; e = hs.idle.Front() {
		h := e.Value.(*handle)
		if h.used.After(cutoff) {
			hs.timer = time.AfterFunc(h.used.Sub(cutoff)+time.Millisecond, hs.expire)
			return
		}
		hs.dropLocked(h)
	}
}

// dropAll drops every handle (closing the idle ones now); with close,
// the cache takes no more.
func (hs *handles) dropAll(close bool) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	for _, h := range hs.byKey {
		hs.dropLocked(h)
	}
	if close {
		hs.closed = true
		if hs.timer != nil {
			hs.timer.Stop()
			hs.timer = nil
		}
	}
}

// open returns the number of cached descriptors, busy ones included.
func (hs *handles) open() int {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return len(hs.byKey)
}

// DropHandles closes every cached descriptor that no read uses, and has
// the others closed by their last reader: after a refresh, no descriptor
// opened before it is used again.
func (s *Source) DropHandles() { s.handles.dropAll(false) }

// checkPathAfter is checkVersionAfter on the path, for a read through a
// cached descriptor: a rename or an unlink since the open shows there,
// not on the descriptor. A path that no longer resolves is a change.
//
// The path is resolved as every open resolves it (openat2, beneath the
// root, no symlinks), to an O_PATH descriptor that reads nothing: a
// directory swapped for a symlink since the open is a change too.
func (s *Source) checkPathAfter(path string, want Version) error {
	fd, err := s.openBeneath(path, unix.O_PATH)
	if err == unix.ENOENT || err == unix.ENOTDIR || err == unix.ELOOP || err == unix.EXDEV {
		return fmt.Errorf("%w: %s is gone (%v); write 'refresh' to the control file", ErrChanged, path, err)
	}
	if err != nil {
		return fmt.Errorf("source: stat %s: %w", path, err)
	}
	defer unix.Close(fd)
	return checkVersionAfter(fd, path, want)
}
