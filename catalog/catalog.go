// Package catalog is the in-memory index of a dataset directory (SOURCE).
//
// # Concepts
//
// A Catalog holds one immutable Snapshot of SOURCE's metadata: every
// directory, regular file and symlink, with its name, mode, owner, size and
// mtime. Other file types (sockets, fifos, devices) are left out: they are
// not training data and dlfs never opens them.
//
// # Lifetimes
//
// A Snapshot is built by a parallel scan (Open, Refresh) and never changes
// afterwards, so readers use it without locks. Refresh builds a new Snapshot
// and swaps it in atomically; holders of the old one keep a consistent view.
// Inode numbers are stable across refreshes for paths whose type did not
// change, so the kernel's caches stay valid for unchanged files.
//
// # Faults
//
// A rescan never takes an error for an answer: a directory it cannot read,
// or an entry it cannot stat, keeps what the last snapshot had of it, and
// is named in the new one (Unreadable). The directory holding it keeps
// the ctime the last snapshot had (distrust): a Revalidate must not trust
// its times of now for a listing not all read now. A rescan that hears
// nothing from SOURCE for Config.StallTimeout, or whose context ends, is
// given up and cancelled; the current snapshot stays, and only the calls
// stuck in the kernel (at most ScanWorkers) stay behind.
//
// # Identity
//
// A file's identity is its relative path plus its source.Version (size,
// mtime, ctime, inode). Caches key samples by path and check the identity
// on every hit: a file that changed in SOURCE is a miss, never stale bytes.
package catalog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/source"
)

// RootIno is the inode number of SOURCE's root directory.
const RootIno = 1

// Config configures a Catalog.
type Config struct {
	// Source is the dataset directory. Required.
	Source string
	// ScanWorkers bounds the directories scanned at once. On a PFS each
	// readdir and lstat is a round trip, so more workers hide latency.
	ScanWorkers int // default 32
	// Hide names entries at the root that the view must not show (the
	// control directory); they are skipped by the scan.
	Hide []string
	// Lister, if set, lists the dataset instead of a scan of Source as a
	// directory tree: a packed dataset shows the tree it holds.
	Lister Lister
	// MaxEntries bounds the entries the catalog holds: each costs a few
	// hundred bytes of RAM, and a crafted container can claim billions.
	MaxEntries int // default DefaultMaxEntries
	// Saved, if set, is where the snapshot is saved (Save), and where Open
	// looks first: a saved snapshot of the same Identity, intact, is used
	// instead of a scan. Not for a Lister's datasets.
	Saved    string
	Identity string // the dataset's identity, bound into the saved file
	// StallTimeout ends a scan that has read nothing of SOURCE for this
	// long (a PFS that stopped answering): it fails, and the current
	// snapshot stays. The goroutines stuck in the kernel are left there,
	// at most ScanWorkers of them.
	StallTimeout time.Duration // default 1 minute
	// Now is the clock a scan's start (Snapshot.Scanned) is read from:
	// Revalidate trusts a directory's times only if they are a minute
	// (racy) before the last scan's start.
	Now func() time.Time // default time.Now
	// Logger receives warnings about entries that could not be scanned.
	Logger *slog.Logger // nil: discard
}

// DefaultMaxEntries is the default Config.MaxEntries.
const DefaultMaxEntries = 16 << 20

// ErrTooMany means SOURCE holds more entries than Config.MaxEntries.
var ErrTooMany = errors.New("catalog: too many entries")

// Lister lists a dataset that is not a plain directory tree.
type Lister interface {
	List(ctx context.Context) ([]File, error)
}

// File is one entry a Lister reports: a regular file, a directory or a
// symlink at a slash-separated path. Directories above a path that are
// not listed are made, with mode 0755. A directory listed more than once
// takes its last line; of another path listed more than once, one line
// is kept and the others are skipped.
type File struct {
	Path   string
	Mode   uint32 // syscall.S_IF* type bits | permission bits
	Size   int64
	Mtime  int64 // nanoseconds
	Target string
	// Ctime and Ino complete the sample's source.Version: what changes
	// when its bytes do (the container's ctime and inode, or the
	// record's checksum).
	Ctime int64
	Ino   uint64
}

// DefaultConfig returns the defaults for source.
func DefaultConfig(source string) Config {
	return Config{Source: source, ScanWorkers: 32, StallTimeout: time.Minute, Now: time.Now}
}

// AddSize is total+size for sizes of SOURCE's files (not negative), or
// the largest int64 where that overflows: sparse files may claim 2^63
// bytes each.
func AddSize(total, size int64) int64 {
	if size > math.MaxInt64-total {
		return math.MaxInt64
	}
	return total + size
}

// ErrStalled means a scan read nothing of SOURCE for Config.StallTimeout.
var ErrStalled = errors.New("catalog: SOURCE stopped answering")

// maxUnreadable bounds the paths a snapshot lists in Unreadable.
const maxUnreadable = 32

