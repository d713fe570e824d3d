// Package loader serves sample bytes from the fastest tier that holds them:
// the RAM cache, then the SSD store, then SOURCE on the PFS.
//
// # Blocks
//
// A file is cached in blocks of Config.BlockSize bytes; a sample smaller
// than a block (the common case) is one block holding the whole file. A
// block's key is the file's path, a NUL and the block number; its value
// carries a tag of the dataset, the key and the file's version, and a sum
// over tag and bytes (package integrity). Every tier checks both before it
// returns a block, so a changed file, another dataset's block or a
// damaged one misses in every tier. The sum is made once, where the bytes
// passed SOURCE's version check, and travels with them: to RAM, the
// stage, the SSD and the peers that ask this node. Bytes from a peer are
// checked against the sum it sends under this node's own tag.
//
// # Fetching
//
// Concurrent misses on one version of a block share a single fetch. A block read from the
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
// starting another. ReadAtWaited says how long a demand read waited on the
// PFS; its caller reports the read to the prefetcher, which tracks
// consumption by reader.
//
// # Cluster
//
// With a Remote (Config.Remote), a block another node owns can be fetched from it
// (tier "peer"), and is not kept in this node's RAM: the RAM tiers of the
// nodes hold disjoint partitions.
//
// # Choice of source
//
// RAM and the stage are looked in first: their bytes are already in
// memory. Past them, the SSD and the owning peer are tried in the order of
// a performance model (package perfmodel) fitted to the reads made from
// each, and the PFS last. A source that fails (an error, or no answer by
// its deadline) is skipped for a while and the next one tried, so a dead,
// stuck or erring peer costs the reader no error. A reader whose context
// is done (a FUSE request the kernel interrupted) stops waiting at once,
// whichever source it waits on, and no source after it is tried.
//
// The PFS is shared: what one node measures of it hides what its reads
// cost the others, and a sample read from it by a node that does not own
// it is read from it twice. So by default a reachable copy is never
// skipped for the PFS on speed alone. With Config.PFSMargin set, a waiting
// reader goes to the PFS before every copy the model expects to be that
// many times slower (prefetches still wait for the copy: their latency is
// hidden); such a copy not measured for a second is tried just before the
// PFS anyway, which is how one that was slow is seen to recover.
//
// # Coalescing
//
// Over a packed dataset (a PFS that is a Coalescer), neighbouring samples
// of one container can be read in one request: the prefetcher's runs
// (coalesce.go) and demand reads that queue on a busy container
// (combine.go). Package runs plans the runs; readRun reads each once, and
// its samples one by one if it fails.
//
// # Accounting
//
// Every read is counted once, under the tier that supplied its bytes:
// a read that waited for another reader's PFS fetch counts as a PFS read;
// a read served from the prefetcher's stage counts under "stage".
package loader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/loader/runs"
	"github.com/dlfs/dlfs/perfmodel"
	"github.com/dlfs/dlfs/ramcache"
	"github.com/dlfs/dlfs/source"
	"github.com/dlfs/dlfs/ssdstore"
)

// Config configures a Loader.
type Config struct {
	BlockSize int64 // default 1 MiB
	// Dataset is the identity every block's tag is bound to.
	Dataset integrity.Dataset
	// Model estimates each source's speed; nil makes one with the
	// defaults. The loader records every read and failure in it.
	Model *perfmodel.Model
	// PFSMargin is how many times slower than the PFS a cached copy must
	// be expected to be before a waiting reader reads the PFS instead;
	// 0 (the default) never skips a reachable copy on speed alone.
	PFSMargin float64
	// NoCoalesce reads every sample of a packed dataset with its own
	// request (for comparison; coalescing is the default).
	NoCoalesce bool
	// DemandPerContainer bounds the demand reads of one packed container
	// in flight; reads past it wait and are combined (see combine.go).
	DemandPerContainer int // default 16
	// PFSTimeout bounds every read of SOURCE: past it, the read fails
	// with ErrPFSTimeout (ETIMEDOUT) and is abandoned (see deadline.go).
	PFSTimeout time.Duration // default 1 minute
	// PFSCalls bounds the reads of SOURCE in flight, abandoned ones
	// included: each holds a goroutine and up to a block of memory.
	PFSCalls int // default 256
	// FailureTTL is how long a failed read of SOURCE is remembered and
	// answered without another try (failures.go); 0 takes the default.
	FailureTTL time.Duration // default 2s
	// ReadAhead bounds the bytes fetched ahead of one reader moving
	// forward through a file (readahead.go), ReadAheadTotal those of all
	// readers together; NoReadAhead turns read-ahead off (for comparison).
	ReadAhead      int64 // default 16 MiB
	ReadAheadTotal int64 // default 64 MiB
	NoReadAhead    bool
	// Stage is the prefetcher's stage (see Prefetching), and Remote the
	// peer tier (see Cluster); nil: none. Each a nil interface, not a nil
	// pointer.
	Stage  Stage
	Remote Remote
	Logger *slog.Logger // nil: discard
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{BlockSize: 1 << 20, DemandPerContainer: 16, PFSTimeout: time.Minute, PFSCalls: 256, FailureTTL: 2 * time.Second,
		ReadAhead: 16 << 20, ReadAheadTotal: 64 << 20}
}

