// Package fusefs exposes a dataset as a read-only FUSE filesystem.
//
// # Shape
//
// The tree mirrors the catalog. FS speaks go-fuse's raw protocol: a node
// ID is the catalog's inode number, so a request finds its entry by
// indexing the current snapshot, and the daemon keeps nothing per file the
// kernel has looked up (go-fuse's node API kept an inode object for each,
// several hundred bytes, and made one for every child a READDIRPLUS
// listed). Lookup counts matter only for the control tree below.
//
// A control directory (Config.ControlName, ".dlfs" by default) sits at the
// root. It never appears in a listing, because torchvision's ImageFolder
// would turn it into a class, but it resolves by name; its files come from
// a ControlPlane (control.go). Its node IDs lie above the catalog's.
//
// Each request is a thin translation: it turns the FUSE arguments into one
// call on the catalog snapshot, the Dataset or the ControlPlane, and turns
// the error into an errno in one place (errno.go). The methods go-fuse
// calls (observe.go) time each request for Config.Latency and log it to
// Config.AccessLog around the method that serves it.
//
// # Kernel caching
//
// The dataset is immutable while it is mounted (a rescan is explicit, and
// invalidates what changed), so entries and attributes are cached for
// Config.TTL, listings are cached (FOPEN_CACHE_DIR), and regular files are
// never opened (noOpen): the page cache is kept across opens, and a file
// read before is read again without any request reaching the daemon. A
// mount that uses passthrough (passthrough.go) answers OPEN instead, and
// the kernel reads a file held whole from its backing file.
// Control files get fresh contents on every open by another route
// (control.go). Push (push.go) stores a file's bytes in the page cache
// before it is read (FUSE_NOTIFY_STORE).
//
// # Mutations
//
// Every mutation of the dataset fails with EROFS; only the control file
// accepts writes.
package fusefs

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dlfs/dlfs/accesslog"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/latency"
	"github.com/dlfs/dlfs/source"
)

// Config configures the filesystem.
type Config struct {
	// ControlName is the name of the hidden control directory at the root.
	ControlName string // default ".dlfs"
	// TTL is how long the kernel caches entries and attributes.
	TTL time.Duration // default 1h
	// AllowOther lets users other than the mounter access the mount. The
	// kernel checks every access against the modes and owners shown
	// (default_permissions), which are SOURCE's.
	AllowOther bool
	// Owner is who owns the control directory and may write the control
	// file (the mounting user); with GroupWrite, so may its group Gid.
	Owner      Owner
	GroupWrite bool
	// ListingAttrs answers every listing with each entry's attributes
	// (READDIRPLUS), so that a walk that stats every file (ls -l, find,
	// du) needs no lookup per file. The kernel makes an inode for every
	// entry listed, which makes a plain listing (os.scandir, and so
	// torchvision's ImageFolder) several times slower. Off, the kernel asks
	// for attributes with a directory's first chunk only, and with later
	// chunks when lookups came between (READDIRPLUS_AUTO); ReadDirPlus
	// answers that first chunk with the dot entries alone.
	ListingAttrs bool
	// MaxRequest is the largest READ the kernel is asked to send, and its
	// read-ahead window: the loader's block size, so that an aligned read
	// lies in one block and is answered without a copy. go-fuse lowers it
	// to what the kernel allows (/proc/sys/fs/fuse/max_pages_limit pages;
	// 256, so 1 MiB, unless an administrator raised it).
	MaxRequest int // default 1 MiB
	// Passthrough serves files the Dataset holds whole from backing files
	// the kernel reads itself (passthrough.go), when the Dataset is a
	// Backer, the kernel offers it and the daemon may register them.
	// PassthroughOff says why it is off, for PassthroughStats.
	Passthrough    bool
	PassthroughOff string
	// Debug logs every FUSE request (very verbose).
	Debug bool
	// Latency receives each request's latency by operation (nil: not
	// measured), and AccessLog a line per request while someone reads it
	// (nil: none).
	Latency   *latency.Vec
	AccessLog *accesslog.Log
	Logger    *slog.Logger // nil: discard
}

// Owner is a user and group id.
type Owner struct{ Uid, Gid uint32 }

// DefaultConfig returns the defaults: the control directory belongs to
// the process's user and group.
func DefaultConfig() Config {
	return Config{ControlName: ".dlfs", TTL: time.Hour, MaxRequest: 1 << 20, Owner: Owner{uint32(os.Getuid()), uint32(os.Getgid())}}
}

// Dataset is what the filesystem serves.
type Dataset interface {
	// Snapshot returns the current catalog snapshot. It must not block.
	Snapshot() *catalog.Snapshot
	// ReadAt returns up to len(dest) bytes of e at off, as a slice of dest
	// or of an immutable cached buffer, for the process pid (0: unknown),
	// and the tier that served them (for the access log). It may block on
	// I/O.
	// ctx is done when the kernel interrupts the request (the reader
	// got a signal) or the mount goes away.
	ReadAt(ctx context.Context, e *catalog.Entry, dest []byte, off int64, pid uint32) ([]byte, string, error)
	// Source is SOURCE's path, for statfs.
	Source() string
}

