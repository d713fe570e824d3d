// Package daemon assembles one dlfs node: the catalog of SOURCE, the cache
// tiers, the loader, the FUSE filesystem, the control plane and the metrics
// endpoint. In a cluster it also runs the gossip membership, serves its
// blocks to peers, and builds the cluster's read policy (package
// daemon/owners: placement, job gossip, layouts and the peer tier), which
// it hands to the loader and the job registry.
//
// # Lifetime
//
// Start first checks the Config against this host (Validate: before
// SOURCE is scanned) and clears a dead mount a killed daemon left at the
// mount point; it then builds the parts in dependency order and mounts;
// once it returns, the mount is usable. Each part registers its closer as
// it is built, and Close runs them in reverse: the FUSE server first (no new reads), then
// the prefetcher (whose fetches use the peers and the tiers), the read
// policy (its goroutines, the peer batchers and client), the cluster, the
// peer server, the metrics server, the SSD store (which commits its
// queued writes), the packed containers and SOURCE. Wait blocks until the
// filesystem is unmounted, by Close or from outside (umount, fusermount
// -u, a lazy unmount once the last file open under it closes); Close then
// has nothing to unmount. The daemon holds nothing open in its own mount
// while idle, so that these work.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/access"
	"github.com/dlfs/dlfs/accesslog"
	"github.com/dlfs/dlfs/allocator"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/cluster/peer"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/daemon/owners"
	"github.com/dlfs/dlfs/daemon/readers"
	"github.com/dlfs/dlfs/folder"
	"github.com/dlfs/dlfs/fusefs"
	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/jobs"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/netlimit"
	"github.com/dlfs/dlfs/packed"
	"github.com/dlfs/dlfs/perfmodel"
	"github.com/dlfs/dlfs/placement"
	"github.com/dlfs/dlfs/prefetch"
	"github.com/dlfs/dlfs/ramcache"
	"github.com/dlfs/dlfs/ratelog"
	"github.com/dlfs/dlfs/source"
	"github.com/dlfs/dlfs/ssdstore"
	"github.com/dlfs/dlfs/warmup"
)