// Validate reports the first setting that is out of range.
func (c Config) Validate() error {
	switch {
	case c.BlockSize < 0:
		return fmt.Errorf("loader: block size %d is negative", c.BlockSize)
	case c.PFSTimeout < 0:
		return fmt.Errorf("loader: PFS timeout %s is negative; give a duration such as 1m", c.PFSTimeout)
	case c.PFSCalls < 0:
		return fmt.Errorf("loader: %d PFS calls is negative", c.PFSCalls)
	case c.FailureTTL < 0:
		return fmt.Errorf("loader: failure TTL %s is negative", c.FailureTTL)
	case c.PFSMargin < 0:
		return fmt.Errorf("loader: PFS margin %g is negative", c.PFSMargin)
	case c.ReadAhead < 0 || c.ReadAheadTotal < 0:
		return fmt.Errorf("loader: read-ahead bounds %d and %d: neither may be negative", c.ReadAhead, c.ReadAheadTotal)
	}
	return nil
}

// tier names where bytes came from.
type tier int

const (
	tierRAM   tier = iota
	tierStage      // the prefetcher's stage: fetched ahead for this read
	tierSSD
	tierPeer
	tierMoved // from the previous owner's caches: now this node's own
	tierPFS
	numTiers
)

var tierNames = [numTiers]string{"ram", "stage", "ssd", "peer", "moved", "pfs"}

// Served counts reads and bytes served from one tier.
type Served struct {
	Reads int64 `json:"reads"`
	Bytes int64 `json:"bytes"`
}

// Stats are the loader's counters: reads served per tier; blocks fetched
// past RAM per tier, for readers, prefetches and peers alike; and the
// model's estimate of each source.
type Stats struct {
	Served  map[string]Served           `json:"served"`
	Fetched map[string]Served           `json:"fetched"`
	Sources map[string]perfmodel.Source `json:"sources"`
	// Runs counts coalesced PFS reads, and RunSamples the samples they
	// brought in (part of fetched.pfs).
	Runs       int64 `json:"coalesced_reads"`
	RunSamples int64 `json:"coalesced_samples"`
	// PFSStuck counts reads of SOURCE abandoned at their deadline that
	// the kernel has not answered yet.
	PFSStuck int64 `json:"pfs_stuck"`
	// CopiedBytes counts bytes of reads assembled from several blocks: the
	// only reads dlfs copies in its own memory (one that lies in one block
	// is answered from the block itself).
	CopiedBytes int64 `json:"copied_bytes"`
	// ReadAhead counts the blocks fetched ahead of readers within files.
	ReadAhead ReadAheadStats `json:"read_ahead"`
}