// Entry is one directory, regular file or symlink. It is immutable and safe
// for concurrent use.
//
// Memory is what bounds a catalog of 10 M files, so an entry holds no
// path: Path walks up the parents. A directory's children are one array
// of entries (one allocation per directory, no pointer per child), and
// their names share one buffer.
type Entry struct {
	Name   string // base name; "" for the root
	Ino    uint64
	Size   int64
	Mtime  int64  // nanoseconds since the epoch
	Ctime  int64  // nanoseconds since the epoch; with SrcIno, completes Version (a directory's: see distrust)
	SrcIno uint64 // the inode number in SOURCE (Ino is the view's)
	Mode   uint32 // syscall.S_IF* type bits | permission bits
	owner  uint32 // an index into owners: Uid, Gid

	parent *Entry
	more   *more // directories and symlinks
}

// more is what only directories and symlinks have.
type more struct {
	kids   []Entry // a directory's, sorted by Name
	target string  // a symlink's
}

// At returns a detached entry like e at path, under directories made for
// it: for tests and tools that need an entry outside any snapshot.
func At(path string, e Entry) *Entry {
	var dir *Entry = &Entry{Mode: syscall.S_IFDIR | 0o755}
	parts := strings.Split(path, "/")
	for _, name := range parts[:len(parts)-1] {
		dir = &Entry{Name: name, Mode: syscall.S_IFDIR | 0o755, parent: dir}
	}
	e.Name, e.parent = parts[len(parts)-1], dir
	return &e
}

// Path is e's slash-separated path relative to SOURCE; "" for the root.
func (e *Entry) Path() string {
	if e.parent == nil {
		return ""
	}
	n := -1
	for p := e; p.parent != nil; p = p.parent {
		n += len(p.Name) + 1
	}
	b := make([]byte, n)
	i := n
	for p := e; p.parent != nil; p = p.parent {
		i -= len(p.Name)
		copy(b[i:], p.Name)
		if i > 0 {
			i--
			b[i] = '/'
		}
	}
	return unsafe.String(&b[0], n)
}

// Parent returns the directory holding e, or nil for the root.
func (e *Entry) Parent() *Entry { return e.parent }

// Target is a symlink's target; "" for anything else.
func (e *Entry) Target() string {
	if e.more == nil {
		return ""
	}
	return e.more.target
}

// IsDir reports whether e is a directory.
func (e *Entry) IsDir() bool { return e.Mode&syscall.S_IFMT == syscall.S_IFDIR }

// IsRegular reports whether e is a regular file.
func (e *Entry) IsRegular() bool { return e.Mode&syscall.S_IFMT == syscall.S_IFREG }

// IsSymlink reports whether e is a symlink.
func (e *Entry) IsSymlink() bool { return e.Mode&syscall.S_IFMT == syscall.S_IFLNK }

// NumChildren is how many entries directory e holds.
func (e *Entry) NumChildren() int {
	if e.more == nil {
		return 0
	}
	return len(e.more.kids)
}

// ChildAt returns child i of directory e in name order.
func (e *Entry) ChildAt(i int) *Entry { return &e.more.kids[i] }

// Children returns the entries of a directory in name order.
func (e *Entry) Children() iter.Seq[*Entry] {
	return func(yield func(*Entry) bool) {
		for i := 0; i < e.NumChildren(); i++ {
			if !yield(&e.more.kids[i]) {
				return
			}
		}
	}
}

// Child returns the entry called name in directory e, or nil.
func (e *Entry) Child(name string) *Entry {
	n := e.NumChildren()
	i := sort.Search(n, func(i int) bool { return e.more.kids[i].Name >= name })
	if i < n && e.more.kids[i].Name == name {
		return &e.more.kids[i]
	}
	return nil
}

// Version is the version of the file's bytes that e describes.
func (e *Entry) Version() source.Version {
	return source.Version{Size: e.Size, Mtime: e.Mtime, Ctime: e.Ctime, Ino: e.SrcIno}
}

// Snapshot is an immutable view of SOURCE at one scan.
type Snapshot struct {
	Root     *Entry
	Files    int
	Dirs     int
	Bytes    int64 // total size of regular files
	ScanTime time.Duration
	Skipped  int       // entries that could not be scanned or are not mirrored
	Reused   int       // directories kept unread from the previous snapshot (Revalidate)
	Scanned  time.Time // when the scan that made it began
	// UnreadableEntries counts the directories and entries the scan could
	// not read; the first of them (up to 32) are listed in Unreadable.
	// Each keeps what the previous snapshot had of it, if anything.
	UnreadableEntries int
	Unreadable        []string

	byIno []*Entry // indexed by Ino; holes are nil
}

// ByIno returns the entry with inode number ino, or nil.
func (s *Snapshot) ByIno(ino uint64) *Entry {
	if ino < uint64(len(s.byIno)) {
		return s.byIno[ino]
	}
	return nil
}

// Lookup returns the entry at the slash-separated relative path, or nil.
func (s *Snapshot) Lookup(path string) *Entry {
	e := s.Root
	for _, name := range strings.Split(path, "/") {
		if name == "" || name == "." {
			continue
		}
		if e = e.Child(name); e == nil {
			return nil
		}
	}
	return e
}

