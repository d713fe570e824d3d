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
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
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

// Catalog is the current Snapshot of SOURCE. Safe for concurrent use.
type Catalog struct {
	cfg Config // read-only after Open

	cur     atomic.Pointer[Snapshot]
	nextIno atomic.Uint64
	scanMu  chan struct{} // one slot: serializes rescans and Save
	loaded  bool          // the first snapshot came from Config.Saved
	// unchecked holds what of a loaded snapshot has been checked against
	// SOURCE (verify.go); nil once all of it has, or for a scan.
	unchecked atomic.Pointer[unchecked]
	checks    chan struct{} // bounds the checks' stats of SOURCE in flight (verify.go)
	// lastScan is when the last rescan that left the current snapshot as
	// SOURCE has it began (ns); Save writes it when later than the
	// snapshot's own scan.
	lastScan atomic.Int64
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
	c := &Catalog{cfg: cfg, scanMu: make(chan struct{}, 1), checks: make(chan struct{}, cfg.ScanWorkers)}
	c.nextIno.Store(RootIno + 1)
	if snap := c.loadSaved(); snap != nil {
		c.cur.Store(snap)
		return c, nil
	}
	snap, err := c.scan(ctx, nil, scanMode{}, nil)
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
	c.unchecked.Store(newUnchecked(next, snap)) // served only as checked: verify.go
	c.cfg.Logger.Info("catalog: loaded the saved snapshot; SOURCE is rescanned in the background", "file", c.cfg.Saved,
		"files", snap.Files, "seconds", snap.ScanTime.Seconds())
	return snap
}

// Loaded reports whether the first snapshot came from the saved file (and
// so may be behind SOURCE until a rescan: its entries are checked before
// they are served, see Check).
func (c *Catalog) Loaded() bool { return c.loaded }

// Save writes the current snapshot to Config.Saved, if set.
func (c *Catalog) Save() error {
	if c.cfg.Saved == "" || c.cfg.Lister != nil {
		return nil
	}
	c.scanMu <- struct{}{}
	defer func() { <-c.scanMu }()
	snap := *c.cur.Load()
	if t := c.lastScan.Load(); t > snap.Scanned.UnixNano() {
		// A rescan since found the snapshot as SOURCE has it: its
		// directories are trusted by that scan's start (racy).
		snap.Scanned = time.Unix(0, t)
	}
	return Save(c.cfg.Saved, &snap, c.cfg.Identity, c.nextIno.Load())
}

// Source returns the absolute path of SOURCE.
func (c *Catalog) Source() string { return c.cfg.Source }

// Snapshot returns the current snapshot. It never blocks.
func (c *Catalog) Snapshot() *Snapshot { return c.cur.Load() }

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