// Dependencies the loader reads through; small interfaces where used.
type (
	// PFS reads files from SOURCE.
	PFS interface {
		ReadAt(path string, want source.Version, p []byte, off int64) (int, error)
	}
	// SSD is the persistent tier. It may be nil.
	SSD interface {
		Get(key string, tag uint64) (ssdstore.Block, bool, error)
		Put(key string, b ssdstore.Block) error
		Delete(key string)
	}
	// Coalescer is a PFS whose samples lie in larger containers (a packed
	// dataset): neighbouring samples can be read in one request.
	Coalescer interface {
		// Locate says where the sample at path lies: its container and
		// the offset and length of its bytes there.
		Locate(path string) (Span, bool)
		// ReadRun reads the samples at paths, all of one container and in
		// offset order, with one request from the first's start to the
		// last's end; it returns each sample's bytes.
		ReadRun(paths []string, wants []source.Version) ([][]byte, error)
	}
	// Remote fetches blocks from the peers that own them. It may be nil.
	Remote interface {
		// Owner names the peer that owns e, or reports false when this
		// node owns it or no peer can serve it.
		Owner(e *catalog.Entry) (string, bool)
		// Fetch returns block i of e from peer, with the sum the peer
		// sent (checked by the loader), or an error when the peer failed
		// or was too slow, or one wrapping ErrNoBlock when it answered
		// but could not serve this block. It stops waiting, with ctx's
		// error, when ctx is done.
		Fetch(ctx context.Context, peer string, e *catalog.Entry, i int64) ([]byte, uint32, error)
		// Previous names the peer that owned e before the last change
		// of placement, if it is another alive node than the owner.
		Previous(e *catalog.Entry) (string, bool)
		// FetchCached asks peer for block i of e from its caches only
		// (ErrNoBlock if it does not hold it). It stops waiting, with
		// ctx's error, when ctx is done.
		FetchCached(ctx context.Context, peer string, e *catalog.Entry, i int64) ([]byte, uint32, error)
	}
	// Stage holds prefetched blocks. It may be nil.
	Stage interface {
		// Take returns the staged block key, if any and tagged tag (one of
		// another version is dropped), and unstages it if done (the read
		// reaches the block's end; an earlier part of a block is read
		// again by the next request for the rest).
		Take(key string, tag uint64, done bool) (ramcache.Block, bool)
		// Serve returns the staged block key, if any and tagged tag, and
		// counts bytes lo to hi of it (hi < 0: to its end) as read; it
		// unstages the block (gone) once every page of it was read. The
		// kernel sends a file's READs out of order: one that reaches a
		// block's end may come before one of an earlier part of it.
		Serve(key string, tag uint64, lo, hi int) (_ ramcache.Block, ok, gone bool)
		// Hold stages a block that a read fetched only in part and that RAM
		// would not keep, so the read of the rest does not fetch it again.
		Hold(key string, b ramcache.Block)
	}
)

// Span is where a sample's bytes lie in a packed container.
type Span = runs.Span

// ErrNoBlock means a peer answered but could not serve a block (its view
// of the file differs, or its own read failed): the peer is not at fault
// for other blocks.
var ErrNoBlock = errors.New("peer could not serve the block")

// Loader is safe for concurrent use. Read blocks on the SSD and the PFS.
type Loader struct {
	cfg   Config
	log   *slog.Logger
	model *perfmodel.Model
	ram   *ramcache.Cache
	ssd   SSD // nil when the SSD tier is off
	pfs   PFS

	stage  Stage  // nil without a prefetcher
	remote Remote // nil without a cluster

	flight flight
	reads  [numTiers]atomic.Int64
	bytes  [numTiers]atomic.Int64
	// fetches and fetched count what load brought in, by tier.
	fetches [numTiers]atomic.Int64
	fetched [numTiers]atomic.Int64
	// runs and runSamples count coalesced PFS reads and the samples in them.
	runs, runSamples atomic.Int64
	copied           atomic.Int64 // bytes of reads assembled from several blocks
	narrowed         atomic.Int64 // bytes of random readers' reads of their range alone (narrow.go)
	combine          combiner

	pfsSlots  chan struct{} // one per read of SOURCE in flight (deadline.go)
	pfsStuck  atomic.Int64  // reads of SOURCE abandoned at their deadline, still in the kernel
	failed    failures      // reads of SOURCE that failed lately (failures.go)
	ahead     readAhead     // blocks fetched ahead of readers within files (readahead.go)
	aheadCtx  context.Context
	aheadStop context.CancelFunc // ends the read-ahead fetches at Close
	closed    chan struct{}      // closed by Close
	closeOnce sync.Once
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
	if cfg.Model == nil {
		cfg.Model = perfmodel.New(perfmodel.DefaultConfig())
	}
	if cfg.DemandPerContainer <= 0 {
		cfg.DemandPerContainer = DefaultConfig().DemandPerContainer
	}
	if cfg.PFSTimeout <= 0 {
		cfg.PFSTimeout = DefaultConfig().PFSTimeout
	}
	if cfg.PFSCalls <= 0 {
		cfg.PFSCalls = DefaultConfig().PFSCalls
	}
	if cfg.FailureTTL <= 0 {
		cfg.FailureTTL = DefaultConfig().FailureTTL
	}
	if cfg.ReadAhead <= 0 {
		cfg.ReadAhead = DefaultConfig().ReadAhead
	}
	if cfg.ReadAheadTotal <= 0 {
		cfg.ReadAheadTotal = DefaultConfig().ReadAheadTotal
	}
	closed := make(chan struct{})
	l := &Loader{cfg: cfg, log: cfg.Logger, model: cfg.Model, ram: ram, ssd: ssd, pfs: pfs, stage: cfg.Stage, remote: cfg.Remote,
		pfsSlots: make(chan struct{}, cfg.PFSCalls), closed: closed}
	l.aheadCtx, l.aheadStop = context.WithCancel(context.Background())
	l.flight.stop = closed
	return l
}