// Config configures a node: one field a setting, most of them a flag of
// dlfs mount; Start derives each part's configuration from them
// (config.go). Zero values take the defaults, which DefaultConfig spells
// out. Validate checks it against this host; Start does so first.
type Config struct {
	Source     string // dataset directory; required
	Mountpoint string // required
	NodeName   string // default: the host name
	// AllowNonEmpty lets the mount hide what Mountpoint holds; by
	// default a mount point that is not empty is refused.
	AllowNonEmpty bool
	// DatasetID names the dataset for every host alike; "" draws its
	// identity from its oldest files (package integrity).
	DatasetID string
	// MaxEntries bounds the files and directories (or packed samples) the
	// catalog holds, each a few hundred bytes of RAM; 0:
	// catalog.DefaultMaxEntries.
	MaxEntries int

	// The tiers.

	RAMCache int64 // bytes; default 512 MiB; 0 after defaults means off
	// RAMEvictLRU makes the RAM tier plain LRU even when plans are known
	// (for comparison; Belady by next use is the default).
	RAMEvictLRU bool
	// SSDDir holds the SSD tier's files; "" turns the tier off.
	SSDDir string
	// SSDCapacity bounds every byte the SSD tier keeps on disk; default
	// ssdstore's (4 GiB).
	SSDCapacity int64

	// The read path: the loader and the prefetcher.

	// BlockSize is what the tiers cache, fetch and key by, and the
	// largest read the kernel sends; default the loader's (1 MiB).
	BlockSize int64
	// Staging bounds the bytes fetched ahead that no reader has taken
	// yet: read-ahead within files holds a quarter of it, the prefetcher
	// the rest (all of it with NoReadAhead); default the prefetcher's
	// (256 MiB).
	Staging int64
	// ReadAhead bounds the bytes fetched ahead of one reader moving
	// forward through a file, at most read-ahead's quarter of Staging;
	// default the loader's (16 MiB). NoReadAhead turns read-ahead off
	// (for comparison).
	ReadAhead   int64
	NoReadAhead bool
	// PrefetchWorkers is how many fetches the prefetcher keeps in flight
	// ahead of the jobs; default the prefetcher's (128).
	PrefetchWorkers int
	// PFSTimeout bounds every read of SOURCE (the reader gets ETIMEDOUT)
	// and how long a scan waits for SOURCE to answer: the operator's one
	// bound on waiting for it; default the loader's (1 minute).
	PFSTimeout time.Duration
	// PFSMargin is how many times slower than the PFS a cached copy must
	// be expected to be before a waiting reader reads the PFS instead; 0
	// never skips a reachable copy on speed alone.
	PFSMargin float64
	// NoCoalesce reads every sample of a packed dataset with its own
	// request (for comparison; coalescing is the default).
	NoCoalesce bool
	// NoPush keeps the prefetcher from pushing what it holds into the
	// kernel's page cache ahead of the reads (see package prefetch): every
	// read then goes through the daemon, as before issue 14.
	NoPush bool
	// NoInfer turns off package readers' inference of the jobs of
	// readers that announce none (streams are still shown).
	NoInfer bool
	// Warmup warms the whole dataset after mounting, when the caches can
	// hold it.
	Warmup bool

	// The filesystem.

	// ControlName is the hidden control directory at the root; default
	// fusefs's (".dlfs").
	ControlName string
	// CacheTTL is how long the kernel caches names and attributes;
	// default fusefs's (1 hour).
	CacheTTL time.Duration
	// AllowOther lets users other than the mounting one into the mount,
	// as SOURCE's modes and owners allow.
	AllowOther bool
	// ListingAttrs answers every listing with each entry's attributes
	// (READDIRPLUS): faster ls -l, find and du, slower plain listings.
	ListingAttrs bool
	// Owner owns the control directory and is the operator, who may write
	// the control file and change every job; default this process's user
	// and group. With GroupWrite, members of Owner.Gid may write it too.
	Owner      fusefs.Owner
	GroupWrite bool
	// Passthrough is when the kernel reads files held in RAM from backing
	// files itself (passthrough.go): PassthroughAuto (""), On or Off.
	Passthrough string
	// PassthroughFromSSD lets an open of a file only the SSD tier holds
	// copy it into a backing file (passthrough.go): off by default, as it
	// read 32 MiB files 1.08-1.35x as fast as READs answered from the SSD
	// tier, under the 1.5x that would pay for the copies.
	PassthroughFromSSD bool
	// DebugFUSE logs every FUSE request (very verbose).
	DebugFUSE bool

	// The cluster. With no Bind and no Join the node is a cluster of one
	// and opens no gossip port.

	Bind      string   // HOST:PORT for gossip; with Join alone, 0.0.0.0:7946; port 0 picks one
	Advertise string   // HOST:PORT the other nodes reach this one's gossip on; default Bind
	Join      []string // HOST:PORT of members to join
	// DataAddr is where this node serves its blocks to peers (HOST:PORT,
	// port 0 picks one), advertised to the cluster; "" serves none.
	DataAddr string
	// ClusterKey authenticates and encrypts gossip and the data port.
	// KeyFile holds it (see ReadKey) when it is not given: Validate checks
	// that only its owner may read the file, and Start reads it.
	ClusterKey []byte
	KeyFile    string
	// Insecure lets the node gossip and serve peers without a key: anyone
	// who reaches the ports can join and read.
	Insecure bool
	// GossipLocal uses memberlist's loopback timings (fast failure
	// detection), for tests and single-machine clusters.
	GossipLocal bool
	// ForgetDead is how long a member dead or gone stays in the view;
	// default memberlist's (see cluster.Config).
	ForgetDead time.Duration
	// HashPlacement places samples by hashing only, ignoring the jobs'
	// plans (for comparison; placement by demand is the default).
	HashPlacement bool
	// PlacementEpochs is how many epochs of each job, from its first,
	// demand placement counts reads over; default owners' (4).
	PlacementEpochs int

	// Sharing the loader CPUs between the DataLoaders that report (package
	// allocator).

	// LoaderCPUs are the CPUs for the DataLoaders on this node: the most
	// workers advised in total; default allocator's (every CPU).
	LoaderCPUs int
	// AllocationMode is how workers and prefetching are shared between
	// jobs; default allocator's (allocator.Need).
	AllocationMode allocator.Mode
	// JobIdle ends a reporting job none of whose ranks reported, or read,
	// for this long; default allocator's (2 minutes).
	JobIdle time.Duration

	// Metrics and logs.

	// NoLatency turns off the latency histograms (reads by source, FUSE
	// requests by operation, peer requests by member), for comparison:
	// each observation costs two atomic adds and a clock read.
	NoLatency bool
	// MetricsAddr serves Prometheus /metrics on HOST:PORT; "" is off.
	MetricsAddr string
	// MetricsLimits bounds that server: read, write and idle timeouts,
	// and connections (zero fields: netlimit.DefaultHTTP). It stays
	// netlimit's own struct, handed over whole: no flag sets it (tests do),
	// and five fields named for one HTTP server would only copy it.
	MetricsLimits netlimit.HTTPConfig
	// Registry collects the node's metrics; nil makes a fresh one.
	Registry *prometheus.Registry
	Logger   *slog.Logger // nil: discard
}

