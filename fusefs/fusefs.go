// Package fusefs exposes a dataset as a read-only FUSE filesystem.
//
// # Shape
//
// The tree mirrors the catalog: one node per directory, regular file and
// symlink, with the inode numbers the catalog assigns. A control directory
// (Config.ControlName, ".dlfs" by default) sits at the root. It never appears
// in a listing, because torchvision's ImageFolder would turn it into a
// class, but it resolves by name; its files come from a ControlPlane.
//
// Each FUSE method is a thin translation: it turns go-fuse arguments into
// one call on the catalog snapshot, the Reader or the ControlPlane, and
// turns the error into an errno in one place (errno.go).
//
// # Kernel caching
//
// The dataset is immutable while it is mounted (a rescan is explicit, and
// invalidates what changed), so entries and attributes are cached for
// Config.TTL, and regular files are never opened (file.go, noOpen): the
// page cache is kept across opens, and a file read before is read again
// without any request reaching the daemon. Control files get fresh contents
// on every open by another route (control.go).
//
// # Mutations
//
// Every mutation of the dataset fails with EROFS; only the control file
// accepts writes.
package fusefs

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dlfs/dlfs/catalog"
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
	// Debug logs every FUSE request (very verbose).
	Debug  bool
	Logger *slog.Logger // nil: discard
}

// Owner is a user and group id.
type Owner struct{ Uid, Gid uint32 }

// DefaultConfig returns the defaults: the control directory belongs to
// the process's user and group.
func DefaultConfig() Config {
	return Config{ControlName: ".dlfs", TTL: time.Hour, Owner: Owner{uint32(os.Getuid()), uint32(os.Getgid())}}
}

// Dataset is what the filesystem serves.
type Dataset interface {
	// Snapshot returns the current catalog snapshot. It must not block.
	Snapshot() *catalog.Snapshot
	// ReadAt returns up to len(dest) bytes of e at off, as a slice of dest
	// or of an immutable cached buffer, for the process pid (0: unknown).
	// It may block on I/O.
	ReadAt(e *catalog.Entry, dest []byte, off int64, pid uint32) ([]byte, error)
	// Source is SOURCE's path, for statfs.
	Source() string
}

// PseudoEntry is one name in the control directory tree.
type PseudoEntry struct {
	Name     string
	Dir      bool
	Writable bool
}

// ControlPlane serves the control directory. Paths are slash-separated and
// relative to it ("" is the control directory itself).
type ControlPlane interface {
	// List returns the entries of a control directory, or an error
	// wrapping fs.ErrNotExist.
	List(dir string) ([]PseudoEntry, error)
	// Read returns the current contents of a control file.
	Read(path string) ([]byte, error)
	// Write applies data written to a control file.
	Write(path string, data []byte) error
}

// FS is the mounted filesystem. Safe for concurrent use.
type FS struct {
	cfg  Config
	log  *slog.Logger
	data Dataset
	ctl  ControlPlane
	root *dirNode
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
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f := &FS{cfg: cfg, log: cfg.Logger, data: data, ctl: ctl}
	f.root = &dirNode{node: node{fs: f, ino: catalog.RootIno}}
	return f
}

// Root returns the root node, for fs.Mount or fs.NewNodeFS.
func (f *FS) Root() fs.InodeEmbedder { return f.root }

// Options returns the go-fuse options the filesystem is designed for.
func (f *FS) Options(fsname string) *fs.Options {
	// No NegativeTimeout: a name missing now (a job's control directory)
	// may exist a moment later.
	return &fs.Options{
		MountOptions: fuse.MountOptions{
			FsName:     fsname,
			Name:       "dlfs",
			AllowOther: f.cfg.AllowOther,
			// The kernel checks modes and owners itself, as for any local
			// file: other users get only what SOURCE's modes allow.
			Options:      []string{"default_permissions"},
			DirectMount:  true,
			MaxReadAhead: 1 << 20,
			MaxWrite:     1 << 20,
			// Several readers miss at once: let the kernel queue enough
			// reads for the PFS to work in parallel.
			MaxBackground:        64,
			EnableSymlinkCaching: true,
			// The kernel otherwise asks for security.capability on every write
			// and for ACLs on access checks.
			IgnoreSecurityLabels: true,
			Debug:                f.cfg.Debug,
		},
		RootStableAttr: &fs.StableAttr{Ino: catalog.RootIno},
	}
}