// Close makes every wait on a fetch or on the PFS end at once with
// ErrClosed, and waits for the fetches running to end (each does at once,
// leaving a PFS read stuck in the kernel behind). Reads after Close fail.
func (l *Loader) Close() error {
	l.closeOnce.Do(func() {
		close(l.closed)
		l.aheadStop()
	})
	l.flight.stopAndWait()
	l.closeAhead()
	return nil
}

// BlockSize returns the block size.
func (l *Loader) BlockSize() int64 { return l.cfg.BlockSize }

// BlockKey is the cache key of block i of the file at path.
func BlockKey(path string, i int64) string {
	return blockPrefix(path) + strconv.FormatInt(i, 10)
}

// blockPrefix is what every block key of the file at path begins with.
func blockPrefix(path string) string { return path + "\x00" }

// Blocks is how many blocks of bs bytes a file of size bytes is cached
// in: at least one, for an empty file. It cannot overflow, whatever size.
func Blocks(size, bs int64) int64 {
	n := size / bs
	if size%bs != 0 || n == 0 {
		n++
	}
	return n
}

// wholeBlock fails unless b is as long as block i of e: every tier checks
// a block's version, so a block of another length is a bug, and is a miss
// rather than a panic or wrong bytes.
func wholeBlock(e *catalog.Entry, i, bs int64, b []byte) error {
	if want := blockEnd(e.Size, bs, i) - i*bs; int64(len(b)) != want {
		return fmt.Errorf("%w: %s: block %d is %d bytes, the catalog's version has %d", source.ErrChanged, e.Path(), i, len(b), want)
	}
	return nil
}

// blockEnd is where block i of a file of size bytes ends: (i+1)*bs, or
// size for the last, computed so that it cannot overflow near 2^63.
func blockEnd(size, bs, i int64) int64 { return i*bs + min(bs, size-i*bs) }

// Tag is the integrity tag of the block with key of e in this loader's
// dataset.
func (l *Loader) Tag(e *catalog.Entry, key string) uint64 { return BlockTag(l.cfg.Dataset, e, key) }

// BlockTag is the integrity tag of the block with key of e in dataset d:
// what Loader.Tag answers, for those made before the loader (the peer
// tier, which asks peers by it).
func BlockTag(d integrity.Dataset, e *catalog.Entry, key string) uint64 {
	return integrity.Tag(d, key, e.Version())
}

// blockOf is f, block key of e, as the RAM tier and the stage keep it.
func blockOf(e *catalog.Entry, tag uint64, f fetch) ramcache.Block {
	return ramcache.Block{ID: e.Ino, Data: f.val, Tag: tag, Sum: f.sum, Segs: integrity.Segments(tag, f.val), Peer: f.src == tierPeer}
}

// part is the bytes lo to hi of a block that a read serves: what it
// checks of a block that has segment sums (integrity.CheckRange). hi < 0
// is the block's end.
type part struct{ lo, hi int }

// whole is all of a block.
var whole = part{0, -1}

// intact reports whether p of block b, tagged tag, is intact.
func (p part) intact(tag uint64, b ramcache.Block) bool {
	hi := p.hi
	if hi < 0 {
		hi = len(b.Data)
	}
	return integrity.CheckRange(tag, b.Sum, b.Segs, b.Data, p.lo, hi)
}

// ReadAt returns up to len(dest) bytes of file e at off. The result is a
// slice of a cached block when the range lies in one block, or of dest
// otherwise. It returns an empty slice at or past end of file. It stops
// waiting, with ctx's error, when ctx is done.
func (l *Loader) ReadAt(ctx context.Context, e *catalog.Entry, dest []byte, off int64) ([]byte, error) {
	b, _, _, err := l.ReadAtWaited(ctx, e, dest, off)
	return b, err
}

