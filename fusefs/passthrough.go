package fusefs

import (
	"os"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/catalog"
)

// Passthrough: a file the Dataset holds whole, in a sealed backing file
// (package backing), is opened with FOPEN_PASSTHROUGH and the backing
// file's id: the kernel then serves its reads, mmap and splice from the
// backing file, and no READ reaches the daemon until RELEASE.
//
// Passthrough needs OPEN, so a mount that uses it answers OPEN for every
// file instead of noOpen: a file without a backing file is opened with
// FOPEN_KEEP_CACHE, which keeps its page cache across opens as noOpen
// did. Whether the mount uses it is decided once, at the first OPEN (the
// kernel's answer to noOpen is for the whole connection): the kernel must
// offer CAP_PASSTHROUGH (Linux 6.9+, CONFIG_FUSE_PASSTHROUGH) and a
// backing file must register, which needs CAP_SYS_ADMIN. Otherwise the
// mount works as without it.
//
// The kernel gives an inode one backing file, shared by all its opens,
// and refuses (the open fails with EIO) a passthrough open of an inode
// open in caching mode, a caching open of an inode open for passthrough,
// and a second backing file while one is in use (libfuse #1125). So the
// mount keeps, per inode, the opens it answered either way and the
// backing id its passthrough opens share, and answers a new open the way
// the inode is open already. One consequence: an open made after a
// refresh changed the file, while an open of the old version is still
// open, shares the old version's backing file; it reads that version
// whole, never a mix, and the first open after the last of those is
// released gets the new one.
//
// The id is registered at the inode's first passthrough open. At its last
// RELEASE it stays registered (idle) while a keeper (the RAM tier) keeps
// the file, so that the next open, which the Dataset answers with the
// same file, costs no ioctl: an epoch opens each file once, and the two
// ioctls were an eighth of the daemon's CPU on small files. The open's
// reference goes at RELEASE all the same (an idle id holds no bytes
// against the open bound). When the keeper lets the file go (eviction,
// a refresh), its drop watcher unregisters the idle id at once, so the
// kernel holds no backing file the Dataset has dropped; an id that is
// not idle then goes at its last RELEASE, as does one whose file no
// keeper kept.
//
// The kernel may still send READ for a passthrough open (readahead(2),
// for one); it is answered from the open's backing file.

// BackingFile is a sealed file holding exactly one version of a file's
// bytes (package backing). Implementations must be comparable, and two
// answers of Backer.Backing that hold the same file compare equal: an
// idle id is reused only for its own file (==).
type BackingFile interface {
	// Fd is its descriptor, for the kernel to register.
	Fd() int
	// ReadAt reads its bytes.
	ReadAt(p []byte, off int64) (int, error)
	// Release drops the reference Backer.Backing gave.
	Release()
	// WatchDrop sets fn to run once when the Dataset's keeper lets the
	// file go, and reports false, setting nothing, when no keeper keeps
	// it (backing.File.WatchDrop). fn runs under the keeper's locks.
	WatchDrop(fn func()) bool
}

// Backer is a Dataset that can give the kernel backing files for
// passthrough.
type Backer interface {
	// Backing returns a backing file holding exactly e's bytes, with a
	// reference for the caller, or nil when it holds none. It may copy
	// bytes it holds into a new one; it must not read SOURCE.
	Backing(e *catalog.Entry) BackingFile
	// OpenedPassthrough reports an open of e, by process pid, that the
	// kernel serves from a backing file: no read of it will reach ReadAt.
	// It must not block.
	OpenedPassthrough(e *catalog.Entry, pid uint32)
}

// PassthroughStats tell whether the mount uses passthrough and how much.
type PassthroughStats struct {
	// On says whether the mount uses passthrough; Why, when it does not
	// (or before its first open decides).
	On  bool   `json:"on"`
	Why string `json:"why,omitempty"`
	// Opens counts opens served by passthrough, and Bytes the sizes of
	// the files they opened. Shared counts those that shared a backing
	// file already registered for the inode.
	Opens  int64 `json:"opens"`
	Bytes  int64 `json:"bytes"`
	Shared int64 `json:"shared_opens"`
	// Cached counts opens answered without passthrough: the file was not
	// held whole, or its inode was open that way already.
	Cached int64 `json:"cached_opens"`
	// Failed counts backing files the kernel refused to register.
	Failed int64 `json:"register_failures"`
	// Registered is the backing ids registered now: inodes open with
	// passthrough, and Idle of them, with no open, whose file the RAM
	// tier keeps. Reused counts first opens that found their inode's id
	// still registered.
	Registered int   `json:"registered"`
	Idle       int   `json:"registered_idle"`
	Reused     int64 `json:"reused_registrations"`
	// CachedNow is the opens answered in caching mode whose RELEASE has
	// not come yet: while an inode has one, its opens stay cached.
	CachedNow int `json:"cached_open_now"`
	// Reads counts READs of passthrough opens that reached the daemon
	// (the kernel reads such an open itself; readahead(2) may still ask).
	Reads int64 `json:"reads"`
}

