package catalog

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlfs/dlfs/source"
	"golang.org/x/sys/unix"
)

// Rescans and what they changed: Refresh, Revalidate (a stat per
// directory first, when nothing may have changed) and the diff of two
// snapshots.

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
func (c *Catalog) Refresh(ctx context.Context) (Diff, error) { return c.rescan(ctx, false, nil) }

// Revalidate is Refresh by directories: a directory whose mtime, ctime and
// inode in SOURCE are the snapshot's keeps its entries without a readdir
// or an lstat of each, and only its subdirectories are stat'ed and
// followed. It finds every entry added, removed or renamed (each changes
// its directory's mtime and ctime), at the cost of a stat per directory;
// a file rewritten in place under its old name is not seen (Refresh sees
// it, and a read that reaches SOURCE finds it changed: source.ErrChanged).
// It is the background pass after a mount from a saved snapshot.
func (c *Catalog) Revalidate(ctx context.Context) (Diff, error) { return c.rescan(ctx, true, nil) }

// RevalidateDirs is Revalidate with the directories of inode numbers
// reread listed again whatever their times say: it finds a file rewritten
// in place under its old name there (a check found it behind SOURCE) at
// the cost of one listing, not a Refresh of everything.
func (c *Catalog) RevalidateDirs(ctx context.Context, reread map[uint64]bool) (Diff, error) {
	return c.rescan(ctx, true, reread)
}

func (c *Catalog) rescan(ctx context.Context, byDir bool, reread map[uint64]bool) (Diff, error) {
	select { // another rescan may be stuck on SOURCE: wait for it only as long as ctx
	case c.scanMu <- struct{}{}:
	case <-ctx.Done():
		return Diff{}, fmt.Errorf("catalog: rescan %s: %w", c.cfg.Source, ctx.Err())
	}
	defer func() { <-c.scanMu }()
	old := c.cur.Load()
	began := c.cfg.Now()
	u := c.unchecked.Load()
	if byDir && len(reread) == 0 && c.cfg.Lister == nil && old.UnreadableEntries == 0 {
		// Most often nothing changed: a stat of every directory shows it
		// without copying the snapshot. (A snapshot that could not read
		// everything is rescanned: what reads now is news.)
		start := time.Now()
		if dirs, same := c.unchangedDirs(ctx, old); same {
			if u != nil {
				old.Walk(func(e *Entry) { // every listing is as saved
					if e.IsDir() && e.Ino < u.limit {
						u.set(e.Ino)
					}
				})
			}
			c.lastScan.Store(began.UnixNano())
			return Diff{ScanTime: time.Since(start), Reused: dirs}, nil
		}
	}
	var fresh *unchecked // what the scan read from SOURCE, marked once it is the current snapshot
	var mark func(uint64)
	if u != nil {
		fresh = &unchecked{limit: u.limit, checked: make([]atomic.Uint64, len(u.checked))}
		mark = func(ino uint64) {
			if ino < fresh.limit {
				fresh.set(ino)
			}
		}
	}
	snap, err := c.scan(ctx, old, scanMode{byDir: byDir, reread: reread}, mark)
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
	c.lastScan.Store(began.UnixNano())
	if u != nil {
		u.merge(fresh) // after the swap: an old entry of the same number is superseded, not checked
		if !byDir && snap.UnreadableEntries == 0 {
			c.unchecked.Store(nil) // every entry stat'ed now (and swapped in): nothing loaded is left unchecked
		}
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