// PseudoEntry is one name in the control directory tree.
type PseudoEntry struct {
	Name     string
	Dir      bool
	Writable bool
	// Pipe is a named pipe that the daemon writes into through the mount
	// (the access log); ControlPlane.Read is never asked for it.
	Pipe bool
}

// ControlPlane serves the control directory. Paths are slash-separated and
// relative to it ("" is the control directory itself).
type ControlPlane interface {
	// List returns the entries of a control directory, or an error
	// wrapping fs.ErrNotExist.
	List(dir string) ([]PseudoEntry, error)
	// Read returns the current contents of a control file.
	Read(path string) ([]byte, error)
	// Write applies data written to a control file. ctx is done when the
	// kernel interrupts the write (the writer got a signal).
	Write(ctx context.Context, path string, data []byte) error
}

// FS is the mounted filesystem. Safe for concurrent use.
type FS struct {
	fuse.RawFileSystem // ENOSYS for what a read-only view does not answer

	cfg  Config
	log  *slog.Logger
	hist [numOps]*latency.Histogram // by op; nil entries without Config.Latency
	alog *accesslog.Log
	data Dataset
	ctl  ControlPlane
	born time.Time // the control tree's times

	server *fuse.Server // set by Init, for notifications (mu)
	mnt    string       // where Mount mounted it, for Push (mu)

	mu     sync.Mutex
	pseudo pseudoTable           // the control tree's node IDs (mu)
	dirs   map[uint64]*dirHandle // open directories by handle (mu)
	nextFh uint64                // (mu)

	statfs statfsCall
	pt     passthrough
	own    ownOpens // the threads opening through the mount (Push)
	// ownThread tells the daemon's own requests (isOwnThread; tests
	// replace it, as they read through the mount from the daemon's
	// process).
	ownThread func(pid uint32) bool
}