// DefaultConfig returns the defaults for serving source at mountpoint:
// each part's package's own.
func DefaultConfig(source, mountpoint string) Config {
	lc, pc, fc, ac := loader.DefaultConfig(), prefetch.DefaultConfig(), fusefs.DefaultConfig(), allocator.DefaultConfig()
	return Config{
		Source: source, Mountpoint: mountpoint,
		MaxEntries:      catalog.DefaultConfig(source).MaxEntries,
		RAMCache:        ramcache.DefaultConfig().Capacity,
		SSDCapacity:     ssdstore.DefaultConfig("").Capacity,
		BlockSize:       lc.BlockSize,
		Staging:         pc.Staging,
		ReadAhead:       lc.ReadAhead,
		PrefetchWorkers: pc.Workers,
		PFSTimeout:      lc.PFSTimeout,
		ControlName:     fc.ControlName,
		CacheTTL:        fc.TTL,
		Owner:           fc.Owner,
		PlacementEpochs: owners.DefaultConfig().PlacementEpochs,
		LoaderCPUs:      ac.CPUs,
		AllocationMode:  ac.Mode,
		JobIdle:         ac.Idle,
	}
}

// Node is a running dlfs node. Start sets its parts, which guard their own
// state; cfg is read-only after Start.
type Node struct {
	cfg     Config
	log     *slog.Logger
	started time.Time

	cat      *catalog.Catalog
	src      *source.Source
	packed   packed.Dataset // nil unless SOURCE is packed
	dataset  integrity.Dataset
	tiers    tiers
	fs       *fusefs.FS
	ctl      *controlPlane
	jobs     *jobs.Registry
	pf       *prefetch.Prefetcher
	readers  *readers.Tracker
	alloc    allocation
	warmer   *warmup.Warmer
	cluster  clusterParts // all nil for a cluster of one
	lat      latencies    // nil Vecs with Config.NoLatency
	alog     *accesslog.Log
	rescans  rescans
	reg      *prometheus.Registry
	server   *fuse.Server
	mountDev string        // the mount's MAJOR:MINOR, as mountinfo shows it ("": unknown)
	served   chan struct{} // closed when the kernel ends the mount's connection
	metrics  metricsServer
	closing  closing
}

// tiers are where the bytes come from: the loader reads through the RAM
// and SSD tiers, the peers and SOURCE.
type tiers struct {
	ram  *ramcache.Cache
	ssd  *ssdstore.Store // nil when the SSD tier is off
	load *loader.Loader
	// oracle tells RAM and the SSD how soon the plans need a file; the
	// prefetcher publishes to it.
	oracle *prefetch.Oracle
	// backing counts the RAM tier's backing files given to opens
	// (passthrough.go).
	backing passthroughCounts
	// builder builds backing files ahead of opens (builder.go).
	builder *builder
	// stage is the prefetcher's stage, which the loader takes from and
	// backing files are built from.
	stage *prefetch.Stage
}

// allocation shares the loader CPUs (package allocator), from the read
// times of each reporting rank.
type allocation struct {
	*allocator.Allocator
	readTimes readTimes
}

// clusterParts are the node's part in a cluster.
type clusterParts struct {
	gossip *cluster.Cluster
	owners *owners.Owners // the cluster's read policy
	peers  *peer.Server   // nil without --data-addr
	served atomic.Int64   // blocks served to peers
}

// metricsServer serves /metrics and the status page (Config.MetricsAddr).
type metricsServer struct {
	srv     *http.Server // nil when off
	addr    net.Addr
	history rateHistory // the status page's last minutes
}

// closing is how Close stops the node.
type closing struct {
	closers []closer // in the order built; Close runs them in reverse
	once    sync.Once
	err     error
	closed  []string // the closers' names, in the order Close ran them (tests)
	// Close calls these before unmounting: the access log's writer (its
	// pipe holds the mount) and the catalog keeper's rescan.
	stopAccessLog func()
	stopKeeper    func()
}

// closer stops one part of the node.
type closer struct {
	name string
	fn   func() error
}

// onClose registers fn to stop the part called name.
func (n *Node) onClose(name string, fn func() error) {
	n.closing.closers = append(n.closing.closers, closer{name, fn})
}

// defaultBind is where gossip listens when --join is given without --bind.
const defaultBind = "0.0.0.0:7946"

// detachWait is how long Close waits, after detaching a busy mount, for
// its last open file to close.
const detachWait = 5 * time.Second

// A warning or error message is logged at most logBurst times per
// logEvery.
const (
	logEvery = 10 * time.Second
	logBurst = 5
)

