// Package owners is the cluster's read policy: who has sample X, and
// where this node reads it. package daemon builds one Owners per cluster
// node, hands it to the loader as its peer tier (loader.Remote) and to
// the job registry as its layout (jobs.Config.Layout), and closes it.
//
// # What it owns
//
//   - The placement table over the alive members that gossip this node's
//     dataset (package placement), rebuilt on every change of the
//     membership and of the catalog, with the ownership counts stats show.
//   - Job gossip: the jobs this node runs ranks of, as job lines in its
//     cluster metadata, and demand placement from every member's lines
//     (demand.go).
//   - The layouts of balance= plans: where a job's ranks run and which
//     node caches each sample.
//   - The remote reader: a block's owner, its previous owner (who may
//     still cache it), and the fetches, batched per peer (batcher.go).
//
// # What a table change costs
//
// A member leaving or joining changes the table, and every member makes
// the new one before it stops asking the one that left, so the change is
// kept cheap at millions of files (about 0.9 CPU-s at 1 M): the watcher
// keeps the ranks' reads of each job (rankreads.go: they depend on the
// job and its sample count, not on the members), the paths of the
// snapshot's files, and the last demand's arrays; the ownership counts
// come from per-bucket counts made once per snapshot, and the samples
// that moved from a merge of the two tables' sorted assignments, with no
// catalog lookup (ownership.go).
//
// # The view
//
// A View holds the table and its members, the table before the last
// change and its members, and the table over the other members; it never
// changes once stored. The watcher builds a new View on every change and
// swaps it in (atomic.Pointer); a reader loads it once per decision, so
// an owner and its data address always come from one table. The balance=
// layouts computed under a View are kept in it (copied on write), so a
// new View starts with none. The ownership counts are published the same
// way. The one lock left, batchMu, guards the batchers by address.
//
// # Goroutines
//
// Start starts three, and Close stops them: the watcher (watch), the job
// advertiser (advertiseJobs) and the prober of the members' data ports
// (probePeers). New subscribes them, so nothing that changes in between
// is missed, but starts none: the daemon makes Owners before the loader,
// whose peer tier it is, and starts it once the loader exists, because
// the watcher indexes other members' jobs, which may read a list file
// through the loader. Until then the view is empty: every read goes to
// the PFS. Batchers start on first use, one per peer address, and end
// at Close or when their peer is no longer placed. Close closes stop,
// then the peer client, which fails the fetches in flight, then waits for
// all of them. The daemon closes the prefetcher, the readers and the
// warmer, which fetch through the peer tier, before Owners, and the
// cluster after it.
//
// # Lock order
//
// Jobs and ownership call each other, which makes a cycle: the watcher
// calls into the job registry (All, Index and Relayout take
// jobs.Registry.mu), and a job asks for its layout (Layout) while it
// holds its plan lock, jobs.Job.mu, for whoever asks for a plan (the
// prefetcher building its streams, the control plane). The order is
//
//	jobs.Job.mu → Owners (Layout: no lock, an atomic load and a compare and swap)
//	Owners' goroutines, holding no lock of Owners → jobs.Registry.mu
//
// Owners never holds a lock while it calls into jobs, and Layout takes
// none, so the cycle cannot close; jobs.Registry.mu and jobs.Job.mu are
// never held together. batchMu is a leaf: nothing is called under it but
// the start of a batcher's goroutine.
package owners

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/cluster/peer"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
	"github.com/dlfs/dlfs/jobs"
	"github.com/dlfs/dlfs/latency"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/placement"
)

// Config configures the read policy. Zero values take the defaults.
type Config struct {
	NodeName string // this node's member name; required
	// Dataset is this node's dataset identity (integrity.Dataset.String());
	// members that gossip another get no share. Required.
	Dataset string
	// HashPlacement places samples by hashing only, ignoring the jobs'
	// plans (for comparison; placement by demand is the default).
	HashPlacement bool
	// PlacementEpochs is how many epochs of each job, from its first,
	// demand placement counts reads over; default 4.
	PlacementEpochs int
	Logger          *slog.Logger // nil: discard
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{PlacementEpochs: 4} }

// Validate reports the first setting that is out of range.
func (c Config) Validate() error {
	switch {
	case c.NodeName == "":
		return errors.New("owners: no node name; give the node a name (--name)")
	case c.Dataset == "":
		return errors.New("owners: no dataset identity")
	case c.PlacementEpochs < 0:
		return fmt.Errorf("owners: %d placement epochs is negative; give a count such as 4", c.PlacementEpochs)
	}
	return nil
}

// Cluster is the gossip membership (*cluster.Cluster).
type Cluster interface {
	Alive() []cluster.Member
	Subscribe() <-chan struct{}
	StartMeta() cluster.Meta
	SetMeta(cluster.Meta) error
}

// Jobs is the job registry as the policy sees it (*jobs.Registry).
type Jobs interface {
	All() []*jobs.Job
	Subscribe() <-chan struct{}
	Index(spec control.Job) ([]folder.Sample, error)
	MaxPositions() int64
	Relayout()
}