// Walk calls fn for every entry in path order, parents before children.
func (s *Snapshot) Walk(fn func(*Entry)) {
	var walk func(*Entry)
	walk = func(e *Entry) {
		fn(e)
		for i := 0; i < e.NumChildren(); i++ {
			walk(&e.more.kids[i])
		}
	}
	walk(s.Root)
}

// count sets Files, Dirs and Bytes.
func (s *Snapshot) count() {
	s.Walk(func(e *Entry) {
		switch {
		case e.IsDir():
			s.Dirs++
		case e.IsRegular():
			s.Files++
			s.Bytes = AddSize(s.Bytes, e.Size)
		}
	})
}

// Catalog is the current Snapshot of SOURCE. Safe for concurrent use.
type Catalog struct {
	cfg Config // read-only after Open

	cur     atomic.Pointer[Snapshot]
	nextIno atomic.Uint64
	scanMu  chan struct{} // one slot: serializes rescans and Save
	loaded  bool          // the first snapshot came from Config.Saved
}

// ErrSource means SOURCE itself cannot be used as a dataset.
var ErrSource = errors.New("catalog: unusable source")

// Open scans cfg.Source and returns a Catalog holding the result.
func Open(ctx context.Context, cfg Config) (*Catalog, error) {
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.ScanWorkers <= 0 {
		cfg.ScanWorkers = DefaultConfig("").ScanWorkers
	}
	if cfg.StallTimeout <= 0 {
		cfg.StallTimeout = DefaultConfig("").StallTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	abs, err := filepath.Abs(cfg.Source)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrSource, cfg.Source, err)
	}
	cfg.Source = abs
	fi, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSource, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%w: %s is not a directory", ErrSource, abs)
	}
	c := &Catalog{cfg: cfg, scanMu: make(chan struct{}, 1)}
	c.nextIno.Store(RootIno + 1)
	if snap := c.loadSaved(); snap != nil {
		c.cur.Store(snap)
		return c, nil
	}
	snap, err := c.scan(ctx, nil, false)
	if err != nil {
		return nil, err
	}
	c.cur.Store(snap)
	return c, nil
}

// loadSaved returns the saved snapshot, or nil (with one log line if there
// was one and it is unusable).
func (c *Catalog) loadSaved() *Snapshot {
	if c.cfg.Saved == "" || c.cfg.Lister != nil {
		return nil
	}
	start := time.Now()
	f, err := os.Open(c.cfg.Saved)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			c.cfg.Logger.Warn("catalog: ignoring the saved snapshot; scanning SOURCE", "file", c.cfg.Saved, "err", err)
		}
		return nil
	}
	defer f.Close()
	var size int64
	if fi, err := f.Stat(); err == nil {
		size = fi.Size()
	}
	snap, next, err := load(f, size, c.cfg.Identity, c.cfg.MaxEntries)
	if err != nil {
		c.cfg.Logger.Warn("catalog: ignoring the saved snapshot; scanning SOURCE", "file", c.cfg.Saved, "err", err)
		return nil
	}
	snap.ScanTime = time.Since(start)
	c.nextIno.Store(next)
	c.loaded = true
	c.cfg.Logger.Info("catalog: loaded the saved snapshot; SOURCE is rescanned in the background", "file", c.cfg.Saved,
		"files", snap.Files, "seconds", snap.ScanTime.Seconds())
	return snap
}

// Loaded reports whether the first snapshot came from the saved file (and
// so may be behind SOURCE until a Refresh).
func (c *Catalog) Loaded() bool { return c.loaded }

// Save writes the current snapshot to Config.Saved, if set.
func (c *Catalog) Save() error {
	if c.cfg.Saved == "" || c.cfg.Lister != nil {
		return nil
	}
	c.scanMu <- struct{}{}
	defer func() { <-c.scanMu }()
	return Save(c.cfg.Saved, c.cur.Load(), c.cfg.Identity, c.nextIno.Load())
}

// Source returns the absolute path of SOURCE.
func (c *Catalog) Source() string { return c.cfg.Source }

// Snapshot returns the current snapshot. It never blocks.
func (c *Catalog) Snapshot() *Snapshot { return c.cur.Load() }

// Diff lists what a Refresh changed. Entries are from the old snapshot for
// Changed and Removed, and from the new one for Added.
type Diff struct {
	Changed []*Entry // same path and type, different size, mtime, mode or target
	Removed []*Entry // path gone, or its type changed
	Added   []*Entry // path new, or its type changed

	// How the rescan went.
	ScanTime time.Duration
	Reused   int // directories kept unread (Revalidate)
}

// Refresh rescans SOURCE, swaps in the new snapshot and reports what changed.
// On error the current snapshot stays in place, and so it does when
// nothing changed (holders of it, the jobs' indexes, then keep the only
// copy).
func (c *Catalog) Refresh(ctx context.Context) (Diff, error) { return c.rescan(ctx, false) }

// Revalidate is Refresh by directories: a directory whose mtime, ctime and
// inode in SOURCE are the snapshot's keeps its entries without a readdir
// or an lstat of each, and only its subdirectories are stat'ed and
// followed. It finds every entry added, removed or renamed (each changes
// its directory's mtime and ctime), at the cost of a stat per directory;
// a file rewritten in place under its old name is not seen (Refresh sees
// it, and a read that reaches SOURCE finds it changed: source.ErrChanged).
// It is the background pass after a mount from a saved snapshot.
func (c *Catalog) Revalidate(ctx context.Context) (Diff, error) { return c.rescan(ctx, true) }