// Start checks the configuration, scans SOURCE, opens the tiers and mounts.
// On error everything already started is stopped again.
func Start(ctx context.Context, cfg Config) (_ *Node, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	// Warnings and errors come from requests, peers and strangers as often
	// as they retry: each message is written at most logBurst times per
	// logEvery, with a count of the rest.
	cfg.Logger = slog.New(ratelog.NewHandler(cfg.Logger.Handler(), logEvery, logBurst, slog.LevelWarn))
	if cfg.NodeName == "" {
		cfg.NodeName, _ = os.Hostname()
	}
	cfg.ControlName = cfg.controlName()
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if err := clearDeadMount(cfg.Mountpoint, cfg.Logger); err != nil {
		return nil, err
	}
	// Everything that can be checked before SOURCE is scanned (see
	// Check), SOURCE last.
	warnings, err := cfg.validate(ThisHost())
	if err != nil {
		return nil, err
	}
	for _, w := range warnings {
		cfg.Logger.Warn(w.Error())
	}
	if cfg.KeyFile != "" && len(cfg.ClusterKey) == 0 {
		if cfg.ClusterKey, err = ReadKey(cfg.KeyFile); err != nil {
			return nil, err
		}
	}
	n := &Node{cfg: cfg, log: cfg.Logger, started: time.Now(), reg: cfg.Registry}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()

	// SOURCE is opened, its containers listed (a packed one) and its mount
	// identified under the start-up context: a PFS that hangs is waited
	// for as long as the operator lets the mount wait, and said so.
	maxEntries := cfg.MaxEntries
	if maxEntries <= 0 {
		maxEntries = catalog.DefaultMaxEntries
	}
	var (
		src    *source.Source
		pk     packed.Dataset
		mount  string
		format = "directory"
	)
	err = waitSource(ctx, n.log, "opening SOURCE", func() error {
		var err error
		if src, err = source.Open(cfg.Source); err != nil {
			return err
		}
		// A packed SOURCE shows the tree it holds; its samples are read
		// from their containers.
		if pk, err = packed.Open(cfg.Source, src, packed.Config{MaxEntries: maxEntries, Logger: cfg.Logger}); err != nil {
			src.Close()
			return err
		}
		if pk != nil {
			format = pk.Kind()
		}
		if mount, err = integrity.MountOf(cfg.Source, format); err != nil {
			if pk != nil {
				pk.Close()
			}
			src.Close()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	n.src, n.packed = src, pk
	n.onClose("source", n.src.Close)
	if n.packed != nil {
		n.onClose("packed", n.packed.Close)
	}
	var pfs loader.PFS = n.src
	cc := cfg.catalogConfig()
	if n.packed != nil {
		cc.Lister, pfs = n.packed, n.packed
	} else if cfg.SSDDir != "" {
		// The catalog is saved beside the SSD tier, bound to SOURCE as
		// this host mounts it: it holds this mount's inode numbers.
		cc.Saved = filepath.Join(cfg.SSDDir, "catalog.snap")
		cc.Identity = mount
	}
	if n.cat, err = catalog.Open(ctx, cc); err != nil {
		return nil, err
	}
	idc := identityConfig{pfs: pfs, format: format, operatorID: cfg.DatasetID, timeout: cfg.PFSTimeout, mount: mount,
		check: n.cat.Check, log: n.log}
	if cfg.SSDDir != "" && n.packed == nil {
		idc.saved = filepath.Join(cfg.SSDDir, identityFile)
	}
	if n.dataset, err = n.identify(ctx, idc); err != nil {
		return nil, err
	}
	snap := n.cat.Snapshot()
	n.log.Info("scanned SOURCE", "source", n.cat.Source(), "format", format, "dataset", n.dataset.String(), "files", snap.Files, "dirs", snap.Dirs,
		"bytes", snap.Bytes, "seconds", snap.ScanTime.Seconds())
	// The RAM and SSD tiers evict by next use: the prefetcher, made after
	// them, publishes the plans to the oracle they ask.
	n.tiers.oracle = &prefetch.Oracle{}
	rc := ramcache.Config{Capacity: max(cfg.RAMCache, 0), NextUse: n.tiers.oracle.NextUse}
	if cfg.RAMEvictLRU {
		rc.NextUse = nil
	}
	n.tiers.ram = ramcache.New(rc)
	n.onClose("heap governor", governHeap(n.tiers.ram))
	var ssd loader.SSD
	if cfg.SSDDir != "" {
		sc := cfg.ssdConfig()
		sc.NextUse = n.tiers.oracle.NextUse
		switch n.tiers.ssd, err = ssdstore.Open(sc); {
		case errors.Is(err, ssdstore.ErrNoSpace):
			// The mount is still worth having: it runs on RAM and the PFS.
			n.log.Warn("running without the SSD tier", "err", err)
			n.tiers.ssd = nil
		case err != nil:
			return nil, err
		default:
			n.onClose("ssd", n.tiers.ssd.Close)
			ssd = n.tiers.ssd
		}
		// A daemon killed while saving the catalog left its temporary
		// file here (the SSD tier's lock is ours now, and a save in
		// progress holds its file's: package atomicfile).
		if cc.Saved != "" {
			if removed, err := catalog.RemoveTemps(filepath.Dir(cc.Saved)); err != nil {
				n.log.Warn("catalog: could not remove a killed save's temporary files", "err", err)
			} else if len(removed) > 0 {
				n.log.Info("catalog: removed a killed save's temporary files", "files", removed)
			}
		}
		if removed, err := removeIdentityTemps(cfg.SSDDir); err != nil {
			n.log.Warn("could not remove a killed save's temporary files", "err", err)
		} else if len(removed) > 0 {
			n.log.Info("removed a killed save's temporary files", "files", removed)
		}
	}
	// The prefetcher's stage, which the loader takes from: made before
	// both, it is given to each (the prefetcher adopts it).
	n.tiers.stage = prefetch.NewStage()
	lc := cfg.loaderConfig()
	lc.Dataset, lc.Model, lc.Stage = n.dataset, perfmodel.New(perfmodel.DefaultConfig()), n.tiers.stage
	if lc.BlockSize <= 0 {
		lc.BlockSize = loader.DefaultConfig().BlockSize // as loader.New would: the read policy needs it first
	}
	// In a cluster this node keeps samples for ranks that run elsewhere.
	allRanks := cfg.clustered()
	n.jobs = jobs.New(jobs.Config{
		Snapshot: n.cat.Snapshot,
		ReadFile: n.readWhole,
		AllRanks: allRanks,
		Layout:   n.layout,
		Operator: cfg.Owner.Uid, // the mounting user may change every job
		Logger:   cfg.Logger,
	})
	if !cfg.NoLatency {
		if n.lat, err = newLatencies(n.reg); err != nil {
			return nil, err
		}
	}
	// In a cluster, the read policy is the loader's peer tier, so it is
	// made first, and the gossip and the peer server's port before it. The
	// peer server is bound now, for the port to gossip, and serves once
	// the tiers exist: a peer that connects in between waits in the listen
	// backlog. The policy's goroutines start then too (they may read a
	// job's list file through the loader).
	if cfg.clustered() {
		cc := cfg.clusterConfig()
		cc.Meta.Dataset, cc.Meta.Placement = n.dataset.String(), placement.HashVersion
		cc.Meta.RAM, cc.Meta.SSD = cfg.RAMCache, 0
		if n.tiers.ssd != nil {
			cc.Meta.SSD = cfg.SSDCapacity
		}
		if cc.Meta.DataAddr != "" {
			if n.cluster.peers, err = peer.Bind(cc.Meta.DataAddr, cc.Key, cfg.Logger); err != nil {
				return nil, err
			}
			n.onClose("peer server", func() error { n.cluster.peers.Close(); return nil })
			cc.Meta.DataAddr = n.cluster.peers.Addr() // the real port, if it was 0
		}
		if n.cluster.gossip, err = cluster.Start(cc); err != nil {
			return nil, err
		}
		n.onClose("cluster", func() error {
			if err := n.cluster.gossip.Close(); err != nil {
				n.log.Warn("leaving the cluster failed", "err", err)
			}
			return nil
		})
		peers, err := peer.NewClient(cc.Key)
		if err != nil {
			return nil, err
		}
		oc := cfg.ownersConfig()
		oc.Dataset = n.dataset.String()
		if n.cluster.owners, err = owners.New(oc, owners.Deps{Cluster: n.cluster.gossip, Jobs: n.jobs, Peers: peers, Model: lc.Model,
			Snapshot: n.cat.Snapshot, Tag: n.tag, BlockSize: lc.BlockSize, Latency: n.lat.peer}); err != nil {
			peers.Close()
			return nil, err
		}
		n.onClose("owners", func() error { n.cluster.owners.Close(); return nil })
		lc.Remote = n.cluster.owners // not set without a cluster: a nil *Owners would be a non-nil Remote
	}
	n.tiers.load = loader.New(lc, n.tiers.ram, ssd, pfs)
	// The filesystem, which the prefetcher pushes into (once it is
	// mounted: StartPushing, below); it serves nothing until then.
	n.ctl = &controlPlane{n: n}
	fc := cfg.fuseConfig()
	fc.MaxRequest = int(n.tiers.load.BlockSize())
	// The daemon's polls for a reader reach no FUSE handler (it holds the
	// control directory, and a FIFO is the kernel's; see startAccessLog),
	// so it does not log itself.
	n.alog = accesslog.New(accesslog.Config{Logger: cfg.Logger})
	fc.Latency, fc.AccessLog = n.lat.fuse, n.alog
	fc.Passthrough, fc.PassthroughOff = passthroughMode(cfg.Passthrough, snap.Files, snap.Bytes, cfg.AllowOther)
	n.tiers.backing.maxFiles.Store(maxBackingFiles())
	n.fs = fusefs.New(fc, dataset{n}, n.ctl)
	// Built after the peers it fetches through, the prefetcher stops before
	// them (Close runs the closers in reverse); the readers, which end the
	// jobs they inferred, and the warmer stop before it.
	// The builder of backing files, which the prefetcher tells of the files
	// it stages (and the reads of those read to their end), stops after
	// both.
	n.tiers.builder = newBuilder(n)
	n.onClose("backing builder", func() error { n.tiers.builder.close(); return nil })
	pc := cfg.prefetchConfig()
	pc.Oracle, pc.Stage = n.tiers.oracle, n.tiers.stage
	if fc.Passthrough { // the files it stages get backing files beside them
		pc.Staged, pc.Backs = n.tiers.builder.offer, n.backs
	}
	if !cfg.NoPush {
		pc.Pusher = checkedPusher{n, n.fs} // checked.go
	}
	n.pf = prefetch.New(pc, n.tiers.load, n.jobs)
	n.onClose("prefetch", func() error { n.pf.Close(); return nil })
	// The tiers exist: serve the peers, and start the read policy.
	if n.cluster.peers != nil {
		n.cluster.peers.Serve(n)
	}
	if n.cluster.owners != nil {
		n.cluster.owners.Start()
	}
	n.readers = readers.New(readers.Config{
		Snapshot: n.cat.Snapshot,
		Index: func(root string, exts []string, cred access.Cred) ([]folder.Sample, error) {
			spec := control.DefaultJob()
			spec.Root, spec.Extensions = root, exts
			if root == "" {
				spec.Root = "."
			}
			return n.jobs.IndexAs(cred, spec)
		},
		Jobs:   inferJobs{n.jobs, cfg.NoInfer},
		Logger: cfg.Logger,
	})
	n.readers.Start()
	n.onClose("readers", func() error { n.readers.Close(); return nil })
	ac := cfg.allocatorConfig()
	ac.NodeCPU, ac.LastRead = allocator.ProcStat, n.lastRead
	n.alloc.Allocator = allocator.New(ac)
	n.warmer = warmup.New(warmup.Config{Logger: cfg.Logger}, warmSource{n})
	n.onClose("warmup", func() error { n.warmer.Close(); return nil })

	if err := n.reg.Register(&collector{n: n}); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	_ = n.reg.Register(collectors.NewGoCollector())
	_ = n.reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if cfg.MetricsAddr != "" {
		if err := n.serveMetrics(cfg.MetricsAddr); err != nil {
			return nil, err
		}
		n.onClose("metrics", func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = n.metrics.srv.Shutdown(ctx)
			return nil
		})
	}

	n.rescans.control = newRefresher(n.Refresh)
	n.onClose("refresher", func() error { n.rescans.control.close(); return nil })
	n.startCatchUp() // checked.go
	if n.server, err = n.fs.Mount(cfg.Mountpoint, "dlfs:"+n.cat.Source()); err != nil {
		return nil, fmt.Errorf("mount %s: %w", cfg.Mountpoint, err)
	}
	if m, ok := fusefs.MountAt(cfg.Mountpoint); ok && m.IsFUSE() {
		n.mountDev = m.Dev // to tell, on Close, whether the mount is still there
	}
	// The server ends when the kernel ends the connection: on Close, or
	// when the mount goes away from outside (umount, umount -l once its
	// last file closes, fusermount -u).
	n.served = make(chan struct{})
	go func() { n.server.Wait(); close(n.served) }()
	n.pf.StartPushing() // without a Pusher (NoPush), nothing
	n.startAccessLog()
	if cfg.MetricsAddr != "" {
		n.startHistory(historyEvery)
	}
	n.keepCatalog()
	if cfg.Warmup {
		n.warmAll()
	}
	return n, nil
}

// keepCatalog, in the background, brings a catalog loaded from its saved
// snapshot up to date with SOURCE (a refresh: what changed is invalidated
// in every tier and in the kernel), and saves the catalog for the next
// mount.
func (n *Node) keepCatalog() {
	ctx, cancel := context.WithCancel(context.Background())
	n.closing.stopKeeper = cancel
	done := make(chan struct{})
	go func() {
		defer close(done)
		if n.cat.Loaded() {
			if err := n.checkLoaded(ctx); err != nil {
				n.log.Warn("catalog: the rescan after loading the saved snapshot failed; write 'refresh' to the control file to retry", "err", err)
				return
			}
		}
		if err := n.cat.Save(); err != nil {
			n.log.Warn("catalog: saving the snapshot failed; the next mount scans SOURCE", "err", err)
		}
	}()
	n.onClose("catalog keeper", func() error {
		cancel()
		<-done
		return nil
	})
}

// warmAll warms the whole dataset when the caches can hold it (mount
// --warmup), in the background.
func (n *Node) warmAll() {
	files, err := n.filesUnder([]string{""})
	if err != nil {
		n.log.Warn("warm-up: listing the dataset failed", "err", err)
		return
	}
	var total int64
	for _, e := range files {
		total = catalog.AddSize(total, e.Size)
	}
	if c := n.cacheCapacity(); total > c {
		n.log.Warn("warm-up skipped: the caches hold less than the dataset", "dataset_bytes", total, "cache_bytes", c)
		return
	}
	n.warmer.Start([]string{""}, files, total)
}

// clearDeadMount detaches a dead FUSE mount at mp, one whose daemon died
// (killed, or out of memory) without unmounting: every access to it fails
// with ENOTCONN, and a new mount over it would be refused. It says so in
// one line.
func clearDeadMount(mp string, log *slog.Logger) error {
	var st unix.Statfs_t
	if err := unix.Statfs(mp, &st); !errors.Is(err, unix.ENOTCONN) {
		return nil // not dead; Validate says what else is wrong
	}
	m, _ := fusefs.MountAt(mp)
	if err := fusefs.Unmount(mp, true); err != nil {
		return fmt.Errorf("mount point %s: a dead mount is left there (its daemon died) and could not be cleared: %w; run 'dlfs umount %s' as root or as the user who mounted it", mp, err, mp)
	}
	log.Info("cleared a dead mount at the mount point: its daemon had died without unmounting", "mountpoint", mp, "was", m.Source)
	return nil
}

func (n *Node) serveMetrics(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics address %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{}))
	n.statusHandlers(mux)
	// Timeouts and a connection limit: idle keep-alives cannot pin the
	// daemon's descriptors (docs/operating.md: Bounds).
	srv, lim, err := netlimit.HTTPServer(ln, mux, n.cfg.MetricsLimits, "metrics", n.log)
	if err != nil {
		ln.Close()
		return fmt.Errorf("metrics address %s: %w", addr, err)
	}
	n.metrics.srv = srv
	n.metrics.addr = ln.Addr()
	go func() {
		if err := n.metrics.srv.Serve(lim); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("metrics server stopped", "err", err)
		}
	}()
	return nil
}