// Peers is the data-plane client (*peer.Client).
type Peers interface {
	Fetch(ctx context.Context, addr string, items []peer.Item) ([]peer.Result, error)
	FetchCached(ctx context.Context, addr string, items []peer.Item) ([]peer.Result, error)
	Connect(ctx context.Context, addr string) error
	Reachability(addr string) (peer.Reach, bool)
	Close()
}

// Model estimates how long a source takes (*perfmodel.Model).
type Model interface {
	Estimate(source string, n int64) time.Duration
}

// Deps are what the policy reads and calls. Every field but Latency is
// required.
type Deps struct {
	Cluster Cluster
	Jobs    Jobs
	// Peers fetches from the other members; Close closes it.
	Peers    Peers
	Model    Model
	Snapshot func() *catalog.Snapshot // the current catalog snapshot
	// Tag is the loader's tag of a block (loader.Loader.Tag), and
	// BlockSize its block size.
	Tag       func(e *catalog.Entry, key string) uint64
	BlockSize int64
	Latency   *latency.Vec // requests to peers, by member; nil: not observed
}

// Owners is the read policy of one cluster node. Safe for concurrent use.
type Owners struct {
	cfg Config // read-only after New
	d   Deps   // read-only after New
	log *slog.Logger

	meta      cluster.Meta  // what this node gossips, less its jobs
	refreshed chan struct{} // capacity 1: the catalog changed
	requests  atomic.Int64  // requests sent to peers
	stop      chan struct{} // closed by Close: the goroutines end
	wg        sync.WaitGroup
	startOnce sync.Once
	closeOnce sync.Once
	// The goroutines' subscriptions, taken in New: table and probe to the
	// membership, jobs to the job registry.
	tableSubs, probeSubs, jobSubs <-chan struct{}

	// view is the placement of the moment: watch builds a new View and
	// stores it; readers load it once per decision. Never nil after New.
	view atomic.Pointer[View]

	batchMu  sync.Mutex // guards batchers
	batchers batchers   // by peer data address (batcher.go)

	own       ownership      // the watcher's; it publishes the counts atomically
	paths     pathCache      // the watcher's
	rankReads rankReadsCache // the watcher's
	// lastDemand are the arrays of the watcher's last demand, to use
	// again: its samples, and its first job's reads.
	lastDemand struct {
		samples []placement.Sample
		reads   []uint32
	}
}

// The loader's peer tier.
var _ loader.Remote = (*Owners)(nil)

// New makes the policy and subscribes its goroutines, which Start starts
// (see Goroutines). Close stops them, started or not.
func New(cfg Config, d Deps) (*Owners, error) {
	if cfg.PlacementEpochs == 0 {
		cfg.PlacementEpochs = DefaultConfig().PlacementEpochs
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.Cluster == nil || d.Jobs == nil || d.Peers == nil || d.Model == nil || d.Snapshot == nil || d.Tag == nil || d.BlockSize <= 0 {
		return nil, errors.New("owners: a dependency is missing (cluster, jobs, peers, model, snapshot, tag and block size are required)")
	}
	o := &Owners{cfg: cfg, d: d, log: cfg.Logger, meta: d.Cluster.StartMeta(),
		refreshed: make(chan struct{}, 1), stop: make(chan struct{}),
		tableSubs: d.Cluster.Subscribe(), jobSubs: d.Jobs.Subscribe(), probeSubs: d.Cluster.Subscribe()}
	o.view.Store(&View{}) // no table yet: every read goes to the PFS
	return o, nil
}

// Start starts the goroutines: the table's watcher, the job advertiser
// and the prober of the members' data ports. It does not block. Only the
// first call starts them, and none after Close.
func (o *Owners) Start() {
	o.startOnce.Do(func() {
		select {
		case <-o.stop:
			return
		default:
		}
		o.wg.Add(3)
		go o.watch(o.tableSubs)
		go o.advertiseJobs(o.jobSubs)
		go o.probePeers(o.probeSubs)
	})
}

// Close stops the goroutines and closes the peer client, which fails the
// fetches in flight, so the batchers end at once. Safe to call twice.
func (o *Owners) Close() {
	o.closeOnce.Do(func() {
		o.startOnce.Do(func() {}) // a Start under way has added to wg; none starts after
		close(o.stop)
		o.d.Peers.Close()
		o.wg.Wait()
	})
}

// CatalogChanged tells the watcher that the catalog changed: the
// ownership counts are made again. It never blocks.
func (o *Owners) CatalogChanged() {
	select {
	case o.refreshed <- struct{}{}:
	default:
	}
}

// Requests counts the requests sent to peers.
func (o *Owners) Requests() int64 { return o.requests.Load() }

// Reachability is how this node's last dial to a data address went.
func (o *Owners) Reachability(addr string) (peer.Reach, bool) { return o.d.Peers.Reachability(addr) }