// Mount mounts f at dir and starts serving. The caller owns the server:
// server.Unmount stops it.
func (f *FS) Mount(dir, fsname string) (*fuse.Server, error) {
	return fs.Mount(dir, f.root, f.Options(fsname))
}

// Invalidate tells the kernel to forget what it cached about the entries a
// catalog refresh changed, so the next access sees the new snapshot.
func (f *FS) Invalidate(d catalog.Diff) {
	forget := func(e *catalog.Entry, content bool) {
		parent, child := f.find(e.Path)
		if content && child != nil {
			child.NotifyContent(0, 0) // page cache (a directory's: its listing) and attributes
		}
		if parent != nil {
			parent.NotifyEntry(e.Name)
			parent.NotifyContent(0, 0) // the cached listing
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

// find returns the kernel-known inodes of path's parent and of path itself;
// either is nil if the kernel never looked it up, and then has nothing
// cached to forget.
func (f *FS) find(path string) (parent, child *fs.Inode) {
	cur := f.root.EmbeddedInode()
	for _, name := range strings.Split(path, "/") {
		if cur == nil {
			return nil, nil
		}
		parent, cur = cur, cur.GetChild(name)
	}
	return parent, cur
}

// node is what every dataset node shares: the filesystem and its inode
// number in the catalog.
type node struct {
	fs.Inode
	fs  *FS
	ino uint64
}

// entry returns the node's current catalog entry.
func (n *node) entry() (*catalog.Entry, syscall.Errno) {
	if e := n.fs.data.Snapshot().ByIno(n.ino); e != nil {
		return e, 0
	}
	return nil, syscall.ESTALE // removed by a refresh
}

func (n *node) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	e, errno := n.entry()
	if errno != 0 {
		return errno
	}
	fillAttr(e, &out.Attr)
	out.SetTimeout(n.fs.cfg.TTL)
	return 0
}

func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return syscall.EROFS
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return syscall.EROFS
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno { return syscall.EROFS }

func fillAttr(e *catalog.Entry, a *fuse.Attr) {
	a.Ino = e.Ino
	a.Mode = e.Mode
	a.Size = uint64(e.Size)
	a.Blocks = (a.Size + 511) / 512
	a.Blksize = 4096
	a.Nlink = 1
	if e.IsDir() {
		a.Nlink = 2
	}
	a.Uid, a.Gid = e.Uid, e.Gid
	sec, nsec := uint64(e.Mtime/1e9), uint32(e.Mtime%1e9)
	a.Mtime, a.Mtimensec = sec, nsec
	a.Ctime, a.Ctimensec = sec, nsec
	a.Atime, a.Atimensec = sec, nsec
}

// child makes (or finds) the inode for catalog entry e under parent.
func (f *FS) child(ctx context.Context, parent *fs.Inode, e *catalog.Entry, out *fuse.EntryOut) *fs.Inode {
	fillAttr(e, &out.Attr)
	out.SetEntryTimeout(f.cfg.TTL)
	out.SetAttrTimeout(f.cfg.TTL)
	var emb fs.InodeEmbedder
	switch {
	case e.IsDir():
		emb = &dirNode{node{fs: f, ino: e.Ino}}
	case e.IsSymlink():
		emb = &linkNode{node{fs: f, ino: e.Ino}}
	default:
		emb = &fileNode{node{fs: f, ino: e.Ino}}
	}
	return parent.NewInode(ctx, emb, fs.StableAttr{Mode: e.Mode & syscall.S_IFMT, Ino: e.Ino})
}
