package daemon

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/backing"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/fusefs"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/ramcache"
)

// Passthrough (package fusefs) serves a file held whole from a sealed
// backing file the kernel reads itself. The node gives the mount those
// files (dataset.Backing):
//
//   - from the RAM tier, which holds a file's backing file as its copy of
//     the file (ramcache: Adopt) once one is built;
//   - built in the background once a reader has read the file to its end
//     while the RAM tier holds it whole (builder.go);
//   - else built at the open from the blocks the RAM tier and the
//     prefetcher's stage hold, each checked against its sum by
//     backing.Build; a file missing any block gets none, and is read
//     through the daemon. The stage's blocks then live in the backing
//     file, which the RAM tier adopts if its next use warrants it.
//
// A mount that uses passthrough answers OPEN for every file, so every file
// held whole gets a backing file: one that has none costs an OPEN and a
// READ, more than either way alone. Whether the mount uses it is
// Config.Passthrough: by default (auto) only for a dataset whose files
// average passthroughAutoMin or more, where it wins by measurement; a
// dataset of small files keeps FUSE no-open, under which a file in the
// mount's page cache is read with no request at all (docs/design.md).
//
// Each backing file holds a descriptor (and about 1 KiB of the kernel's
// memory, which the RAM tier counts) until its last reference goes:
// the tier's, the stage's, an open's, one the tier let go of while an
// open still holds it. They all count against one budget of descriptors,
// maxBackingFiles, half the descriptors this process may open
// (passthroughCounts.fds, counted from build to close): a build past it
// is refused, and its open is read through the daemon. (With 100-byte
// files, opens held while the tier evicted their files once took a
// daemon with 2,048 descriptors to EMFILE, and its reads of SOURCE
// failed with it.)
//
// The backing files held by opens are bounded by a quarter of the RAM
// tier's capacity (openBound), each charged its pages and openOverhead
// (openCharge): an open beyond it is read through the daemon. Those an
// eviction or a refresh took from the tier while open count against the
// capacity until they close (ramcache).
//
// Reads of a passthrough open never reach the daemon, so the open is the
// read (dataset.OpenedPassthrough): the reader tracker and the
// prefetcher learn of it as of a read at offset 0, which is what moves a
// job's cursor, in the order the reader opens its samples.

// Passthrough modes (Config.Passthrough).
const (
	PassthroughAuto = "auto" // on for a dataset whose files average passthroughAutoMin or more
	PassthroughOn   = "on"
	PassthroughOff  = "off"
)

// passthroughAutoMin is the mean file size from which auto uses
// passthrough.
const passthroughAutoMin = 1 << 20

// passthroughMode says whether a mount of files files of bytes in all,
// open to other users or not, tries passthrough under mode, and why not.
//
// Auto keeps it off for a mount open to other users (--allow-other):
// a reader's mmap of a file open by passthrough maps the daemon's
// backing file itself, and its pages stay in memory, charged to the
// daemon, until the reader unmaps them, after the open's RELEASE and
// after the RAM tier let the file go. No bound of the daemon's covers
// them (one user mapped 160 files of 8 MiB under --ram-cache 64MiB and
// held 1.2 GiB). On a mount of one user's own that is that user's memory,
// as with any file the user maps; on a shared one, on asks for it.
func passthroughMode(mode string, files int, bytes int64, allowOther bool) (bool, string) {
	switch mode {
	case PassthroughOn:
		return true, ""
	case PassthroughOff:
		return false, "turned off (--passthrough off)"
	}
	if allowOther {
		return false, "--passthrough auto with --allow-other: a reader's mmap of a file read by passthrough holds the daemon's backing file in memory past --ram-cache's bound until it unmaps it (--passthrough on allows it)"
	}
	if files == 0 || bytes/int64(files) < passthroughAutoMin {
		return false, fmt.Sprintf("--passthrough auto: the dataset's files average under %d MiB; small files read faster through the mount's page cache (--passthrough on overrides)", passthroughAutoMin>>20)
	}
	return true, ""
}