// MetricsAddr returns the address /metrics is served on, or nil.
func (n *Node) MetricsAddr() net.Addr { return n.metrics.addr }

// Wait blocks until the filesystem is unmounted, by Close or from
// outside: umount, fusermount -u, or a lazy unmount once the last file
// open under the detached mount closes.
func (n *Node) Wait() { <-n.served }

// Close unmounts and stops everything. Safe to call twice.
func (n *Node) Close() error {
	n.closing.once.Do(func() {
		var errs []error
		// Before anything: the other members re-place this node's share
		// while it tears down (its peer server serves until the end).
		if n.cluster.gossip != nil {
			if err := n.cluster.gossip.Leave(); err != nil {
				n.log.Warn("telling the cluster this node leaves failed; it will find out", "err", err)
			}
		}
		// First: requests waiting on a PFS that hangs (reads, a refresh's
		// writer) must end before the kernel can let go of the mount.
		if n.tiers.load != nil {
			n.tiers.load.Close()
		}
		if n.closing.stopKeeper != nil {
			n.closing.stopKeeper() // its rescan holds the catalog's, which a refresh waits for
		}
		if n.rescans.control != nil {
			n.rescans.control.close()
			n.rescans.catchUp.close()
		}
		if n.closing.stopAccessLog != nil {
			n.closing.stopAccessLog() // its pipe holds the mount
		}
		if n.server != nil {
			detached := false
			select {
			case <-n.served: // unmounted from outside: nothing left to unmount
			default:
				if m, ok := fusefs.MountAt(n.cfg.Mountpoint); n.mountDev != "" && (!ok || m.Dev != n.mountDev) {
					// Detached lazily from outside, and still served for
					// the files open under it.
					detached = true
				} else if err := n.server.Unmount(); err != nil {
					// Busy (a process holds a file open): detach, so the daemon
					// can still exit; the kernel finishes when it is idle.
					n.log.Warn("unmount failed; detaching lazily", "mountpoint", n.cfg.Mountpoint, "err", err)
					if err := fusefs.Unmount(n.cfg.Mountpoint, true); err != nil {
						errs = append(errs, err)
					}
					detached = true
				}
			}
			served := n.served // ends with the exit at worst
			if detached {
				// A detached mount is served until its last open file
				// closes: a training job may hold one for hours. Stop
				// waiting after a while; files still open then read EIO
				// or ENOTCONN once the daemon is gone.
				select {
				case <-served:
				case <-time.After(detachWait):
					n.log.Warn("files under the detached mount are still open; stopping anyway", "mountpoint", n.cfg.Mountpoint)
				}
			} else {
				<-served
			}
			n.closing.closed = append(n.closing.closed, "fuse")
		}
		for i := len(n.closing.closers) - 1; i >= 0; i-- {
			if err := n.closing.closers[i].fn(); err != nil {
				errs = append(errs, err)
			}
			n.closing.closed = append(n.closing.closed, n.closing.closers[i].name)
		}
		n.closing.err = errors.Join(errs...)
	})
	return n.closing.err
}