func (c *Catalog) rescan(ctx context.Context, byDir bool) (Diff, error) {
	select { // another rescan may be stuck on SOURCE: wait for it only as long as ctx
	case c.scanMu <- struct{}{}:
	case <-ctx.Done():
		return Diff{}, fmt.Errorf("catalog: rescan %s: %w", c.cfg.Source, ctx.Err())
	}
	defer func() { <-c.scanMu }()
	old := c.cur.Load()
	if byDir && c.cfg.Lister == nil && old.UnreadableEntries == 0 {
		// Most often nothing changed: a stat of every directory shows it
		// without copying the snapshot. (A snapshot that could not read
		// everything is rescanned: what reads now is news.)
		start := time.Now()
		if dirs, same := c.unchangedDirs(ctx, old); same {
			return Diff{ScanTime: time.Since(start), Reused: dirs}, nil
		}
	}
	snap, err := c.scan(ctx, old, byDir)
	if err != nil {
		return Diff{}, err
	}
	d := diff(old, snap)
	d.ScanTime, d.Reused = snap.ScanTime, snap.Reused
	if len(d.Changed)+len(d.Removed)+len(d.Added) > 0 || old.Root.Mode != snap.Root.Mode ||
		old.Root.Mtime != snap.Root.Mtime || old.Root.owner != snap.Root.owner ||
		old.UnreadableEntries+snap.UnreadableEntries > 0 { // what could not be read is news too
		c.cur.Store(snap)
	}
	return d, nil
}

func diff(old, cur *Snapshot) Diff {
	var d Diff
	var walk func(o, n *Entry)
	walk = func(o, n *Entry) {
		// Both lists are sorted by name: merge them.
		no, nn := o.NumChildren(), n.NumChildren()
		i, j := 0, 0
		for i < no || j < nn {
			switch {
			case j == nn || (i < no && o.ChildAt(i).Name < n.ChildAt(j).Name):
				d.Removed = append(d.Removed, o.ChildAt(i))
				i++
			case i == no || n.ChildAt(j).Name < o.ChildAt(i).Name:
				d.Added = append(d.Added, n.ChildAt(j))
				j++
			default:
				oc, nc := o.ChildAt(i), n.ChildAt(j)
				switch {
				case oc.Ino != nc.Ino:
					d.Removed = append(d.Removed, oc)
					d.Added = append(d.Added, nc)
				case oc.IsDir():
					if oc.Mode != nc.Mode || oc.Mtime != nc.Mtime || oc.owner != nc.owner {
						d.Changed = append(d.Changed, oc)
					}
					walk(oc, nc)
				case oc.Version() != nc.Version() || oc.Mode != nc.Mode || oc.Target() != nc.Target() ||
					oc.owner != nc.owner:
					d.Changed = append(d.Changed, oc)
				}
				i++
				j++
			}
		}
	}
	walk(old.Root, cur.Root)
	return d
}

// scan builds a snapshot of SOURCE. Entries whose path and type match old
// keep their inode number; with byDir, directories unchanged since old
// keep their entries (Revalidate).
func (c *Catalog) scan(ctx context.Context, old *Snapshot, byDir bool) (*Snapshot, error) {
	start, scanned := time.Now(), c.cfg.Now()
	root := &Entry{Ino: RootIno}
	var oldRoot *Entry
	if old != nil {
		oldRoot = old.Root
	}
	var skipped, reused int
	var unreadable []string
	var unreadableEntries int
	if c.cfg.Lister != nil {
		files, err := c.list(ctx, root)
		if err != nil {
			return nil, err
		}
		if len(files) > c.cfg.MaxEntries {
			return nil, c.tooMany()
		}
		skipped = c.build(root, oldRoot, files)
	} else {
		// Cancelled when the scan returns: a scan abandoned on a stall
		// stops where it stands, and its goroutines not stuck in the
		// kernel end.
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		sc := &scanner{c: c, ctx: sctx, sem: make(chan struct{}, c.cfg.ScanWorkers), byDir: byDir}
		if old != nil {
			sc.trusted = old.Scanned.Add(-racy).UnixNano()
		}
		sc.wg.Add(1)
		go func() {
			if err := c.stat(c.cfg.Source, root); err != nil {
				sc.rootErr = err
				sc.wg.Done()
				return
			}
			sc.ops.Add(1)
			sc.dir(root, oldRoot)
		}()
		stop := c.progress(&sc.entries, start)
		err := c.await(ctx, &sc.wg, &sc.ops)
		stop()
		if err != nil {
			return nil, fmt.Errorf("catalog: scan %s: %w", c.cfg.Source, err)
		}
		if sc.entries.Load() > int64(c.cfg.MaxEntries) {
			return nil, c.tooMany()
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("catalog: scan %s: %w", c.cfg.Source, err)
		}
		if sc.rootErr != nil {
			return nil, fmt.Errorf("%w: %v", ErrSource, sc.rootErr)
		}
		skipped, reused = int(sc.skipped.Load()), int(sc.reused.Load())
		unreadable, unreadableEntries = sc.unreadable, sc.unreadableEntries
		slices.Sort(unreadable)
	}
	snap := &Snapshot{Root: root, ScanTime: time.Since(start), Skipped: skipped, Reused: reused, Scanned: scanned,
		Unreadable: unreadable, UnreadableEntries: unreadableEntries}
	snap.byIno = make([]*Entry, c.nextIno.Load())
	snap.Walk(func(e *Entry) { snap.byIno[e.Ino] = e })
	snap.count()
	return snap, nil
}