// passthrough is the mount's passthrough state.
type passthrough struct {
	decide sync.Once

	mu sync.Mutex
	// mu guards the following.
	// INVARIANT: no inode has both cached and pt opens; an inode with pt
	// opens has its id registered and holds file; an inode with idle set
	// has no pt opens and its id registered for idle.
	on      bool
	why     string
	inodes  map[uint64]*inodeOpens
	handles map[uint64]*inodeOpens // passthrough opens by file handle
	nextFh  uint64
	stats   PassthroughStats
}

// inodeOpens is how an inode is open.
type inodeOpens struct {
	cached int // opens answered in caching mode, not yet released
	pt     int // opens answered with passthrough, not yet released
	id     int32
	file   BackingFile
	// idle is the file whose id stays registered with no passthrough
	// open (a keeper keeps it): nil otherwise.
	idle BackingFile
	// asking is closed when the open asking the Dataset for the inode's
	// backing file has answered: the inode's other first opens wait for
	// it, and then share its answer, instead of each asking (each would
	// hold the file's bytes against the Dataset's bound until it found
	// the first registered, and one turned away would make the inode
	// open cached, and every open after it).
	asking chan struct{}
}

// unused reports whether nothing holds io: no open, no open asking, no
// idle id. p.mu is held.
func (io *inodeOpens) unused() bool {
	return io.pt == 0 && io.cached == 0 && io.asking == nil && io.idle == nil
}

// ownOpens are the threads of this process opening a file through the
// mount (Push): the daemon's own opens are never consumption, and never
// make an inode's first passthrough open. Push locks its goroutine to its
// thread and marks the thread while it opens. (Looking for the caller in
// /proc/self/task took a third of a passthrough open's CPU.)
type ownOpens struct {
	mu   sync.Mutex
	tids map[uint32]int // (mu) threads opening, and how many opens each
}

// enter marks the calling thread as opening through the mount; the
// caller has locked its goroutine to the thread until leave.
func (o *ownOpens) enter() uint32 {
	tid := uint32(unix.Gettid())
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.tids == nil {
		o.tids = map[uint32]int{}
	}
	o.tids[tid]++
	return tid
}

func (o *ownOpens) leave(tid uint32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.tids[tid]--; o.tids[tid] <= 0 {
		delete(o.tids, tid)
	}
}

// isOwnThread reports whether pid, a request's caller (the thread's id, not
// the process's), is this process opening through the mount.
func (f *FS) isOwnThread(pid uint32) bool {
	if pid == uint32(os.Getpid()) {
		return true
	}
	o := &f.own
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.tids[pid] > 0
}

// passthroughOn decides, once, whether the mount uses passthrough, and
// reports it.
func (f *FS) passthroughOn() bool {
	p := &f.pt
	p.decide.Do(func() {
		on, why := f.probePassthrough()
		p.mu.Lock()
		p.on, p.why = on, why
		p.inodes, p.handles = map[uint64]*inodeOpens{}, map[uint64]*inodeOpens{}
		p.mu.Unlock()
		if on {
			f.log.Info("passthrough on: files held whole are read by the kernel from their backing files")
		} else {
			f.log.Info("passthrough off: every read goes through the daemon", "why", why)
		}
	})
	return p.on // written once, inside decide
}