// dataset adapts the node to fusefs.Dataset.
type dataset struct{ n *Node }

func (d dataset) Snapshot() *catalog.Snapshot { return d.n.cat.Snapshot() }
func (d dataset) Source() string              { return d.n.cat.Source() }
func (d dataset) ReadAt(ctx context.Context, e *catalog.Entry, dest []byte, off int64, pid uint32) ([]byte, string, error) {
	if err := d.n.cat.Check(ctx, e); err != nil { // no tier serves an entry of a saved catalog unchecked
		return nil, "", err
	}
	start := time.Now()
	b, source, waited, err := d.n.tiers.load.ReadAtWaited(ctx, e, dest, off)
	if err != nil {
		return b, source, err
	}
	took := time.Since(start)
	d.n.lat.read.With(source).Observe(took)
	if off+int64(len(b)) == e.Size {
		d.n.tiers.builder.offer(e) // read to its end: its backing file for the next epoch
	}
	if d.n.readers != nil {
		r := d.n.readers.Observe(pid, e, off, waited > 0, source, took)
		d.n.pf.ObserveRead(r.Cred.Uid, r.Known, e, off, waited) // only the reader's jobs
	}
	return b, source, nil
}

// inferJobs is the job registry as package readers sees it; with off, it
// reports a job announced over the whole mount, so nothing is inferred.
type inferJobs struct {
	*jobs.Registry
	off bool
}