// ReadAtWaited is ReadAt that also says which tier supplied the read (the
// slowest, for a read of several blocks: "ram", "stage", "ssd", "peer",
// "moved" or "pfs") and how long it waited on the PFS (0: a hit).
func (l *Loader) ReadAtWaited(ctx context.Context, e *catalog.Entry, dest []byte, off int64) ([]byte, string, time.Duration, error) {
	if off < 0 || off >= e.Size || len(dest) == 0 {
		return dest[:0], tierNames[tierRAM], 0, nil
	}
	var held []string // blocks this read fetched, held until it returns
	defer func() {
		for _, key := range held {
			l.flight.release(key)
		}
	}()
	end := off + min(int64(len(dest)), e.Size-off) // never past 2^63-1
	bs := l.cfg.BlockSize
	first, last := off/bs, (end-1)/bs
	random := l.readAheadFor(e, off, end)
	var (
		from   tier
		waited time.Duration
		out    []byte
	)
	narrowed := false
	if random && end-off < blockEnd(e.Size, bs, last)-first*bs && l.narrows(e) {
		b, w, ok, err := l.readNarrow(ctx, e, first, last, off, end)
		if err != nil {
			return nil, "", 0, err
		}
		narrowed, from, waited, out = ok, tierPFS, w, b
	}
	switch {
	case narrowed: // its range alone, from the PFS
	case first == last:
		b, t, w, err := l.block(ctx, e, first, end == blockEnd(e.Size, bs, first), part{int(off - first*bs), int(end - first*bs)}, &held)
		if err != nil {
			return nil, "", 0, err
		}
		if err := wholeBlock(e, first, bs, b); err != nil {
			return nil, "", 0, err
		}
		from, waited, out = t, w, b[off-first*bs:end-first*bs]
	default:
		n := 0
		for i := first; i <= last; i++ {
			p := part{int(max(off, i*bs) - i*bs), int(min(end, blockEnd(e.Size, bs, i)) - i*bs)}
			b, t, w, err := l.block(ctx, e, i, end >= blockEnd(e.Size, bs, i), p, &held)
			if err != nil {
				return nil, "", 0, err
			}
			if err := wholeBlock(e, i, bs, b); err != nil {
				return nil, "", 0, err
			}
			from = max(from, t) // the slowest tier involved supplied the read
			waited += w
			lo := max(off, i*bs) - i*bs
			hi := min(end, blockEnd(e.Size, bs, i)) - i*bs
			n += copy(dest[n:], b[lo:hi])
		}
		out = dest[:n]
		l.copied.Add(int64(n))
	}
	l.count(from, int64(len(out)))
	return out, tierNames[from], waited, nil
}

func (l *Loader) count(t tier, n int64) {
	l.reads[t].Add(1)
	l.bytes[t].Add(n)
}

// block returns block i of e for a demand read, the tier it came from and
// how long it waited on the PFS. done says the read reaches the block's
// end. A block it has to fetch (or wait for) is added to held: the read
// holds it until it returns (its caller then reports it).
func (l *Loader) block(ctx context.Context, e *catalog.Entry, i int64, done bool, p part, held *[]string) ([]byte, tier, time.Duration, error) {
	key := BlockKey(e.Path(), i)
	tag := l.Tag(e, key)
	if b, ok := l.ram.GetRange(key, tag, p.lo, p.hi); ok {
		return b.Data, tierRAM, 0, nil
	}
	if b, ok := l.fromStage(key, tag, e, p); ok {
		return b.Data, tierStage, 0, nil
	}
	if b, ok := l.fromAhead(e, i, key, tag, done, p); ok {
		return b.Data, tierStage, 0, nil
	}
	l.flight.hold(key)
	*held = append(*held, key)
	start := time.Now()
	kept := false
	var (
		c      *call
		shared bool
		err    error
	)
	// A shared fetch that its starter cancelled (a warm-up stopped in the
	// middle of a coalesced read) says nothing of the block: fetch again.
	for try := 0; try == 0 || (try < 3 && shared && errors.Is(c.err, context.Canceled)); try++ {
		c, shared, err = l.flight.do(ctx, key, tag, forReader, l.demandFetch(e, i, key, tag, p, &kept))
		if err != nil {
			return nil, tierPFS, 0, fmt.Errorf("read %s: %w", e.Path(), err)
		}
	}
	if c.err != nil {
		return nil, c.src, 0, c.err
	}
	if c.src <= tierStage { // in RAM, or taken from the stage, meanwhile
		if shared && c.src == tierStage && l.stage != nil {
			l.stage.Serve(key, tag, p.lo, p.hi) // this read's part of it
		}
		return c.val, c.src, 0, nil
	}
	ahead := false
	if shared {
		// A read-ahead that ran the flight holds the block until a read
		// reaches its end.
		_, ahead = l.takeAhead(e, i, key, tag, done, p)
	}
	var blk ramcache.Block // built once (its segment sums are a pass over it)
	blockOnce := func() ramcache.Block {
		if blk.Data == nil {
			blk = blockOf(e, tag, c.fetch)
		}
		return blk
	}
	if shared && c.src != tierPeer && (!ahead || done) {
		// The flight may have been a prefetch, which stages rather than
		// caches: this read offers the block to RAM itself (a read-ahead's
		// block once a read reaches its end: until then the read-ahead
		// holds it, and a later part of it must be taken from there).
		kept = l.ram.Put(key, blockOnce())
	}
	if l.stage != nil {
		switch {
		case kept:
			// A prefetch that ran the flight staged the block before it
			// ended; RAM has it now.
			l.stage.Take(key, tag, true)
		case !ahead:
			// Staged by the prefetch, or now if a plan needs it: the
			// block leaves the stage once reads have read all of it.
			l.stage.Hold(key, blockOnce())
			l.stage.Serve(key, tag, p.lo, p.hi)
		}
	}
	var waited time.Duration
	if c.src == tierPFS {
		waited = time.Since(start)
	}
	return c.val, c.src, waited, nil
}

