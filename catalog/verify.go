package catalog

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/source"
)

// Checking a saved snapshot against SOURCE
//
// A snapshot loaded from Config.Saved is SOURCE as it was when it was
// saved. While dlfs was down SOURCE may have changed (an rsync's temp
// files renamed over the old ones, a file rewritten in place), or another
// dataset may sit behind the same path. Its entries are therefore
// unverified until each has been checked against SOURCE: Check stats the
// entry's path once and compares what the view and the tiers bind to it
// (type and source.Version: size, mtime, ctime and inode; for a
// directory, what Revalidate trusts: its times and inode, older than the
// saved scan by racy). Callers ask before they serve anything of an entry,
// and an entry that does not match is ErrBehind: it must not be served
// until a rescan has brought the catalog up to date.
//
// What has been checked is a bit per inode number below the saved file's
// next one (1.25 MB for 10 M entries); numbers a rescan hands out later
// are of entries it stat'ed itself. The bits go, and Check costs one
// atomic load again, once every entry has been checked (CheckAll, the
// background pass after a load) or a full Refresh has read everything.

// ErrBehind means an entry of a loaded snapshot does not match SOURCE:
// the catalog is behind it, and nothing of the entry may be served until
// a rescan. It is a source.ErrChanged.
var ErrBehind = fmt.Errorf("%w: the saved catalog is behind SOURCE", source.ErrChanged)

// unchecked is the set of a loaded snapshot's entries not yet checked.
type unchecked struct {
	limit   uint64          // inode numbers below it came from the saved file
	checked []atomic.Uint64 // bit ino: checked against SOURCE and matched
	trusted int64           // ns: a directory's times must be before it (racy)
}

func newUnchecked(limit uint64, snap *Snapshot) *unchecked {
	return &unchecked{limit: limit, checked: make([]atomic.Uint64, (limit+63)/64),
		trusted: snap.Scanned.Add(-racy).UnixNano()}
}

func (u *unchecked) done(ino uint64) bool {
	return ino >= u.limit || u.checked[ino/64].Load()&(1<<(ino%64)) != 0
}

func (u *unchecked) set(ino uint64) { u.checked[ino/64].Or(1 << (ino % 64)) }

// merge marks checked what is checked in f, of the same limit.
func (u *unchecked) merge(f *unchecked) {
	for i := range f.checked {
		if w := f.checked[i].Load(); w != 0 {
			u.checked[i].Or(w)
		}
	}
}

// Verifying reports whether entries of a loaded snapshot are still to
// be checked against SOURCE.
func (c *Catalog) Verifying() bool { return c.unchecked.Load() != nil }

// Checked reports, without I/O, whether Check would return nil at once.
func (c *Catalog) Checked(e *Entry) bool {
	u := c.unchecked.Load()
	return u == nil || e.Ino >= u.limit || (u.done(e.Ino) && !c.superseded(e))
}

// superseded reports whether the current snapshot's entry of e's number
// is not e as it is (e is an older snapshot's).
func (c *Catalog) superseded(e *Entry) bool {
	cur := c.cur.Load().ByIno(e.Ino)
	return cur != e && (cur == nil || cur.Version() != e.Version() || cur.Mode != e.Mode)
}

// Check returns nil if e may be served: it comes from a scan, or it was
// loaded from the saved snapshot and SOURCE still has it as it was (it is
// stat'ed the first time it is asked about). It returns ErrBehind if e
// does not match SOURCE or is no longer the current snapshot's entry of
// its number, and another error (wrapped) if SOURCE could not be asked
// within Config.StallTimeout or before ctx ended.
func (c *Catalog) Check(ctx context.Context, e *Entry) error {
	u := c.unchecked.Load()
	switch {
	case u == nil || e.Ino >= u.limit:
		return nil
	case c.superseded(e):
		return fmt.Errorf("%w: %s", ErrBehind, e.Path()) // an older snapshot's entry
	case u.done(e.Ino):
		return nil
	}
	now, err := c.lstat(ctx, e)
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%w: %s is gone", ErrBehind, shown(e))
	case err != nil:
		return err
	}
	same := now.Mode&unix.S_IFMT == e.Mode&unix.S_IFMT && now.Version() == e.Version()
	if e.IsDir() {
		same = unchanged(&now, e, u.trusted)
	}
	switch {
	case same:
		u.set(e.Ino)
		return nil
	case now.SrcIno != e.SrcIno && now.Size == e.Size && now.Mtime == e.Mtime && now.Ctime == e.Ctime:
		return fmt.Errorf("%w: %s has another inode number (replaced, or a filesystem that numbers inodes anew on each mount)", ErrBehind, shown(e))
	case e.IsDir() && now.Mtime == e.Mtime && now.Ctime == e.Ctime && now.SrcIno == e.SrcIno:
		return fmt.Errorf("%w: directory %s changed within a minute of the saved scan: its listing is read again", ErrBehind, shown(e))
	}
	return fmt.Errorf("%w: %s changed while dlfs was down", ErrBehind, shown(e))
}