// checkPassthrough is the check line about passthrough on host h.
func (c *Config) checkPassthrough(h Host) Check {
	mode := c.Passthrough
	if mode == "" {
		mode = PassthroughAuto
	}
	switch mode {
	case PassthroughOff:
		return Check{OK, "--passthrough", "off: every read goes through dlfs"}
	case PassthroughAuto, PassthroughOn:
	default:
		return Check{Fail, "--passthrough", fmt.Sprintf("%q: want auto, on or off", c.Passthrough)}
	}
	level := OK
	if mode == PassthroughOn {
		level = Warn // asked for, and it will not work
	}
	if major, minor, ok := kernelVersion(h.Release); ok && (major < 6 || major == 6 && minor < 9) {
		return Check{level, "--passthrough", fmt.Sprintf("off: Linux %d.%d has no FUSE passthrough (6.9+ built with CONFIG_FUSE_PASSTHROUGH); files held in RAM are read through dlfs", major, minor)}
	}
	if !h.Root {
		return Check{level, "--passthrough", "off: registering a backing file needs CAP_SYS_ADMIN; run the mount as root to let the kernel read files held in RAM itself"}
	}
	if mode == PassthroughAuto && c.AllowOther {
		return Check{OK, "--passthrough", "auto: off with --allow-other (another user's mmap would hold backing files past --ram-cache's bound; --passthrough on allows it)"}
	}
	if mode == PassthroughAuto {
		return Check{OK, "--passthrough", fmt.Sprintf("auto: on if the dataset's files average %d MiB or more and the kernel has CONFIG_FUSE_PASSTHROUGH (the mount's stats say: passthrough.on, why)", passthroughAutoMin>>20)}
	}
	return Check{OK, "--passthrough", "on, if the kernel has CONFIG_FUSE_PASSTHROUGH (the mount's stats say: passthrough.on, why)"}
}

// checkShmemTHP is the check line about huge pages for backing files, if
// passthrough may be used: without them, large files read by passthrough
// at about 0.75x the native page cache, against 1.0x with them
// (docs/benchmarks.md).
func (c *Config) checkShmemTHP(h Host) (Check, bool) {
	if c.Passthrough == PassthroughOff || h.ShmemTHP == "" {
		return Check{}, false
	}
	if backing.HugeAllowed(h.ShmemTHP) {
		return Check{OK, "shmem huge pages", fmt.Sprintf("%s: backing files of 2 MiB or more use 2 MiB pages", h.ShmemTHP)}, true
	}
	level := OK
	if c.Passthrough == PassthroughOn {
		level = Warn
	}
	return Check{level, "shmem huge pages", fmt.Sprintf("%s: backing files use 4 KiB pages, and the kernel reads large files by passthrough at about 0.75x the page cache's speed; "+
		"echo advise > /sys/kernel/mm/transparent_hugepage/shmem_enabled lets dlfs use 2 MiB pages for them", h.ShmemTHP)}, true
}

// maxBackingFiles is how many backing files the node may hold open, in
// the RAM tier, on the stage and for opens: half the descriptors this
// process may open.
func maxBackingFiles() int64 {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Cur == unix.RLIM_INFINITY {
		return 1 << 20
	}
	return int64(lim.Cur / 2)
}

// openOverhead is what an open's backing file costs beside its pages:
// the kernel's inode, dentry and open file of the memfd (about 1 KiB,
// as the RAM tier counts it) and the mount's backing id.
const openOverhead = 2 << 10

// openCharge is what an open of a file of size bytes holding a backing
// file counts against openBound: its pages and openOverhead.
func openCharge(size int64) int64 {
	return (size+pageSize-1)&^(pageSize-1) + openOverhead
}

var pageSize = int64(unix.Getpagesize())

// passthroughCounts are the node's side of the passthrough figures.
type passthroughCounts struct {
	openBytes   atomic.Int64 // openCharge of the backing files held by opens
	fds         atomic.Int64 // backing files built and not yet closed, each a descriptor (at most maxFiles)
	built       atomic.Int64 // backing files built
	builtAhead  atomic.Int64 // of them, by the builder, before an open asked (builder.go)
	fromSSD     atomic.Int64 // of them, by an open, with blocks copied from the SSD tier
	builtBytes  atomic.Int64
	notResident atomic.Int64 // opens of files not held whole
	overBound   atomic.Int64 // opens turned away by openBound
	tooMany     atomic.Int64 // opens turned away by maxFiles
	failed      atomic.Int64 // builds that failed (a block failed its sum, or memory)
	maxFiles    atomic.Int64 // maxBackingFiles, read once at Start
}