// probePassthrough says whether passthrough can work here: configured,
// offered by the kernel, and a backing file registers.
func (f *FS) probePassthrough() (bool, string) {
	if !f.cfg.Passthrough {
		if f.cfg.PassthroughOff != "" {
			return false, f.cfg.PassthroughOff
		}
		return false, "turned off"
	}
	if _, ok := f.data.(Backer); !ok {
		return false, "the dataset holds no backing files"
	}
	s := f.fuseServer()
	if s == nil {
		return false, "not mounted"
	}
	if s.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH == 0 {
		return false, "the kernel does not offer FUSE passthrough (it needs Linux 6.9 or newer, built with CONFIG_FUSE_PASSTHROUGH)"
	}
	fd, err := unix.MemfdCreate("dlfs:probe", unix.MFD_CLOEXEC)
	if err != nil {
		return false, "memfd_create: " + err.Error()
	}
	defer unix.Close(fd)
	id, errno := s.RegisterBackingFd(&fuse.BackingMap{Fd: int32(fd)})
	switch {
	case errno == syscall.EPERM:
		return false, "the daemon runs without CAP_SYS_ADMIN, which registering a backing file needs (run it as root)"
	case errno != 0:
		return false, "the kernel refused a backing file: " + errno.Error()
	}
	if errno := s.UnregisterBackingFd(id); errno != 0 {
		f.log.Warn("passthrough: unregistering the probe's backing file failed", "err", errno)
	}
	return true, ""
}

// PassthroughStats returns the mount's passthrough state and counts.
func (f *FS) PassthroughStats() PassthroughStats {
	p := &f.pt
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stats
	st.On, st.Why = p.on, p.why
	if !p.on && p.why == "" {
		st.Why = "not decided yet: no file was opened"
	}
	st.Registered, st.Idle, st.CachedNow = 0, 0, 0
	for _, io := range p.inodes {
		st.CachedNow += io.cached
		switch {
		case io.pt > 0:
			st.Registered++
		case io.idle != nil:
			st.Registered++
			st.Idle++
		}
	}
	return st
}

// openRegular answers the OPEN of regular file e on a mount that uses
// passthrough: with e's backing file if the inode is open that way or the
// Dataset holds one, in caching mode otherwise.
func (f *FS) openRegular(in *fuse.OpenIn, e *catalog.Entry, out *fuse.OpenOut) fuse.Status {
	p := &f.pt
	caller := in.Caller.Pid
	own := f.ownThread(caller)
	var file BackingFile // asked for once, outside the lock: it may copy
	asked := false
	var mine chan struct{} // io.asking, while this open asks and answers
	var io *inodeOpens
	release := func() {
		if file != nil {
			file.Release()
		}
	}
	// answered ends this open's asking, if it asked; p.mu is held.
	answered := func() {
		if mine != nil {
			close(mine)
			io.asking, mine = nil, nil
		}
	}
	for {
		p.mu.Lock()
		io = p.inodes[e.Ino]
		if io == nil {
			io = &inodeOpens{}
			p.inodes[e.Ino] = io
		}
		switch {
		case io.pt > 0: // share the inode's backing file
			p.stats.Shared++
			f.answerPassthrough(io, e, out)
			answered()
			p.mu.Unlock()
			release()
			f.opened(e, caller, own)
			return fuse.OK
		case io.cached > 0 || own || asked && file == nil:
			answered()
			f.answerCached(io, out)
			release()
			return fuse.OK
		case io.asking != nil && mine == nil: // another open is asking
			ch := io.asking
			p.mu.Unlock()
			<-ch
			continue
		case !asked:
			mine = make(chan struct{})
			io.asking = mine
			p.mu.Unlock()
			file, asked = f.data.(Backer).Backing(e), true
			continue // the inode's opens may have changed meanwhile
		}
		// The inode's first passthrough open: reuse its idle id if the
		// Dataset answered with the same file, else register the file.
		if io.idle != nil {
			if io.idle == file {
				io.idle, io.file = nil, file
				p.stats.Reused++
				f.answerPassthrough(io, e, out)
				answered()
				p.mu.Unlock()
				f.opened(e, caller, own)
				return fuse.OK
			}
			f.unregisterLocked(io, e.Ino) // another file: a new version, or rebuilt
		}
		id, errno := f.fuseServer().RegisterBackingFd(&fuse.BackingMap{Fd: int32(file.Fd())})
		if errno != 0 {
			p.stats.Failed++
			answered()
			f.answerCached(io, out)
			release()
			f.log.Warn("passthrough: the kernel refused a backing file; reading through the daemon", "path", e.Path(), "err", errno)
			return fuse.OK
		}
		io.id, io.file = id, file
		f.answerPassthrough(io, e, out)
		answered()
		p.mu.Unlock()
		f.opened(e, caller, own)
		return fuse.OK
	}
}

// fuseServer is the server Init was given.
func (f *FS) fuseServer() *fuse.Server {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.server
}

