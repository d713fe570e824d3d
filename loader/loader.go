// Package loader serves sample bytes from the fastest tier that holds them:
// the RAM cache, then the SSD store, then SOURCE on the PFS.
//
// # Blocks
//
// A file is cached in blocks of Config.BlockSize bytes; a sample smaller
// than a block (the common case) is one block holding the whole file. A
// block's key is the file's path, a NUL and the block number; its value
// carries the file's identity, so a changed file misses in every tier.
//
// # Fetching
//
// Concurrent misses on one block share a single fetch. A block read from the
// PFS goes into the RAM tier and is queued for the SSD tier; a block found on
// the SSD is promoted to RAM. Returned slices alias cached blocks and must not
// be modified.
//
// # Prefetching
//
// A Stage (the prefetcher) may hold blocks fetched ahead of their reads.
// A demand read looks in RAM, then takes the block from the stage (offering
// it to RAM, which keeps it only if its next use warrants), then fetches.
// Prefetch fetches go through the same deduplication as demand fetches: a
// demand read of a block being prefetched waits for that fetch instead of
// starting another. Every demand read is reported to the Stage with the
// time it waited on the PFS, so the prefetcher can track consumption.
//
// # Cluster
//
// When a Remote is set, a block another node owns is fetched from it
// (tier "peer") before the PFS is tried, and is not kept in this node's RAM:
// the RAM tiers of the nodes hold disjoint partitions.
//
// # Accounting
//
// Every read is counted once, under the tier that supplied its bytes:
// a read that waited for another reader's PFS fetch counts as a PFS read;
// a read served from the stage counts as a RAM read.
package loader

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/ramcache"
	"github.com/dlfs/dlfs/source"
	"github.com/dlfs/dlfs/ssdstore"
)

// Config configures a Loader.
type Config struct {
	BlockSize int64        // default 1 MiB
	Logger    *slog.Logger // nil: discard
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{BlockSize: 1 << 20} }

// tier names where bytes came from.
type tier int

const (
	tierRAM tier = iota
	tierSSD
	tierPeer
	tierPFS
	numTiers
)

var tierNames = [numTiers]string{"ram", "ssd", "peer", "pfs"}

// Served counts reads and bytes served from one tier.
type Served struct {
	Reads int64 `json:"reads"`
	Bytes int64 `json:"bytes"`
}

// Stats are the loader's counters: reads served per tier.
type Stats struct {
	Served map[string]Served `json:"served"`
}

// Dependencies the loader reads through; small interfaces where used.
type (
	// PFS reads files from SOURCE.
	PFS interface {
		ReadAt(path string, want source.Want, p []byte, off int64) (int, error)
	}
	// SSD is the persistent tier. It may be nil.
	SSD interface {
		Get(key string, size, mtime int64) (ssdstore.Block, bool, error)
		Put(key string, b ssdstore.Block) error
		Delete(key string)
	}
	// Remote fetches a block from the peer that owns it. It reports false
	// when this node owns the block, or the peer failed or was too slow:
	// the caller then reads the PFS. It may be nil.
	Remote interface {
		Fetch(e *catalog.Entry, i int64) ([]byte, bool)
	}
	// Stage holds prefetched blocks and watches demand reads. It may be nil.
	Stage interface {
		// Take returns the staged block key of e, if any, and unstages it
		// if done (the read reaches the block's end; an earlier part of a
		// block is read again by the next request for the rest).
		Take(key string, e *catalog.Entry, done bool) (ramcache.Block, bool)
		// Hold stages a block that a read fetched only in part and that RAM
		// would not keep, so the read of the rest does not fetch it again.
		Hold(key string, b ramcache.Block)
		// Observe reports a demand read of e at off that waited this long
		// on the PFS (0 when a tier or the stage had it).
		Observe(e *catalog.Entry, off int64, waited time.Duration)
	}
)

// Loader is safe for concurrent use. Read blocks on the SSD and the PFS.
type Loader struct {
	cfg Config
	log *slog.Logger
	ram *ramcache.Cache
	ssd SSD // nil when the SSD tier is off
	pfs PFS

	stage  atomic.Pointer[stageBox]  // nil until SetStage
	remote atomic.Pointer[remoteBox] // nil until SetRemote

	flight flight
	reads  [numTiers]atomic.Int64
	bytes  [numTiers]atomic.Int64
}