// PassthroughStats is stats' passthrough object.
type PassthroughStats struct {
	fusefs.PassthroughStats
	// BackingFiles and BackingBytes are the backing files the RAM tier
	// holds (counted in its bytes), EvictedOpenBytes those it let go of
	// while open (counted against its capacity until they close).
	BackingFiles     int64 `json:"backing_files"`
	BackingBytes     int64 `json:"backing_bytes"`
	EvictedOpenBytes int64 `json:"evicted_open_bytes"`
	// OpenBytes are what the backing files opens hold are charged (their
	// pages, and 2 KiB each for the kernel's objects), at most OpenBound.
	OpenBytes int64 `json:"open_bytes"`
	OpenBound int64 `json:"open_bound_bytes"`
	// Built counts backing files built, with their bytes; NotResident
	// opens of files not held whole (read through the daemon), OverBound
	// opens turned away by the bound, BuildFailures builds that failed.
	Built         int64 `json:"built"`
	BuiltBytes    int64 `json:"built_bytes"`
	BuiltAhead    int64 `json:"built_ahead"`    // of Built, in the background: a file the prefetcher staged, or a reader read to its end
	BuiltFromSSD  int64 `json:"built_from_ssd"` // of Built, by an open, with blocks copied from the SSD tier (not kept after it)
	NotResident   int64 `json:"not_resident"`
	OverBound     int64 `json:"over_bound"`
	BuildFailures int64 `json:"build_failures"`
	// BackingFds is the descriptors backing files hold now: the RAM
	// tier's, the stage's, the opens' (those the tier let go of while
	// open too). MaxFiles is their budget, half the descriptors dlfs may
	// open; TooMany counts opens turned away by it (read through dlfs).
	BackingFds int64 `json:"backing_fds"`
	MaxFiles   int64 `json:"max_backing_files"`
	TooMany    int64 `json:"too_many"`
	// ShmemTHP is shmem's huge page mode: where it allows them, backing
	// files of 2 MiB or more are written into 2 MiB pages (backing).
	ShmemTHP string `json:"shmem_thp"`
}

// openBound is the most bytes of backing files opens may hold.
func (n *Node) openBound() int64 { return max(n.cfg.RAMCache, 0) / 4 }

// passthroughStats collects stats' passthrough object.
func (n *Node) passthroughStats(ram ramcache.Stats) PassthroughStats {
	c := &n.tiers.backing
	return PassthroughStats{PassthroughStats: n.fs.PassthroughStats(),
		BackingFiles: ram.Backing.Files, BackingBytes: ram.Backing.Bytes, EvictedOpenBytes: ram.Backing.EvictedOpenBytes,
		OpenBytes: c.openBytes.Load(), OpenBound: n.openBound(),
		Built: c.built.Load(), BuiltBytes: c.builtBytes.Load(), BuiltAhead: c.builtAhead.Load(), BuiltFromSSD: c.fromSSD.Load(), NotResident: c.notResident.Load(),
		OverBound: c.overBound.Load(), BuildFailures: c.failed.Load(), BackingFds: c.fds.Load(), MaxFiles: c.maxFiles.Load(), TooMany: c.tooMany.Load(),
		ShmemTHP: backing.ShmemTHP()}
}

// Backing implements fusefs.Backer.
func (d dataset) Backing(e *catalog.Entry) fusefs.BackingFile {
	n := d.n
	if e.Size == 0 {
		return nil
	}
	c := &n.tiers.backing
	charge := openCharge(e.Size)
	if c.openBytes.Add(charge) > n.openBound() {
		c.openBytes.Add(-charge)
		c.overBound.Add(1)
		return nil
	}
	f := n.backingOf(e)
	if f == nil {
		c.openBytes.Add(-charge)
		return nil
	}
	return openBacking{f, c}
}

// openBacking is a backing file an open holds.
type openBacking struct {
	*backing.File
	c *passthroughCounts
}

func (o openBacking) Release() {
	o.c.openBytes.Add(-openCharge(o.Size()))
	o.File.Release()
}