func (j inferJobs) AnnouncedRoots(uid uint32) []string {
	if j.off {
		return []string{"."}
	}
	return j.Registry.AnnouncedRoots(uid)
}

// layout is where job j's ranks run and its samples are cached
// (jobs.Config.Layout): the cluster's read policy says; without a
// cluster, every rank is on this one node, caching all.
func (n *Node) layout(j *jobs.Job) jobs.Layout {
	if n.cluster.owners == nil {
		return jobs.Layout{}
	}
	return n.cluster.owners.Layout(j)
}

// tag is the loader's tag of block key of e (loader.Loader.Tag), for the
// read policy, which is made before the loader.
func (n *Node) tag(e *catalog.Entry, key string) uint64 { return loader.BlockTag(n.dataset, e, key) }

// readWhole reads a whole dataset file through the tiers.
func (n *Node) readWhole(e *catalog.Entry) ([]byte, error) {
	// Checked as the view checks (bounded by the catalog's stall
	// timeout): a list file behind SOURCE is read as SOURCE has it now.
	for try := 0; ; try++ {
		err := dataset{n}.Check(context.Background(), e)
		if err == nil {
			break
		}
		cur := n.cat.Snapshot().Lookup(e.Path())
		if !errors.Is(err, catalog.ErrBehind) || try == 2 || cur == nil {
			return nil, err
		}
		e = cur
	}
	buf := make([]byte, e.Size)
	got, err := n.tiers.load.ReadAt(context.Background(), e, buf, 0)
	if err != nil {
		return nil, err
	}
	if len(got) != len(buf) {
		return nil, fmt.Errorf("read %s: %d of %d bytes", e.Path(), len(got), len(buf))
	}
	copy(buf, got)
	return buf, nil
}