// list stats SOURCE into root and asks the Lister for its files, giving
// up when ctx ends (the calls stuck in a PFS that stopped answering are
// left to end on their own goroutine).
func (c *Catalog) list(ctx context.Context, root *Entry) ([]File, error) {
	type result struct {
		files []File
		err   error
	}
	done := make(chan result, 1)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		if err := c.stat(c.cfg.Source, root); err != nil {
			done <- result{nil, fmt.Errorf("%w: %v", ErrSource, err)}
			return
		}
		files, err := c.cfg.Lister.List(lctx)
		if err != nil {
			err = fmt.Errorf("%w: %v", ErrSource, err)
		}
		done <- result{files, err}
	}()
	select {
	case r := <-done:
		return r.files, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("catalog: list %s: %w", c.cfg.Source, ctx.Err())
	}
}

// build makes the tree under root from a Lister's files, keeping the
// inode numbers of paths whose type matches old. It returns how many
// files it left out (bad paths, repeats, a file under a non-directory).
// The tree is first made of nodes, then frozen into entries, each
// directory's children in one array.
func (c *Catalog) build(root, old *Entry, files []File) int {
	// A directory listed more than once takes its last line. The sort by
	// path is not stable (a stable one costs three times as much on a
	// shuffled listing), so the last lines are found before it.
	lastDir := map[string]File{}
	for _, f := range files {
		if f.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			lastDir[f.Path] = f
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	type node struct {
		e      Entry
		target string
		kids   map[string]*node // directories
		prev   *Entry           // a directory's entry in old
	}
	top := &node{e: *root, kids: map[string]*node{}, prev: old}
	skipped := 0
	// child returns the node name in dir, making it (as f) if missing.
	child := func(dir *node, name string, f File) *node {
		if n := dir.kids[name]; n != nil {
			return n
		}
		n := &node{e: Entry{Name: name, Mode: f.Mode, owner: root.owner,
			Size: f.Size, Mtime: f.Mtime, Ctime: f.Ctime, SrcIno: f.Ino}, target: f.Target}
		var prev *Entry
		if dir.prev != nil {
			if p := dir.prev.Child(name); p != nil && p.Mode&syscall.S_IFMT == n.e.Mode&syscall.S_IFMT {
				prev = p
			}
		}
		if prev != nil {
			n.e.Ino = prev.Ino
		} else {
			n.e.Ino = c.nextIno.Add(1) - 1
		}
		if n.e.IsDir() {
			n.kids, n.prev = map[string]*node{}, prev
		}
		dir.kids[name] = n
		return n
	}
	for _, f := range files {
		names := strings.Split(f.Path, "/")
		if !source.Local(f.Path) || (len(names) == 1 && c.hidden(names[0])) {
			skipped++
			continue
		}
		d := top
		for _, name := range names[:len(names)-1] {
			d = child(d, name, File{Mode: syscall.S_IFDIR | 0o755, Mtime: root.Mtime})
			if !d.e.IsDir() {
				break
			}
		}
		if !d.e.IsDir() {
			skipped++
			continue
		}
		last := names[len(names)-1]
		if f.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			f = lastDir[f.Path]
		}
		if n := d.kids[last]; n != nil {
			if n.e.IsDir() && f.Mode&syscall.S_IFMT == syscall.S_IFDIR {
				n.e.Mode, n.e.Mtime = f.Mode, f.Mtime // a directory listed twice: its last line
			} else {
				skipped++
			}
			continue
		}
		child(d, last, f)
	}
	var freeze func(d *Entry, n *node)
	freeze = func(d *Entry, n *node) {
		if len(n.kids) == 0 {
			return
		}
		names := make([]string, 0, len(n.kids))
		for name := range n.kids {
			names = append(names, name)
		}
		sort.Strings(names)
		kids := make([]Entry, len(names))
		arena := newNames(names)
		for i, name := range names {
			k := n.kids[name]
			kids[i] = k.e
			kids[i].Name, kids[i].parent = arena.intern(name), d
			if k.target != "" {
				kids[i].more = &more{target: k.target}
			}
		}
		d.more = &more{kids: kids}
		for i, name := range names {
			if kids[i].IsDir() {
				freeze(&kids[i], n.kids[name])
			}
		}
	}
	freeze(root, top)
	return skipped
}

// names is one buffer holding a directory's names.
type names struct{ buf []byte }

func newNames(list []string) *names {
	n := 0
	for _, s := range list {
		n += len(s)
	}
	return &names{buf: make([]byte, 0, n)}
}