// backingOf returns e's backing file with a reference for the caller:
// the RAM tier's, or one built from the blocks RAM and the stage hold;
// nil if they do not hold all of e. An open of a file the builder is
// building waits for that build (builder.go).
func (n *Node) backingOf(e *catalog.Entry) *backing.File {
	ram := n.tiers.ram
	tag0 := n.tiers.load.Tag(e, loader.BlockKey(e.Path(), 0))
	for {
		if f := ram.Backing(e.Ino, tag0); f != nil {
			return f
		}
		end, mine := n.tiers.builder.begin(e.Ino)
		if !mine {
			n.tiers.builder.wait(e.Ino)
			continue // built meanwhile, or the build failed: look again
		}
		defer end()
		if f := ram.Backing(e.Ino, tag0); f != nil {
			return f // built between the look and the claim
		}
		if f := n.openStaged(e); f != nil {
			return f // built by the builder beside the staged blocks
		}
		f, _, _ := n.buildBacking(e, true)
		return f
	}
}

// buildBacking builds e's backing file from the blocks the RAM tier, the
// prefetcher's stage and read-ahead hold (and, forOpen with
// Config.PassthroughFromSSD, the SSD tier). It returns the file with a
// reference for the caller, or nil if they do not hold all of e
// (missing), and whether a keeper adopted it:
//   - the builder's build (!forOpen) of a file staged whole: the stage,
//     beside the blocks, until the open that reads them (openStaged);
//   - any other: the RAM tier, unless a block came from the SSD tier or a
//     peer (the tier keeps this node's share only). The staged blocks then
//     leave the stage: the file holds them for good.
//
// The builder's builds never hold a peer's block.
func (n *Node) buildBacking(e *catalog.Entry, forOpen bool) (_ *backing.File, adopted, missing bool) {
	load, ram := n.tiers.load, n.tiers.ram
	bs := load.BlockSize()
	if e.Size > n.openBound()-openOverhead {
		return nil, false, false // no open may hold it (and a sparse file of 2^63 bytes must not size the lists below)
	}
	nb := loader.Blocks(e.Size, bs)
	keys := make([]string, nb)
	blocks := make([]ramcache.Block, nb)
	staged := make([]bool, nb)
	peer, ssd := false, false
	for i := range nb {
		keys[i] = loader.BlockKey(e.Path(), i)
		tag := load.Tag(e, keys[i])
		b, ok := ram.Peek(keys[i], tag)
		if !ok {
			b, ok = n.tiers.stage.Take(keys[i], tag, false)
			staged[i] = ok
		}
		if !ok {
			b, ok = load.HeldAhead(e, i, tag) // a short last block comes with the one before it
		}
		if !ok && forOpen && n.cfg.PassthroughFromSSD {
			// Copied from the SSD tier into the open's backing file, which
			// the RAM tier does not adopt (the SSD's share is not its own).
			b, ok = load.FromSSD(e, i, tag)
			ssd = ssd || ok
		}
		if !ok {
			if forOpen {
				n.tiers.backing.notResident.Add(1)
			}
			return nil, false, true
		}
		if b.Peer && !forOpen {
			return nil, false, false // the tier keeps this node's share only
		}
		blocks[i], peer = b, peer || b.Peer
	}
	// The builder's keeper: the stage for a file staged whole, which it
	// must have room for; the RAM tier for one staged not at all. One
	// staged in part has none (the RAM tier could evict it before its
	// read, the stage holds whole files): the open builds it.
	allStaged, staging := !slices.Contains(staged, false), n.cfg.prefetchConfig().Staging
	switch {
	case forOpen:
	case allStaged && !n.tiers.stage.HasRoom(e.Size, staging), !allStaged && slices.Contains(staged, true):
		return nil, false, false
	}
	f, err := n.buildFile(e, bs, blocks)
	if errors.Is(err, errTooManyFiles) {
		if forOpen {
			n.tiers.backing.tooMany.Add(1) // an open turned away
		}
		return nil, false, false
	}
	if err != nil {
		n.tiers.backing.failed.Add(1)
		if errors.Is(err, backing.ErrCorrupt) {
			// The tier drops what fails its sum when it is next read.
			n.log.Warn("passthrough: a cached block fails its checksum; reading the file through the daemon", "path", e.Path(), "err", err)
		} else {
			n.log.Debug("passthrough: no backing file", "path", e.Path(), "err", err)
		}
		return nil, false, false
	}
	n.tiers.backing.built.Add(1)
	n.tiers.backing.builtBytes.Add(e.Size)
	if ssd {
		n.tiers.backing.fromSSD.Add(1)
	}
	if !forOpen && allStaged {
		// The builder's build of a file staged whole stays with its
		// blocks on the stage, counted against --staging, until they are
		// read: moved to the RAM tier, it could be evicted before its
		// read (an announced epoch of .npz files over a RAM tier smaller
		// than the stage read 1.09x its bytes).
		adopted = n.tiers.stage.AdoptBacking(e.Ino, int(nb), keys[0], blocks[0].Tag, f, staging)
		return f, adopted, false
	}
	if !peer && !ssd { // RAM holds this node's share only
		adopted = ram.Adopt(e.Ino, keys, blocks, f)
	}
	if forOpen { // the open is the read of the staged blocks: the file holds them
		for i, s := range staged {
			if s {
				n.tiers.stage.Take(keys[i], blocks[i].Tag, true)
			}
		}
	}
	return f, adopted, false
}

