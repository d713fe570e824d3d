package daemon

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/prefetch"
)

// A catalog loaded from its saved snapshot is served only as checked
// against SOURCE (catalog.Check): the view asks before it hands the
// kernel an entry (fusefs.Checker), the read path before any tier serves
// one, and the identity is drawn from checked files only. An entry
// behind SOURCE is brought up to date at once, for the request that
// found it: a revalidation by directories (which finds the names an
// rsync renamed over, a file removed or added), then a full refresh if
// the entry is still the current one (a file rewritten in place, which
// no directory shows). Meanwhile, in the background, the keeper
// revalidates every directory and then checks every entry (CheckAll);
// from then on a check costs one atomic load.

// Check implements fusefs.Checker.
func (d dataset) Check(ctx context.Context, e *catalog.Entry) error {
	n := d.n
	err := n.cat.Check(ctx, e)
	if !errors.Is(err, catalog.ErrBehind) {
		return err
	}
	c := &n.rescans.catchUp
	if err := c.revalidate.refresh(ctx); err != nil {
		return err
	}
	if n.cat.Snapshot().ByIno(e.Ino) == e && !n.cat.Checked(e) { // no directory showed it: rewritten in place
		if p := e.Parent(); p != nil {
			c.mu.Lock()
			c.reread[p.Ino] = true
			c.mu.Unlock()
		}
		if err := c.dirs.refresh(ctx); err != nil {
			return err
		}
	}
	return err // resolved again, e is current
}

// catchUp runs the rescans of requests that found an entry behind SOURCE.
// Such a request may hold the kernel's lock of the directory it looks in
// (a LOOKUP does), and the kernel takes that lock to act on an
// invalidation of a name in it (EntryNotify): so the request waits for
// the rescan and the tiers' invalidation, and the kernel is told what
// changed after, in order, by a goroutine of its own (invalidations).
// The answer the request gets is the new snapshot's already.
type catchUp struct {
	revalidate    *refresher // every directory, by its times
	dirs          *refresher // every directory, and those of reread listed again
	mu            sync.Mutex
	reread        map[uint64]bool // (mu) directories of files behind SOURCE, for the next dirs run
	invalidations chan catalog.Diff
	stop          chan struct{}
	done          chan struct{}
}

// startCatchUp starts n.catchUp; Close stops it.
func (n *Node) startCatchUp() {
	c := &n.rescans.catchUp
	c.invalidations, c.stop, c.done = make(chan catalog.Diff, 16), make(chan struct{}), make(chan struct{})
	later := func(d catalog.Diff) {
		if len(d.Changed)+len(d.Removed)+len(d.Added) == 0 {
			return
		}
		select {
		case c.invalidations <- d:
		case <-c.stop:
		}
	}
	c.reread = map[uint64]bool{}
	c.revalidate = newRefresher(func(ctx context.Context) (catalog.Diff, error) { return n.rescan(ctx, n.cat.Revalidate, later) })
	c.dirs = newRefresher(func(ctx context.Context) (catalog.Diff, error) {
		c.mu.Lock()
		reread := c.reread
		c.reread = map[uint64]bool{}
		c.mu.Unlock()
		return n.rescan(ctx, func(ctx context.Context) (catalog.Diff, error) { return n.cat.RevalidateDirs(ctx, reread) }, later)
	})
	go func() {
		defer close(c.done)
		for {
			select {
			case d := <-c.invalidations:
				n.fs.Invalidate(d)
			case <-c.stop:
				return
			}
		}
	}()
	n.onClose("catch-up", func() error { c.close(); return nil })
}

// close stops the rescans and the invalidations; it may be called again.
func (c *catchUp) close() {
	if c.stop == nil {
		return
	}
	select {
	case <-c.stop:
	default:
		close(c.stop) // first: a rescan may wait to hand over its diff
	}
	c.revalidate.close()
	c.dirs.close()
	<-c.done
}

// Checked implements fusefs.Checker.
func (d dataset) Checked(e *catalog.Entry) bool { return d.n.cat.Checked(e) }

// checkLoaded brings a catalog loaded from its saved snapshot up to date
// and checks all of it: every directory revalidated, then every entry
// stat'ed against SOURCE, and a full refresh if any was behind. It logs
// how long each took (the remount suite reads those lines).
func (n *Node) checkLoaded(ctx context.Context) error {
	start := time.Now()
	if _, err := n.refresh(ctx, n.cat.Revalidate); err != nil {
		return err
	}
	n.log.Info("catalog: every directory of the saved snapshot revalidated", "seconds", time.Since(start).Seconds())
	behind, err := n.cat.CheckAll(ctx)
	if err != nil {
		return err
	}
	if behind > 0 {
		n.log.Info("catalog: entries of the saved snapshot were behind SOURCE; refreshing", "behind", behind)
		if _, err := n.refresh(ctx, n.cat.Refresh); err != nil {
			return err
		}
	}
	n.log.Info("catalog: every entry of the saved snapshot checked against SOURCE", "behind", behind, "seconds", time.Since(start).Seconds())
	return nil
}

// identify draws the dataset's identity from checked files (datasetOf).
// A saved catalog is revalidated first, by its directories (a stat each):
// a tree moved into SOURCE keeps its files' old ctimes, and the identity
// must see it as a scan would. One whose oldest files are then behind
// SOURCE is of another dataset, of this one changed while dlfs was down,
// or of a filesystem that numbers inodes anew on each mount: SOURCE is
// scanned now, before the mount, and the identity drawn from the scan.
func (n *Node) identify(ctx context.Context, c identityConfig) (integrity.Dataset, error) {
	if n.cat.Loaded() && c.operatorID == "" {
		// Nothing is built yet that a change would concern: the diff
		// needs no applying.
		if _, err := n.cat.Revalidate(ctx); err != nil {
			return 0, err
		}
	}
	ds, saveErr, err := datasetOf(ctx, n.cat.Snapshot(), c)
	if errors.Is(err, catalog.ErrBehind) {
		n.log.Warn("catalog: the saved snapshot's oldest files are not as SOURCE has them; scanning SOURCE", "err", err)
		if _, err := n.cat.Refresh(ctx); err != nil {
			return 0, err
		}
		ds, saveErr, err = datasetOf(ctx, n.cat.Snapshot(), c)
	}
	if err != nil {
		return 0, err
	}
	if saveErr != nil {
		n.log.Warn("could not keep the dataset identity's heads for the next mount", "err", saveErr)
	}
	return ds, nil
}

// checkedPusher pushes only entries checked against SOURCE: a plan made
// from a saved catalog not yet checked names files whose old bytes the
// SSD tier holds under their old tags, and a push stores before it looks.
type checkedPusher struct {
	n  *Node
	fs prefetch.Pusher
}

func (p checkedPusher) Push(e *catalog.Entry, blockSize int64, block func(i int64) ([]byte, bool)) (int64, error) {
	if err := p.n.cat.Check(context.Background(), e); err != nil { // bounded by the catalog's stall timeout
		return 0, err
	}
	return p.fs.Push(e, blockSize, block)
}