// demandFetch is the fetch of block i of e (key, tag) that a demand read
// starts; kept says whether RAM kept it.
func (l *Loader) demandFetch(e *catalog.Entry, i int64, key string, tag uint64, p part, kept *bool) func(context.Context) (fetch, error) {
	return func(ctx context.Context) (fetch, error) {
		// A fetch that ended between the looks above and this flight left
		// the block in RAM or on the stage: do not read it again.
		if b, ok := l.ram.Get(key, tag); ok {
			return fetch{b.Data, tierRAM, b.Sum}, nil
		}
		if b, ok := l.fromStage(key, tag, e, p); ok {
			return fetch{b.Data, tierStage, b.Sum}, nil
		}
		f, err := l.load(ctx, e, i, tag, forReader)
		// A block from a peer stays with its owner: caching it here too
		// would spend this node's share of the cluster's RAM on another's
		// partition. Others are offered to RAM before the flight ends, so
		// a reader that just missed RAM finds them there.
		if err == nil && f.src != tierPeer {
			*kept = l.ram.Put(key, blockOf(e, tag, f))
		}
		return f, err
	}
}

// fromStage takes block key of e, whose tag is tag, from the stage, if
// it is there and intact, for a read of part p of it. Once reads have read
// all of it, it leaves the stage (Stage.Serve), and RAM keeps it if its
// next use warrants.
func (l *Loader) fromStage(key string, tag uint64, e *catalog.Entry, p part) (ramcache.Block, bool) {
	if l.stage == nil {
		return ramcache.Block{}, false
	}
	b, ok, gone := l.stage.Serve(key, tag, p.lo, p.hi)
	if !ok {
		return ramcache.Block{}, false
	}
	if !p.intact(tag, b) {
		l.log.Warn("loader: a staged block fails its checksum; reading it again", "path", e.Path())
		l.stage.Take(key, tag, true)
		return ramcache.Block{}, false
	}
	if gone && !b.Peer {
		l.ram.Put(key, b) // kept only if its next use warrants it
	}
	return b, true
}

// OnSSD reports whether the SSD tier holds e's first block, intact.
func (l *Loader) OnSSD(e *catalog.Entry) bool {
	if l.ssd == nil {
		return false
	}
	key := BlockKey(e.Path(), 0)
	_, ok, _ := l.ssd.Get(key, l.Tag(e, key))
	return ok
}

// InRAM reports whether RAM holds e's first block.
func (l *Loader) InRAM(e *catalog.Entry) bool { return l.ram.Contains(BlockKey(e.Path(), 0)) }

// Offer hands RAM a block the stage gives up, and reports whether RAM
// kept it. A peer's block is not kept (RAM holds this node's share).
func (l *Loader) Offer(key string, b ramcache.Block) bool {
	return !b.Peer && l.ram.Put(key, b)
}

// Keep is how the prefetcher stages what it fetched: block i of e. It runs
// before the fetch's flight ends, so that a read arriving just after finds
// the block staged instead of reading it again. It reports whether it
// staged the block.
type Keep func(e *catalog.Entry, i int64, b ramcache.Block) bool