// intern copies s into the buffer, which never grows past the capacity
// newNames gave it, so the strings it returned stay valid.
func (a *names) intern(s string) string {
	if s == "" || len(a.buf)+len(s) > cap(a.buf) {
		return s
	}
	off := len(a.buf)
	a.buf = append(a.buf, s...)
	return unsafe.String(&a.buf[off], len(s))
}

// progressEvery is how often a long scan logs its progress, once past
// progressFrom entries.
const (
	progressEvery = 5 * time.Second
	progressFrom  = 1 << 20
)

// progress logs how many entries a scan has read, every progressEvery once
// past progressFrom, until the returned function is called.
func (c *Catalog) progress(entries *atomic.Int64, start time.Time) (stop func()) {
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if n := entries.Load(); n >= progressFrom {
				secs := time.Since(start).Seconds()
				c.cfg.Logger.Info("catalog: scanning SOURCE", "source", c.cfg.Source, "entries", n,
					"seconds", int(secs), "per_second", int(float64(n)/secs))
			}
		}
	}()
	return func() { close(done); <-ended }
}

func (c *Catalog) tooMany() error {
	return fmt.Errorf("%w: %s holds more than %d files and directories; the catalog keeps about 120 bytes of RAM for each: raise --max-files if the memory is there",
		ErrTooMany, c.cfg.Source, c.cfg.MaxEntries)
}

func (c *Catalog) hidden(name string) bool {
	for _, h := range c.cfg.Hide {
		if h == name {
			return true
		}
	}
	return false
}

type scanner struct {
	c       *Catalog
	ctx     context.Context
	entries atomic.Int64  // read so far; past MaxEntries, the scan stops
	sem     chan struct{} // bounds directories read at once
	wg      sync.WaitGroup
	skipped atomic.Int64
	rootErr error // set only by the root directory's goroutine
	byDir   bool  // keep the entries of directories unchanged since the old snapshot
	trusted int64 // a directory's times say it is unchanged only if they are before this (ns)
	reused  atomic.Int64
	ops     atomic.Int64 // calls to SOURCE answered: a scan whose count stops moving has stalled

	mu                sync.Mutex
	unreadable        []string // (mu) the first maxUnreadable entries that could not be read
	unreadableEntries int      // (mu) how many
}

// await waits for wg, unless ctx ends first, or ops stops moving for
// Config.StallTimeout: a PFS that stopped answering leaves goroutines in
// the kernel, which the scan then abandons.
func (c *Catalog) await(ctx context.Context, wg *sync.WaitGroup, ops *atomic.Int64) error {
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }() // ends when the last stuck call does
	w := stallWatch{timeout: c.cfg.StallTimeout, last: ops.Load(), moved: time.Now()}
	tick := time.NewTicker(w.every())
	defer tick.Stop()
	for {
		select {
		case <-finished:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case now := <-tick.C:
			if w.stalled(now, ops.Load()) {
				return fmt.Errorf("%w: no answer for %s; the current snapshot stays (raise --pfs-timeout if SOURCE is only slow)",
					ErrStalled, c.cfg.StallTimeout.Round(time.Second))
			}
		}
	}
}

// stallWatch tells a scan that has stalled: its count of calls to SOURCE
// answered has not moved for timeout. Checked every eighth of timeout, it
// sees a stall at most that late.
type stallWatch struct {
	timeout time.Duration
	last    int64     // the count when it last moved
	moved   time.Time // when it last moved
}

// every is how often the watch is checked.
func (w *stallWatch) every() time.Duration { return max(w.timeout/8, time.Millisecond) }

// stalled reports whether, at now with ops calls answered, the count has
// not moved for timeout.
func (w *stallWatch) stalled(now time.Time, ops int64) bool {
	if ops != w.last {
		w.last, w.moved = ops, now
		return false
	}
	return now.Sub(w.moved) >= w.timeout
}

// acquire takes a slot for I/O, unless the scan is given up first.
func (sc *scanner) acquire() bool {
	select {
	case sc.sem <- struct{}{}:
	case <-sc.ctx.Done():
		return false
	}
	if sc.ctx.Err() != nil {
		<-sc.sem
		return false
	}
	return true
}

// cannotRead records that the entry at path could not be read.
func (sc *scanner) cannotRead(path string) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.unreadableEntries++
	if len(sc.unreadable) < maxUnreadable {
		sc.unreadable = append(sc.unreadable, path)
	}
}