// New returns a loader over the given tiers. ssd may be nil (an untyped
// nil, not a nil *ssdstore.Store).
func New(cfg Config, ram *ramcache.Cache, ssd SSD, pfs PFS) *Loader {
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = DefaultConfig().BlockSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Loader{cfg: cfg, log: cfg.Logger, ram: ram, ssd: ssd, pfs: pfs}
}

type stageBox struct{ s Stage }

type remoteBox struct{ r Remote }

// SetRemote installs the peer tier. Safe to call while reads run.
func (l *Loader) SetRemote(r Remote) { l.remote.Store(&remoteBox{r}) }

// SetStage installs the prefetcher's stage. Safe to call while reads run.
func (l *Loader) SetStage(s Stage) { l.stage.Store(&stageBox{s}) }

// BlockSize returns the block size.
func (l *Loader) BlockSize() int64 { return l.cfg.BlockSize }

// BlockKey is the cache key of block i of the file at path.
func BlockKey(path string, i int64) string {
	return path + "\x00" + strconv.FormatInt(i, 10)
}

// ReadAt returns up to len(dest) bytes of file e at off. The result is a
// slice of a cached block when the range lies in one block, or of dest
// otherwise. It returns an empty slice at or past end of file. The read is
// reported to the stage, once, with the time it waited on the PFS.
func (l *Loader) ReadAt(e *catalog.Entry, dest []byte, off int64) ([]byte, error) {
	if off >= e.Size || len(dest) == 0 {
		return dest[:0], nil
	}
	end := min(off+int64(len(dest)), e.Size)
	bs := l.cfg.BlockSize
	first, last := off/bs, (end-1)/bs
	var (
		from   tier
		waited time.Duration
		out    []byte
	)
	if first == last {
		b, t, w, err := l.block(e, first, end == min((first+1)*bs, e.Size))
		if err != nil {
			return nil, err
		}
		from, waited, out = t, w, b[off-first*bs:end-first*bs]
	} else {
		n := 0
		for i := first; i <= last; i++ {
			b, t, w, err := l.block(e, i, end >= min((i+1)*bs, e.Size))
			if err != nil {
				return nil, err
			}
			from = max(from, t) // the slowest tier involved supplied the read
			waited += w
			lo := max(off, i*bs) - i*bs
			hi := min(end, (i+1)*bs) - i*bs
			n += copy(dest[n:], b[lo:hi])
		}
		out = dest[:n]
	}
	l.count(from, int64(len(out)))
	if s := l.stage.Load(); s != nil {
		s.s.Observe(e, off, waited)
	}
	return out, nil
}

func (l *Loader) count(t tier, n int64) {
	l.reads[t].Add(1)
	l.bytes[t].Add(n)
}

// block returns block i of e for a demand read, the tier it came from and
// how long it waited on the PFS. done says the read reaches the block's
// end.
func (l *Loader) block(e *catalog.Entry, i int64, done bool) ([]byte, tier, time.Duration, error) {
	key := BlockKey(e.Path, i)
	if b, ok := l.ram.Get(key, e.Size, e.Mtime); ok {
		return b.Data, tierRAM, 0, nil
	}
	if s := l.stage.Load(); s != nil {
		if b, ok := s.s.Take(key, e, done); ok {
			if done && !b.Peer {
				l.ram.Put(key, b) // kept only if its next use warrants it
			}
			return b.Data, tierRAM, 0, nil
		}
	}
	start := time.Now()
	c, _ := l.flight.do(key, func() ([]byte, tier, error) { return l.load(e, i, true) })
	if c.err != nil {
		return nil, c.src, 0, c.err
	}
	// A block from a peer stays with its owner: caching it here too would
	// spend this node's share of the cluster's RAM on another's partition.
	b := ramcache.Block{ID: e.Ino, Data: c.val, Size: e.Size, Mtime: e.Mtime, Sum: c.sum}
	if (c.src == tierPeer || !l.ram.Put(key, b)) && !done {
		if s := l.stage.Load(); s != nil {
			s.s.Hold(key, b)
		}
	}
	var waited time.Duration
	if c.src == tierPFS {
		waited = time.Since(start)
	}
	return c.val, c.src, waited, nil
}