// Prefetch loads every block of e that RAM lacks, from the SSD or the PFS,
// sharing fetches with concurrent demand reads, and hands each to keep
// (not to RAM); it returns how many keep staged. A block that a demand
// read is fetching, or has fetched and not yet returned (its caller has
// not reported it), is left to that read.
func (l *Loader) Prefetch(ctx context.Context, e *catalog.Entry, keep Keep) (int, error) {
	n := Blocks(e.Size, l.cfg.BlockSize)
	staged := 0
	for i := int64(0); i < n; i++ {
		if err := ctx.Err(); err != nil {
			return staged, fmt.Errorf("prefetch %s: %w", e.Path(), err)
		}
		key := BlockKey(e.Path(), i)
		held, in := l.readerIn(e, i)
		if in {
			break // a reader is in e: its read-ahead fetches the rest
		}
		tag := l.Tag(e, key)
		if held {
			// Fetched with the block before it (a short last block), by
			// this fetch or a reader's that left: staged with the rest, so
			// that the stage holds the file whole (a backing file is built
			// from it beside them).
			if b, ok := l.takeAhead(e, i, key, tag, false, whole); ok && keep(e, i, b.b) {
				l.takeAhead(e, i, key, tag, true, whole)
				staged++
			}
			continue
		}
		if l.ram.Contains(key) || l.flight.held(key) {
			continue // cached, or a demand read has it
		}
		took := false
		c, shared, err := l.flight.do(ctx, key, tag, forPrefetch, func(ctx context.Context) (fetch, error) {
			f, err := l.load(ctx, e, i, tag, forPrefetch)
			if err == nil {
				b := blockOf(e, tag, f)
				if took = keep(e, i, b); !took {
					l.keepForReader(e, i, b, f.src)
				}
			}
			return f, err
		})
		if err != nil {
			return staged, fmt.Errorf("prefetch %s: %w", e.Path(), err)
		}
		if c.err != nil {
			return staged, c.err
		}
		if shared && !c.read {
			took = keep(e, i, blockOf(e, tag, c.fetch)) // a peer's request ran the fetch
		}
		if took {
			staged++
		}
	}
	return staged, nil
}

// Serve returns block i of e for a peer that asked this node, its owner:
// from RAM, the SSD, the sample's previous owner's caches, or the PFS,
// never by forwarding to its owner (two nodes whose views differ must not
// bounce a request between them). The block stays cached here.
//
// It returns the bytes with their sum under the block's tag.
func (l *Loader) Serve(ctx context.Context, e *catalog.Entry, i int64) ([]byte, uint32, error) {
	key := BlockKey(e.Path(), i)
	tag := l.Tag(e, key)
	if b, ok := l.ram.Get(key, tag); ok {
		return b.Data, b.Sum, nil
	}
	if b, ok := l.staged(key, tag, e); ok {
		return b.Data, b.Sum, nil
	}
	c, _, err := l.flight.do(ctx, key, tag, forPeer, func(ctx context.Context) (fetch, error) { return l.load(ctx, e, i, tag, forPeer) })
	if err != nil {
		return nil, 0, fmt.Errorf("serve %s block %d: %w", e.Path(), i, err)
	}
	if c.err != nil {
		return nil, 0, c.err
	}
	l.ram.Put(key, blockOf(e, tag, c.fetch))
	return c.val, c.sum, nil
}

// staged returns block key of e if the stage holds it for a local rank,
// and intact, leaving it there.
func (l *Loader) staged(key string, tag uint64, e *catalog.Entry) (ramcache.Block, bool) {
	if l.stage == nil {
		return ramcache.Block{}, false
	}
	b, ok := l.stage.Take(key, tag, false)
	if !ok || b.Peer || !integrity.Check(tag, b.Sum, b.Data) {
		return ramcache.Block{}, false
	}
	return b, true
}

// Cached returns block i of e if this node's caches hold it: RAM, the
// stage or the SSD. It never reads the PFS or asks a peer: it answers a
// peer that took over a sample this node owned before.
func (l *Loader) Cached(e *catalog.Entry, i int64) ([]byte, uint32, bool) {
	key := BlockKey(e.Path(), i)
	tag := l.Tag(e, key)
	if b, ok := l.ram.Get(key, tag); ok {
		return b.Data, b.Sum, true
	}
	if b, ok := l.staged(key, tag, e); ok {
		return b.Data, b.Sum, true
	}
	if l.ssd != nil {
		if b, ok, _ := l.ssd.Get(key, tag); ok {
			return b.Data, b.Sum, true
		}
	}
	return nil, 0, false
}