// shown names e in a message: its path, or SOURCE's root.
func shown(e *Entry) string {
	if e.parent == nil {
		return "SOURCE's root"
	}
	return e.Path()
}

// lstat stats e's path in SOURCE (the root is followed, as a scan does),
// giving up when ctx ends or after Config.StallTimeout: a stat of a PFS
// that stopped answering cannot be interrupted, and is left behind.
func (c *Catalog) lstat(ctx context.Context, e *Entry) (Entry, error) {
	path := filepath.Join(c.cfg.Source, filepath.FromSlash(e.Path()))
	type result struct {
		st  unix.Stat_t
		err error
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StallTimeout)
	defer cancel()
	// At most ScanWorkers stats at once: a PFS that stops answering keeps
	// that many threads in the kernel, and the checks after them wait here
	// until their deadline, not in a thread of their own.
	select {
	case c.checks <- struct{}{}:
	case <-ctx.Done():
		return Entry{}, fmt.Errorf("catalog: check %s against SOURCE: %w (SOURCE is not answering the checks before it)", path, ctx.Err())
	}
	got := make(chan result, 1)
	go func() {
		defer func() { <-c.checks }()
		var r result
		r.err = source.IgnoringEINTR(func() error {
			if e.parent == nil {
				return unix.Stat(path, &r.st)
			}
			return unix.Lstat(path, &r.st)
		})
		got <- r
	}()
	select {
	case r := <-got:
		if r.err != nil {
			return Entry{}, fmt.Errorf("catalog: check %s against SOURCE: %w", path, r.err)
		}
		var now Entry
		_ = fill(&now, &r.st, nil) // the owner is not compared (ctime moves with it)
		return now, nil
	case <-ctx.Done():
		return Entry{}, fmt.Errorf("catalog: check %s against SOURCE: %w", path, ctx.Err())
	}
}

// CheckAll checks every entry of the current snapshot not checked yet,
// Config.ScanWorkers at once, and reports how many are behind SOURCE.
// When none is and all could be asked, the loaded snapshot is wholly
// checked and Check costs nothing from then on.
func (c *Catalog) CheckAll(ctx context.Context) (behind int, err error) {
	u := c.unchecked.Load()
	if u == nil {
		return 0, nil
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	todo := make(chan *Entry, 1024)
	var nBehind atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	for range c.cfg.ScanWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range todo {
				switch err := c.Check(ctx, e); {
				case errors.Is(err, ErrBehind):
					nBehind.Add(1)
				case err != nil:
					errOnce.Do(func() { firstErr = err; stop() }) // SOURCE stopped answering: no more stats now
				}
			}
		}()
	}
	snap := c.cur.Load()
	func() {
		defer close(todo)
		var walk func(*Entry) bool
		walk = func(e *Entry) bool {
			if !u.done(e.Ino) {
				select {
				case todo <- e:
				case <-ctx.Done():
					return false
				}
			}
			for i := 0; i < e.NumChildren(); i++ {
				if !walk(&e.more.kids[i]) {
					return false
				}
			}
			return true
		}
		walk(snap.Root)
	}()
	wg.Wait()
	switch {
	case firstErr != nil:
		return int(nBehind.Load()), firstErr
	case ctx.Err() != nil:
		return int(nBehind.Load()), fmt.Errorf("catalog: checking the saved snapshot against SOURCE: %w", ctx.Err())
	case nBehind.Load() == 0 && c.cur.Load() == snap:
		c.unchecked.CompareAndSwap(u, nil)
	}
	return int(nBehind.Load()), nil
}