// New returns a filesystem over data with the control directory served by
// ctl.
func New(cfg Config, data Dataset, ctl ControlPlane) *FS {
	def := DefaultConfig()
	if cfg.ControlName == "" {
		cfg.ControlName = def.ControlName
	}
	if cfg.TTL <= 0 {
		cfg.TTL = def.TTL
	}
	if cfg.MaxRequest <= 0 {
		cfg.MaxRequest = def.MaxRequest
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f := &FS{
		RawFileSystem: fuse.NewDefaultRawFileSystem(),
		cfg:           cfg, log: cfg.Logger, data: data, ctl: ctl, born: time.Now(), alog: cfg.AccessLog,
		pseudo: newPseudoTable(), dirs: map[uint64]*dirHandle{},
	}
	f.ownThread = f.isOwnThread
	if cfg.Latency != nil {
		for o := range numOps {
			f.hist[o] = cfg.Latency.With(opNames[o])
		}
	}
	return f
}

// MountOptions returns the go-fuse options the filesystem is designed for.
func (f *FS) MountOptions(fsname string) *fuse.MountOptions {
	o := &fuse.MountOptions{
		FsName:     fsname,
		Name:       "dlfs",
		AllowOther: f.cfg.AllowOther,
		// The kernel checks modes and owners itself, as for any local
		// file: other users get only what SOURCE's modes allow. Not
		// "ro": the kernel would refuse .dlfs/control's writes at the
		// open, before they reach us; the dataset refuses every write
		// itself (docs/design.md, a read-only dataset in a read-write
		// mount).
		Options:      []string{"default_permissions"},
		DirectMount:  true,
		MaxReadAhead: f.cfg.MaxRequest,
		MaxWrite:     f.cfg.MaxRequest,
		// Several readers miss at once: let the kernel queue enough
		// reads for the PFS to work in parallel.
		MaxBackground:        64,
		EnableSymlinkCaching: true,
		EnableAcl:            true, // SOURCE's POSIX ACLs, which the kernel asks for and enforces (xattr.go)
		Debug:                f.cfg.Debug,
		// go-fuse's own lines (--debug-fuse, its warnings) through our
		// logger, so --log-format json and --log-file cover them.
		Logger: slog.NewLogLogger(f.log.Handler(), slog.LevelInfo),
	}
	if !f.cfg.ListingAttrs {
		o.ExtraCapabilities = fuse.CAP_READDIRPLUS_AUTO
	}
	return o
}

// Mount mounts f at dir and starts serving. The caller owns the server:
// server.Unmount stops it.
func (f *FS) Mount(dir, fsname string) (*fuse.Server, error) {
	server, err := fuse.NewServer(f, dir, f.MountOptions(fsname))
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.mnt = dir
	f.mu.Unlock()
	go server.Serve()
	if err := server.WaitMount(); err != nil {
		_ = server.Unmount()
		return nil, err
	}
	f.passthroughOn() // decided now, for stats, rather than at the first open
	if n, err := SetReadAhead(dir, f.cfg.MaxRequest); err != nil {
		f.log.Info("fusefs: the kernel's read-ahead for the mount stays below MaxRequest; reads come in smaller requests", "window", n, "err", err)
	}
	return server, nil
}

// Init implements fuse.RawFileSystem.
func (f *FS) Init(s *fuse.Server) {
	f.mu.Lock()
	f.server = s
	f.mu.Unlock()
}

func (f *FS) String() string { return "dlfs" }

// Invalidate tells the kernel to forget what it cached about the entries a
// catalog refresh changed, so the next access sees the new snapshot. A
// notification about something the kernel never cached is refused by it
// and ignored here.
func (f *FS) Invalidate(d catalog.Diff) {
	f.mu.Lock()
	s := f.server
	f.mu.Unlock()
	if s == nil {
		return
	}
	forget := func(e *catalog.Entry, content bool) {
		if content {
			s.InodeNotify(e.Ino, 0, 0) // page cache (a directory's: its listing) and attributes
		}
		// A directory keeps its inode number across refreshes: the
		// parent's, old or new, is the one the kernel knows.
		if p := e.Parent(); p != nil {
			s.EntryNotify(p.Ino, e.Name)
			s.InodeNotify(p.Ino, 0, 0) // the cached listing
		}
	}
	for _, e := range d.Changed {
		forget(e, true)
	}
	for _, e := range d.Removed {
		forget(e, true)
	}
	for _, e := range d.Added {
		forget(e, false) // drops a cached negative entry
	}
}

// statFs reports SOURCE's filesystem (see statfsCall).
func (f *FS) statFs(cancel <-chan struct{}, out *fuse.StatfsOut) fuse.Status {
	st, err := f.statfs.get(cancel, f.data.Source())
	if err != nil {
		return fuse.Status(toErrno(f.log, "statfs", err))
	}
	out.FromStatfsT(&st)
	return fuse.OK
}

// statfsWait is how long a statfs request waits for SOURCE's answer
// before it is answered from the last one.
const statfsWait = 5 * time.Second

// statfsCall asks SOURCE's filesystem for its figures one call at a time,
// so that a PFS that hangs holds one goroutine, not one per df. A request
// waits for the call under way for statfsWait at most, then gets the last
// answer SOURCE gave (or ETIMEDOUT if it never gave one): df on a mount
// whose PFS hangs returns. The call's goroutine ends when the kernel
// answers it.
type statfsCall struct {
	wait    time.Duration // 0: statfsWait
	mu      sync.Mutex
	last    *syscall.Statfs_t // mu guards last, lastErr and busy: the last answer
	lastErr error             // the last call's error, if it failed
	busy    chan struct{}     // closed when the call under way ends; nil when none runs
}

func (c *statfsCall) get(cancel <-chan struct{}, path string) (syscall.Statfs_t, error) {
	c.mu.Lock()
	if c.busy == nil {
		busy := make(chan struct{})
		c.busy = busy
		go func() {
			var st syscall.Statfs_t
			err := source.IgnoringEINTR(func() error { return syscall.Statfs(path, &st) })
			c.mu.Lock()
			if c.lastErr = err; err == nil {
				c.last = &st
			}
			c.busy = nil
			c.mu.Unlock()
			close(busy)
		}()
	}
	busy := c.busy
	c.mu.Unlock()
	wait := c.wait
	if wait == 0 {
		wait = statfsWait
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-busy:
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.lastErr != nil {
			return syscall.Statfs_t{}, fmt.Errorf("statfs %s: %w", path, c.lastErr) // answered: an error is news
		}
		return *c.last, nil
	case <-timer.C:
	case <-cancel:
		return syscall.Statfs_t{}, syscall.EINTR
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		return syscall.Statfs_t{}, fmt.Errorf("statfs %s: %w", path, syscall.ETIMEDOUT)
	}
	return *c.last, nil
}

func setTimes(a *fuse.Attr, t time.Time) {
	sec, nsec := uint64(t.Unix()), uint32(t.Nanosecond())
	a.Mtime, a.Ctime, a.Atime = sec, sec, sec
	a.Mtimensec, a.Ctimensec, a.Atimensec = nsec, nsec, nsec
}

// readResult answers a read with b. go-fuse (v2.12) tries to splice any
// result that is not a vector: for bytes in memory that costs four wasted
// system calls per read (growing a pipe, writing the header into it,
// then draining it), which the vector's single writev avoids.
func readResult(b []byte) fuse.ReadResult { return fuse.ReadResultVector([][]byte{b}) }