// load reads block i of e: from the blocks fetched ahead, or through the
// chain of sources (sources.go: the SSD, the owning peer unless for a
// peer, the previous owner's caches, the PFS; see Choice of source). It
// runs inside a flight.
func (l *Loader) load(ctx context.Context, e *catalog.Entry, i int64, tag uint64, why purpose) (fetch, error) {
	if b, ok := l.takeAhead(e, i, BlockKey(e.Path(), i), tag, true, whole); ok {
		return fetch{b.b.Data, b.src, b.b.Sum}, nil // fetched with the block before it
	}
	f, err := l.loadFrom(ctx, e, i, tag, why)
	if err == nil {
		l.fetches[f.src].Add(1)
		l.fetched[f.src].Add(int64(len(f.val)))
	}
	return f, err
}

// toSSD queues a block of e read from the PFS, or moved from its previous
// owner, for the SSD tier, if there is one, under e's inode (the ID the
// tier asks a plan about). A full queue or a closing store drops it
// quietly.
func (l *Loader) toSSD(e *catalog.Entry, key string, tag uint64, f fetch) {
	if l.ssd == nil {
		return
	}
	if err := l.ssd.Put(key, ssdstore.Block{ID: e.Ino, Data: f.val, Tag: tag, Sum: f.sum}); err != nil &&
		!errors.Is(err, ssdstore.ErrClosed) && !errors.Is(err, ssdstore.ErrBusy) {
		l.log.Warn("loader: SSD write failed", "key", key, "err", err)
	}
}

// readPFS reads block i (n bytes) of e from SOURCE.
func (l *Loader) readPFS(ctx context.Context, e *catalog.Entry, i, n int64) ([]byte, error) {
	return l.readRange(ctx, e, i*l.cfg.BlockSize, n)
}

// readRange reads n bytes of e at off from SOURCE.
func (l *Loader) readRange(ctx context.Context, e *catalog.Entry, off, n int64) ([]byte, error) {
	type read struct {
		buf []byte
		got int
	}
	r, err := pfsCall(ctx, l, e.Path(), func() (read, error) {
		// A buffer of the call's own: an abandoned call still writes it.
		buf := make([]byte, n)
		got, err := l.pfs.ReadAt(e.Path(), e.Version(), buf, off)
		return read{buf, got}, err
	})
	if err != nil {
		return nil, err
	}
	buf, got := r.buf, r.got
	if int64(got) != n {
		return nil, fmt.Errorf("loader: %s: short read at %d: got %d of %d bytes; the file shrank, write 'refresh' to the control file",
			e.Path(), off, got, n)
	}
	return buf, nil
}

// walkBlocks is the most blocks of one file Invalidate deletes one by one.
const walkBlocks = 1 << 16

// Invalidate drops every cached block of e (an entry of an older snapshot)
// from all tiers.
func (l *Loader) Invalidate(e *catalog.Entry) {
	if !e.IsRegular() {
		return
	}
	l.failed.forget(failKey{e.Path(), e.Version()})
	l.forgetAhead(e.Path())
	blocks := Blocks(e.Size, l.cfg.BlockSize)
	if blocks > walkBlocks {
		// A sparse file may claim 2^43 blocks: walk what the tiers hold
		// instead.
		l.ram.DeleteID(e.Ino)
		if s, ok := l.ssd.(interface{ DeletePrefix(string) }); ok {
			s.DeletePrefix(blockPrefix(e.Path()))
			return
		}
		blocks = walkBlocks // an SSD tier that cannot walk: what a reader can have cached in practice
	}
	for i := int64(0); i < blocks; i++ {
		key := BlockKey(e.Path(), i)
		l.ram.Delete(key)
		if l.ssd != nil {
			l.ssd.Delete(key)
		}
	}
}

// Stats returns the per-tier counters.
func (l *Loader) Stats() Stats {
	s := Stats{Served: make(map[string]Served, numTiers), Fetched: make(map[string]Served, numTiers-2),
		Sources: l.model.Stats(), Runs: l.runs.Load(), RunSamples: l.runSamples.Load(), CopiedBytes: l.copied.Load(),
		PFSStuck: l.pfsStuck.Load(), ReadAhead: l.ReadAheadStats()}
	for t := tier(0); t < numTiers; t++ {
		s.Served[tierNames[t]] = Served{Reads: l.reads[t].Load(), Bytes: l.bytes[t].Load()}
		if t > tierStage {
			s.Fetched[tierNames[t]] = Served{Reads: l.fetches[t].Load(), Bytes: l.fetched[t].Load()}
		}
	}
	return s
}