// errTooManyFiles means the node's backing files hold their budget of
// descriptors (maxFiles) already.
var errTooManyFiles = errors.New("daemon: the backing files hold their budget of descriptors")

// buildFile builds e's backing file of blocks (block size bs) if the
// descriptor budget has room for it, counting its descriptor until it
// is closed.
func (n *Node) buildFile(e *catalog.Entry, bs int64, blocks []ramcache.Block) (*backing.File, error) {
	c := &n.tiers.backing
	if c.fds.Add(1) > c.maxFiles.Load() {
		c.fds.Add(-1)
		return nil, errTooManyFiles
	}
	f, err := backing.Build(e.Path(), e.Size, bs, func(i int64) (backing.Block, bool) {
		b := blocks[i]
		return backing.Block{Data: b.Data, Tag: b.Tag, Sum: b.Sum}, true
	})
	if err != nil {
		c.fds.Add(-1)
		return nil, err
	}
	f.OnClose(func() { c.fds.Add(-1) }) // true: Build's reference is held
	return f, nil
}

// backs says whether a file staged whole would get a backing file beside
// it now (prefetch.Config.Backs): the mount uses passthrough (decided at
// its first open, false until then) and an open may hold the file.
func (n *Node) backs(e *catalog.Entry) bool {
	return e.Size > 0 && openCharge(e.Size) <= n.openBound() && n.fs.UsesPassthrough()
}

// openStaged returns the backing file the stage keeps beside e's staged
// blocks, with a reference for the caller, and takes the blocks off the
// stage (the open is their read); the RAM tier adopts the file if e is
// this node's share, for a later epoch. Nil if the stage keeps none.
func (n *Node) openStaged(e *catalog.Entry) *backing.File {
	load, st := n.tiers.load, n.tiers.stage
	key0 := loader.BlockKey(e.Path(), 0)
	f := st.Backing(e.Ino, key0, load.Tag(e, key0))
	if f == nil {
		return nil
	}
	nb := loader.Blocks(e.Size, load.BlockSize())
	keys := make([]string, nb)
	blocks := make([]ramcache.Block, nb)
	whole, peer := true, false
	for i := range nb {
		keys[i] = loader.BlockKey(e.Path(), i)
		b, ok := st.Take(keys[i], load.Tag(e, keys[i]), true)
		whole, peer = whole && ok, peer || b.Peer
		blocks[i] = b
	}
	if whole && !peer {
		n.tiers.ram.Adopt(e.Ino, keys, blocks, f)
	}
	return f
}

// OpenedPassthrough implements fusefs.Backer: the open stands for the
// reads that will not come, as one read at offset 0 that waited on
// nothing (the bytes are resident).
func (d dataset) OpenedPassthrough(e *catalog.Entry, pid uint32) {
	n := d.n
	if n.readers == nil {
		return
	}
	r := n.readers.Observe(pid, e, 0, false, "passthrough", 0)
	n.pf.ObserveRead(r.Cred.Uid, r.Known, e, 0, 0)
}