// Prefetch loads every block of e that RAM lacks, from the SSD or the PFS,
// sharing fetches with concurrent demand reads, and returns them by block
// number. It does not put them in RAM: the caller stages them.
func (l *Loader) Prefetch(e *catalog.Entry) (map[int64]ramcache.Block, error) {
	n := max((e.Size+l.cfg.BlockSize-1)/l.cfg.BlockSize, 1)
	out := make(map[int64]ramcache.Block, n)
	for i := int64(0); i < n; i++ {
		key := BlockKey(e.Path, i)
		if l.ram.Contains(key) {
			continue
		}
		c, _ := l.flight.do(key, func() ([]byte, tier, error) { return l.load(e, i, true) })
		if c.err != nil {
			return nil, c.err
		}
		out[i] = ramcache.Block{ID: e.Ino, Data: c.val, Size: e.Size, Mtime: e.Mtime, Sum: c.sum, Peer: c.src == tierPeer}
	}
	return out, nil
}

// Serve returns block i of e for a peer that asked this node, its owner:
// from RAM, the SSD or the PFS, never from another peer (two nodes whose
// views differ must not bounce a request between them). The block stays
// cached here.
func (l *Loader) Serve(e *catalog.Entry, i int64) ([]byte, error) {
	key := BlockKey(e.Path, i)
	if b, ok := l.ram.Get(key, e.Size, e.Mtime); ok {
		return b.Data, nil
	}
	if s := l.stage.Load(); s != nil {
		if b, ok := s.s.Take(key, e, false); ok && !b.Peer { // staged for a local rank: leave it there
			return b.Data, nil
		}
	}
	c, _ := l.flight.do(key, func() ([]byte, tier, error) { return l.load(e, i, false) })
	if c.err != nil {
		return nil, c.err
	}
	l.ram.Put(key, ramcache.Block{ID: e.Ino, Data: c.val, Size: e.Size, Mtime: e.Mtime, Sum: c.sum})
	return c.val, nil
}

// load reads block i of e from the SSD, the owning peer (if remote) or the
// PFS, and queues a PFS read for the SSD. It runs inside a flight.
func (l *Loader) load(e *catalog.Entry, i int64, remote bool) ([]byte, tier, error) {
	key := BlockKey(e.Path, i)
	if l.ssd != nil {
		b, ok, err := l.ssd.Get(key, e.Size, e.Mtime)
		if err != nil && !errors.Is(err, ssdstore.ErrClosed) {
			l.log.Warn("loader: SSD read failed; reading the PFS", "path", e.Path, "err", err)
		}
		if ok {
			return b.Data, tierSSD, nil
		}
	}
	bs := l.cfg.BlockSize
	n := min(bs, e.Size-i*bs)
	if r := l.remote.Load(); remote && r != nil {
		if b, ok := r.r.Fetch(e, i); ok && int64(len(b)) == n {
			return b, tierPeer, nil
		}
	}
	buf := make([]byte, n)
	got, err := l.pfs.ReadAt(e.Path, source.Want{Size: e.Size, Mtime: e.Mtime}, buf, i*bs)
	if err != nil {
		return nil, tierPFS, err
	}
	if int64(got) != n {
		return nil, tierPFS, fmt.Errorf("loader: %s: short read at %d: got %d of %d bytes; the file shrank, write 'refresh' to the control file",
			e.Path, i*bs, got, n)
	}
	if l.ssd != nil {
		if err := l.ssd.Put(key, ssdstore.Block{Data: buf, Size: e.Size, Mtime: e.Mtime, Sum: ssdstore.Checksum(buf)}); err != nil &&
			!errors.Is(err, ssdstore.ErrClosed) && !errors.Is(err, ssdstore.ErrBusy) {
			l.log.Warn("loader: SSD write failed", "path", e.Path, "err", err)
		}
	}
	return buf, tierPFS, nil
}

// Invalidate drops every cached block of e (an entry of an older snapshot)
// from all tiers.
func (l *Loader) Invalidate(e *catalog.Entry) {
	if !e.IsRegular() {
		return
	}
	blocks := max((e.Size+l.cfg.BlockSize-1)/l.cfg.BlockSize, 1)
	for i := int64(0); i < blocks; i++ {
		key := BlockKey(e.Path, i)
		l.ram.Delete(key)
		if l.ssd != nil {
			l.ssd.Delete(key)
		}
	}
}

// Stats returns the per-tier counters.
func (l *Loader) Stats() Stats {
	s := Stats{Served: make(map[string]Served, numTiers)}
	for t := tier(0); t < numTiers; t++ {
		s.Served[tierNames[t]] = Served{Reads: l.reads[t].Load(), Bytes: l.bytes[t].Load()}
	}
	return s
}