// unchangedDirs stats every directory of snap in SOURCE, ScanWorkers at
// once, and reports whether all are as snap has them (and trusted: see
// racy), with how many there are.
func (c *Catalog) unchangedDirs(ctx context.Context, snap *Snapshot) (int, bool) {
	var dirs []*Entry
	snap.Walk(func(e *Entry) {
		if e.IsDir() {
			dirs = append(dirs, e)
		}
	})
	trusted := snap.Scanned.Add(-racy).UnixNano()
	var next, ops atomic.Int64
	var changed atomic.Bool
	var wg sync.WaitGroup
	for range min(c.cfg.ScanWorkers, len(dirs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && !changed.Load() {
				i := int(next.Add(1) - 1)
				if i >= len(dirs) {
					return
				}
				old := dirs[i]
				var st unix.Stat_t
				err := source.IgnoringEINTR(func() error {
					if old == snap.Root {
						return unix.Stat(c.cfg.Source, &st) // SOURCE may be a link, followed as scan does
					}
					return unix.Lstat(filepath.Join(c.cfg.Source, filepath.FromSlash(old.Path())), &st)
				})
				ops.Add(1)
				now := Entry{}
				_ = fill(&now, &st, nil) // the owner is not compared
				if err != nil || !unchanged(&now, old, trusted) {
					changed.Store(true)
				}
			}
		}()
	}
	if c.await(ctx, &wg, &ops) != nil {
		changed.Store(true) // stops the workers not stuck; the scan that follows fails the same way
	}
	return len(dirs), ctx.Err() == nil && !changed.Load()
}

// racy is how long before a scan a directory must have last changed for
// its times to be trusted (git's "racy" entries): a change in the same
// timestamp granule as the scan's readdir, or on a server whose clock runs
// behind, can leave them as they were.
const racy = time.Minute

// unchanged reports whether directory d, as SOURCE has it now, is old:
// no entry was added, removed or renamed in it since, and its times are
// before trusted (ns).
func unchanged(d, old *Entry, trusted int64) bool {
	return old != nil && old.IsDir() && d.IsDir() && d.SrcIno == old.SrcIno && d.Mtime == old.Mtime && d.Ctime == old.Ctime &&
		d.Mtime < trusted && d.Ctime < trusted
}

// reuse gives d a copy of old's entries (d is unchanged), with its
// subdirectories stat'ed afresh and followed. It reports false, having
// changed nothing, if a subdirectory cannot be stat'ed as one: d must then
// be read.
func (sc *scanner) reuse(d, old *Entry) bool {
	var kids []Entry
	if old.more != nil {
		kids = slices.Clone(old.more.kids)
	}
	full := filepath.Join(sc.c.cfg.Source, filepath.FromSlash(d.Path()))
	var last lastOwner
	for i := range kids {
		e := &kids[i]
		e.parent = d
		if !e.IsDir() {
			continue // a symlink's more (its target) is immutable: shared
		}
		e.more = nil
		var st unix.Stat_t
		err := source.IgnoringEINTR(func() error { return unix.Lstat(filepath.Join(full, e.Name), &st) })
		sc.ops.Add(1)
		if err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFDIR || fill(e, &st, &last) != nil {
			return false // changed under the scan: read d instead
		}
	}
	sc.reused.Add(1)
	sc.adopt(d, old, kids)
	return true
}

// keep gives d, which could not be read, old's entries as they were, and
// scans its subdirectories.
func (sc *scanner) keep(d, old *Entry) {
	distrust(d, old)
	var kids []Entry
	if old.more != nil {
		kids = slices.Clone(old.more.kids)
	}
	for i := range kids {
		kids[i].parent = d
		if kids[i].IsDir() {
			kids[i].more = nil
		}
	}
	sc.adopt(d, old, kids)
}

// adopt makes kids, copies of old's entries, d's children, and scans
// their subdirectories.
func (sc *scanner) adopt(d, old *Entry, kids []Entry) {
	sc.entries.Add(int64(len(kids)))
	if len(kids) == 0 {
		return
	}
	d.more = &more{kids: kids}
	for i := range kids {
		if kids[i].IsDir() {
			sc.wg.Add(1)
			go sc.dir(&kids[i], old.Child(kids[i].Name))
		}
	}
}

// dir fills d's children, then scans subdirectories in new goroutines.
// The semaphore is held only during I/O, so recursion cannot deadlock.
func (sc *scanner) dir(d, old *Entry) {
	defer sc.wg.Done()
	if sc.ctx.Err() != nil || sc.entries.Load() > int64(sc.c.cfg.MaxEntries) {
		return
	}
	if sc.byDir && unchanged(d, old, sc.trusted) {
		if !sc.acquire() {
			return
		}
		ok := sc.reuse(d, old)
		<-sc.sem
		if ok {
			return
		}
	}
	if !sc.acquire() {
		return
	}
	kids, err := sc.read(d, old)
	<-sc.sem
	if err != nil {
		if d.Ino == RootIno {
			sc.rootErr = err
			return
		}
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
			return // gone since its parent was listed: empty now, removed by the next scan
		}
		sc.cannotRead(d.Path())
		if old != nil && old.IsDir() {
			// A transient error (EIO, a timeout) must not empty a
			// directory: every file in it would look removed.
			sc.c.cfg.Logger.Warn("catalog: cannot read a directory; keeping its entries from the last scan", "path", d.Path(), "err", err)
			sc.keep(d, old)
			return
		}
		sc.c.cfg.Logger.Warn("catalog: skipping unreadable directory", "path", d.Path(), "err", err)
		sc.skipped.Add(1)
		return
	}
	sc.entries.Add(int64(len(kids)))
	if len(kids) == 0 {
		return
	}
	d.more = &more{kids: kids}
	for i := range kids {
		e := &kids[i]
		e.parent = d
		var prev *Entry
		if old != nil {
			if p := old.Child(e.Name); p != nil && p.Mode&syscall.S_IFMT == e.Mode&syscall.S_IFMT {
				prev = p
			}
		}
		if prev != nil {
			e.Ino = prev.Ino
		} else {
			e.Ino = sc.c.nextIno.Add(1) - 1
		}
		if e.IsDir() {
			sc.wg.Add(1)
			go sc.dir(e, prev)
		}
	}
}