// Refresh rescans SOURCE and invalidates what changed in every tier and in
// the kernel.
func (n *Node) Refresh(ctx context.Context) (catalog.Diff, error) {
	return n.refresh(ctx, n.cat.Refresh)
}

// refresh applies what scan (a full rescan, or one by directories) finds.
func (n *Node) refresh(ctx context.Context, scan func(context.Context) (catalog.Diff, error)) (catalog.Diff, error) {
	return n.rescan(ctx, scan, n.fs.Invalidate)
}

// rescan is refresh, with invalidate telling the kernel what changed.
func (n *Node) rescan(ctx context.Context, scan func(context.Context) (catalog.Diff, error), invalidate func(catalog.Diff)) (catalog.Diff, error) {
	d, err := scan(ctx)
	if err != nil {
		return d, err
	}
	n.src.DropHandles() // no descriptor opened before the refresh reads again
	for _, e := range d.Changed {
		n.tiers.load.Invalidate(e)
	}
	for _, e := range d.Removed {
		n.tiers.load.Invalidate(e)
	}
	invalidate(d)
	if len(d.Changed)+len(d.Removed)+len(d.Added) > 0 {
		n.jobs.Reindex() // plans name files of the new snapshot
		if n.cluster.owners != nil {
			n.cluster.owners.CatalogChanged()
		}
	}
	n.log.Info("refreshed catalog", "changed", len(d.Changed), "removed", len(d.Removed), "added", len(d.Added),
		"dirs_unread", d.Reused, "seconds", d.ScanTime.Seconds())
	return d, nil
}
