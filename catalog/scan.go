package catalog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dlfs/dlfs/source"
	"golang.org/x/sys/unix"
)

// The scan of SOURCE as a directory tree: a goroutine per directory,
// bounded by a semaphore held only during I/O, watched for a stall, and
// keeping what it cannot read from the last snapshot.

// scanMode is how a rescan treats directories that look unchanged.
type scanMode struct {
	byDir  bool            // keep the entries of directories unchanged since the old snapshot (Revalidate)
	reread map[uint64]bool // except these, by inode number: listed again (RevalidateDirs)
}

// scan builds a snapshot of SOURCE. Entries whose path and type match old
// keep their inode number; with mode.byDir, directories unchanged since
// old keep their entries (Revalidate).
//
// mark, if set, is told the inode number of each entry the scan read from
// SOURCE (a directory listed, or kept unread as unchanged, and the
// entries of a directory listed): what a rescan found is as SOURCE has it
// (verify.go).
func (c *Catalog) scan(ctx context.Context, old *Snapshot, mode scanMode, mark func(ino uint64)) (*Snapshot, error) {
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
		sc := &scanner{c: c, ctx: sctx, sem: make(chan struct{}, c.cfg.ScanWorkers), byDir: mode.byDir, reread: mode.reread, mark: mark}
		if sc.mark == nil {
			sc.mark = func(uint64) {}
		}
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

type scanner struct {
	c       *Catalog
	ctx     context.Context
	entries atomic.Int64  // read so far; past MaxEntries, the scan stops
	sem     chan struct{} // bounds directories read at once
	wg      sync.WaitGroup
	skipped atomic.Int64
	rootErr error           // set only by the root directory's goroutine
	byDir   bool            // keep the entries of directories unchanged since the old snapshot
	reread  map[uint64]bool // with byDir, directories listed again whatever their times (read-only)
	trusted int64           // a directory's times say it is unchanged only if they are before this (ns)
	reused  atomic.Int64
	ops     atomic.Int64     // calls to SOURCE answered: a scan whose count stops moving has stalled
	noACL   atomic.Bool      // SOURCE keeps no ACLs: stop asking (acl.go)
	mark    func(ino uint64) // told of each entry read from SOURCE (scan)

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
		if err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			return false // changed under the scan: read d instead
		}
		if a, err := sc.acl(-1, full, e.Name, st.Mode); err != nil || fillACL(e, &st, a, &last) != nil {
			return false
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
	if sc.byDir && !sc.reread[d.Ino] && unchanged(d, old, sc.trusted) {
		if !sc.acquire() {
			return
		}
		ok := sc.reuse(d, old)
		<-sc.sem
		if ok {
			sc.mark(d.Ino) // its listing is as saved: its entries keep what they had
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
	sc.mark(d.Ino)
	if len(kids) == 0 {
		return
	}
	d.more = &more{kids: kids}
	for i := range kids {
		e := &kids[i]
		e.parent = d
		fresh := e.Ino == 0 // not kept from old by keepEntry
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
		if fresh {
			sc.mark(e.Ino)
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
		a, err := sc.acl(fd, full, name, st.Mode)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				sc.skipped.Add(1)
				continue
			}
			if e, ok := sc.keepEntry(d, old, name, err); ok {
				out = append(out, e)
			}
			continue
		}
		e := Entry{Name: arena.intern(name)}
		if err := fillACL(&e, &st, a, &last); err != nil {
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
	a, _, err := readACL(-1, path, "", st.Mode)
	if err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if err := fillACL(e, &st, a, nil); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	return nil
}

// fill sets e's metadata from st, its owner through last (setOwnerACL),
// without an ACL.
func fill(e *Entry, st *unix.Stat_t, last *lastOwner) error { return fillACL(e, st, nil, last) }

// fillACL sets e's metadata from st, its owner and ACL a through last
// (setOwnerACL). It fails only if the process has run out of owner or ACL
// indexes (owner.go, acl.go), with everything else set.
func fillACL(e *Entry, st *unix.Stat_t, a *ACL, last *lastOwner) error {
	e.Mode = st.Mode
	e.Size = st.Size
	e.Mtime = st.Mtim.Nano()
	e.Ctime = st.Ctim.Nano()
	e.SrcIno = st.Ino
	return e.setOwnerACL(st.Uid, st.Gid, a, last)
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}