// answerPassthrough counts an open of io with passthrough and fills its
// answer. p.mu is held.
func (f *FS) answerPassthrough(io *inodeOpens, e *catalog.Entry, out *fuse.OpenOut) {
	p := &f.pt
	io.pt++
	p.nextFh++
	p.handles[p.nextFh] = io
	p.stats.Opens++
	p.stats.Bytes += e.Size
	out.Fh = p.nextFh
	out.BackingID = io.id
	// Never FOPEN_DIRECT_IO (it turns passthrough off); the mount's own
	// page cache plays no part in a passthrough open.
	out.OpenFlags = fuse.FOPEN_PASSTHROUGH
}

// answerCached counts an open of io in caching mode, fills its answer and
// unlocks p.mu.
func (f *FS) answerCached(io *inodeOpens, out *fuse.OpenOut) {
	p := &f.pt
	io.cached++
	p.stats.Cached++
	p.mu.Unlock()
	// The page cache is kept across opens, as noOpen kept it: the dataset
	// is immutable while mounted, and a refresh invalidates what changed.
	out.OpenFlags = fuse.FOPEN_KEEP_CACHE
}

// opened reports a passthrough open to the Dataset, unless it is the
// daemon's own.
func (f *FS) opened(e *catalog.Entry, pid uint32, own bool) {
	if !own {
		f.data.(Backer).OpenedPassthrough(e, pid)
	}
}

// release forgets an open of a regular file: a passthrough open by its
// handle, a caching one (handle 0) by its inode. The inode's last
// passthrough open unregisters its backing file.
func (f *FS) release(in *fuse.ReleaseIn) {
	p := &f.pt
	p.mu.Lock()
	if p.inodes == nil {
		p.mu.Unlock()
		return
	}
	var drop BackingFile
	io := p.handles[in.Fh]
	switch {
	case in.Fh != 0 && io != nil:
		delete(p.handles, in.Fh)
		if io.pt--; io.pt == 0 {
			ino, file := in.NodeId, io.file
			if file.WatchDrop(func() { f.idleDropped(ino, file) }) {
				io.idle = file // the id stays registered while the keeper keeps the file
			} else {
				f.unregisterLocked(io, ino)
			}
			drop, io.file = file, nil
		}
	case in.Fh == 0:
		if io = p.inodes[in.NodeId]; io != nil && io.cached > 0 {
			io.cached--
		}
	}
	if io != nil && io.unused() && p.inodes[in.NodeId] == io {
		delete(p.inodes, in.NodeId)
	}
	p.mu.Unlock()
	if drop != nil {
		drop.Release()
	}
}

// idleDropped is the drop watcher of an idle id: the keeper let file go,
// so the kernel must too. It runs under the keeper's locks, and takes
// p.mu after them (nothing takes a keeper's lock under p.mu).
func (f *FS) idleDropped(ino uint64, file BackingFile) {
	p := &f.pt
	p.mu.Lock()
	defer p.mu.Unlock()
	if io := p.inodes[ino]; io != nil && io.idle == file {
		f.unregisterLocked(io, ino)
		if io.unused() {
			delete(p.inodes, ino)
		}
	}
}

// unregisterLocked unregisters io's backing id, idle or not. p.mu is held.
func (f *FS) unregisterLocked(io *inodeOpens, ino uint64) {
	if errno := f.fuseServer().UnregisterBackingFd(io.id); errno != 0 {
		f.log.Warn("passthrough: unregistering a backing file failed", "ino", ino, "err", errno)
	}
	io.idle, io.id = nil, 0
}

// passthroughRead answers a READ of a passthrough open from its backing
// file; ok is false for any other open.
func (f *FS) passthroughRead(in *fuse.ReadIn, buf []byte) (b []byte, ok bool, st fuse.Status) {
	if in.Fh == 0 {
		return nil, false, fuse.OK
	}
	p := &f.pt
	p.mu.Lock()
	io := p.handles[in.Fh]
	var file BackingFile
	if io != nil {
		file = io.file // held until the handle's release, which cannot overlap its reads
		p.stats.Reads++
	}
	p.mu.Unlock()
	if file == nil {
		return nil, false, fuse.OK
	}
	n, err := file.ReadAt(buf[:min(int(in.Size), len(buf))], int64(in.Offset))
	if err != nil {
		return nil, true, fuse.Status(toErrno(f.log, "read a backing file", err))
	}
	return buf[:n], true, fuse.OK
}

// UsesPassthrough says whether the mount opens files held whole with
// passthrough; false until the mount has decided (at mount).
func (f *FS) UsesPassthrough() bool {
	p := &f.pt
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.on
}