// read lists directory d and lstats its entries relative to the directory's
// descriptor, which is one lookup per entry instead of one per path
// component. The entries come in name order, in one array, their names in
// one buffer.
//
// An entry that cannot be stat'ed for another reason than being gone keeps
// its entry in old, the last scan's d, if it had one (a directory keeps
// its subtree, scanned again), and is recorded as unreadable: a transient
// error never drops an entry.
func (sc *scanner) read(d, old *Entry) ([]Entry, error) {
	full := filepath.Join(sc.c.cfg.Source, filepath.FromSlash(d.Path()))
	f, err := os.Open(full)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var list []string
	for {
		// In chunks, each counted: a huge directory on a slow but
		// healthy PFS is progress, not a stall.
		names, err := f.Readdirnames(readdirChunk)
		list = append(list, names...)
		sc.ops.Add(1)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("readdir %s: %w", full, err)
		}
		if sc.ctx.Err() != nil {
			return nil, sc.ctx.Err()
		}
	}
	sort.Strings(list)
	fd := int(f.Fd())
	out := make([]Entry, 0, len(list))
	arena := newNames(list)
	var last lastOwner
	for _, name := range list {
		if d.Ino == RootIno && sc.c.hidden(name) {
			sc.c.cfg.Logger.Warn("catalog: SOURCE entry shadowed by the control directory", "name", name)
			sc.skipped.Add(1)
			continue
		}
		var st unix.Stat_t
		err := source.IgnoringEINTR(func() error { return unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) })
		sc.ops.Add(1)
		if err != nil {
			if errors.Is(err, unix.ENOENT) { // vanished since readdir: not an error
				sc.skipped.Add(1)
				continue
			}
			if e, ok := sc.keepEntry(d, old, name, err); ok {
				out = append(out, e)
			}
			continue
		}
		e := Entry{Name: arena.intern(name)}
		if err := fill(&e, &st, &last); err != nil {
			sc.c.cfg.Logger.Warn("catalog: skipping entry", "path", join(d.Path(), name), "err", err)
			sc.skipped.Add(1)
			continue
		}
		switch {
		case e.IsDir(), e.IsRegular():
		case e.IsSymlink():
			buf := make([]byte, 4096)
			var n int
			err := source.IgnoringEINTR(func() (err error) { n, err = unix.Readlinkat(fd, name, buf); return err })
			if err != nil {
				if e, ok := sc.keepEntry(d, old, name, err); ok && e.IsSymlink() {
					out = append(out, e)
				}
				continue
			}
			e.more = &more{target: string(buf[:n])}
		default:
			sc.skipped.Add(1)
			continue
		}
		out = append(out, e)
	}
	return out, nil
}

// readdirChunk is how many names a scan lists at a time.
const readdirChunk = 4096

// distrust gives directory d, whose listing holds what could not be read
// now, the ctime it had in old, the last snapshot (none if d is new): a
// Revalidate, which keeps the listing of a directory whose times are the
// snapshot's, then reads d again if it changed since old, instead of
// trusting a listing that was not all read. (Of a directory, only
// Revalidate reads the ctime; the view shows its mtime.)
func distrust(d, old *Entry) {
	d.Ctime = 0
	if old != nil {
		d.Ctime = old.Ctime
	}
}

// keepEntry is the entry named name of old (the last scan's d), if it had
// one, for an entry of d that could not be read this time (err); it
// records the failure either way.
func (sc *scanner) keepEntry(d, old *Entry, name string, err error) (Entry, bool) {
	path := join(d.Path(), name)
	sc.cannotRead(path)
	distrust(d, old)
	var prev *Entry
	if old != nil {
		prev = old.Child(name)
	}
	if prev == nil {
		sc.c.cfg.Logger.Warn("catalog: skipping entry", "path", path, "err", err)
		sc.skipped.Add(1)
		return Entry{}, false
	}
	sc.c.cfg.Logger.Warn("catalog: cannot read an entry; keeping it as the last scan had it", "path", path, "err", err)
	e := *prev
	if e.IsDir() {
		e.more = nil // scanned again: its own listing, or its kept entries
	}
	return e, true
}

func (c *Catalog) stat(path string, e *Entry) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if err := fill(e, &st, nil); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	return nil
}

// fill sets e's metadata from st, its owner through last (setOwner). It
// fails only if the process has run out of owner indexes (owner.go), with
// everything else set.
func fill(e *Entry, st *unix.Stat_t, last *lastOwner) error {
	e.Mode = st.Mode
	e.Size = st.Size
	e.Mtime = st.Mtim.Nano()
	e.Ctime = st.Ctim.Nano()
	e.SrcIno = st.Ino
	return e.setOwner(st.Uid, st.Gid, last)
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}
