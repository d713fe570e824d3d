// Package jobs keeps the training jobs announced on this node and turns
// each into plans: the exact list of files every local rank will read,
// epoch by epoch.
//
// # Lifecycle
//
// A job line (package control) registers a job or updates it; "end" drops
// it. A line is checked completely before anything changes: the merged
// settings, the dataset root, and the dataset index, which is built from
// the catalog (ImageFolder order, package folder) or read from a list
// file. A line that changes only the epoch reuses the index.
//
// # Plans
//
// A job plans Lookahead epochs from the announced one. Plans come from the
// sampler replicas (package sampler) and are computed when asked for and
// cached per (rank, epoch), since a permutation of a million samples takes
// tens of milliseconds. ReadOrder and BalancedPlan (plan.go) are the one
// place a spec becomes a rank's order or a balanced plan; inference
// (package readers) and the simulator call them too.
//
// An inferred job's line (package readers) gives batch= and workers= only
// once its reads showed them. Until then it is planned with
// InferredBatch and InferredWorkers, the window the prefetcher assumes,
// and Batches and the status say they are not known.
//
// # Owners
//
// A job belongs to a user (Owner): the one whose control write announced
// it, or whose process's reads inferred it. Its index holds only the
// samples that user may read by their paths (package access), so its
// plans name, and the prefetcher fetches, nothing else; only that user's
// reads count for it. Another user may neither change nor end it (root
// and Config.Operator may).
//
// # Memory
//
// Every planned position and index sample costs about 24 bytes; all jobs
// together hold at most MaxPositions of them, which grows with the
// catalog, so plans stay within the daemon's memory bound.
//
// The Registry is safe for concurrent use. Subscribers are told, without
// blocking, when the set of plans changes.
package jobs

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"path"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/dlfs/dlfs/access"
	"github.com/dlfs/dlfs/balance"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
)

// ErrJob wraps every rejected job line; it is a control.ErrSyntax, so the
// writer gets EINVAL.
var ErrJob = fmt.Errorf("%w: job rejected", control.ErrSyntax)

// ErrNoJob means a job or plan that does not exist was asked for.
var ErrNoJob = errors.New("jobs: no such job")

// Config configures a Registry.
type Config struct {
	// Snapshot returns the current catalog snapshot.
	Snapshot func() *catalog.Snapshot
	// ReadFile reads a whole dataset file (for dataset=list:PATH).
	ReadFile func(e *catalog.Entry) ([]byte, error)
	// MaxListBytes bounds a list file.
	MaxListBytes int64 // default DefaultMaxListBytes
	// MaxJobs bounds the jobs registered at once.
	MaxJobs int // default 64
	// MaxPositions bounds the sample positions all jobs plan on this node
	// (see Positions), with their indexes' samples (each index counted
	// once, however many jobs share it). Each costs about 24 bytes in the
	// plans, the indexes and the prefetcher's streams. 0: PositionsPerFile
	// per file of the catalog, and at least MinPositions, so that plans
	// stay within the daemon's memory bound, which grows with SOURCE.
	MaxPositions int64
	// Operator may change and end every job (the mounting user); root
	// may too. Anyone else changes only the jobs it owns.
	Operator uint32
	// AllRanks says this node plans every rank of a job, not only its
	// own (a cluster node keeps samples for ranks on other nodes).
	AllRanks bool
	// Layout says, for a job with balance=, where its ranks run and which
	// node caches each sample, as placement says now. It is asked once
	// per epoch plan, and the plan keeps it. nil: one node caching all.
	Layout func(j *Job) Layout
	Logger *slog.Logger // nil: discard
}

// Defaults of Config.
const (
	DefaultMaxJobs = 64
	// DefaultMaxListBytes is the default Config.MaxListBytes: 256 MiB.
	DefaultMaxListBytes = 256 << 20
	// PositionsPerFile and MinPositions make the default MaxPositions:
	// 8 positions per file of SOURCE (192 bytes), and 1 Mi (24 MiB) for
	// a small one.
	PositionsPerFile = 8
	MinPositions     = 1 << 20
)

// Job is a registered job. Its fields do not change; an update replaces
// the Job.
type Job struct {
	Spec    control.Job
	Samples []folder.Sample // the dataset in index order
	Classes int
	// RankEpoch is the epoch each local rank is in. A line with rank=R
	// moves only rank R (each process announces its own); any other line
	// moves every local rank.
	RankEpoch map[int]int
	// Inferred: no one announced the job; package readers inferred it
	// from a stream's reads.
	Inferred bool
	// batchKnown and workersKnown say whether Spec.Batch and Spec.Workers
	// are the DataLoader's: an announced job's line gives them (or takes
	// the defaults); an inferred job's only once its reads showed them.
	// Until then its plans are made with InferredBatch and
	// InferredWorkers, the prefetcher's window, and Batches says nothing.
	batchKnown, workersKnown bool
	// Owner is who the job acts for. Samples hold only what the owner may
	// read by its path, and only the owner's reads move its readers'
	// cursors (Owner.Reads).
	Owner Owner
	// Public: every user may read every sample, so its plans may be shown
	// to all.
	Public bool

	layout func(j *Job) Layout // read-only after Apply; nil: one node
	ahead  *atomic.Int64       // how far its readers may be fetched ahead of; shared by the job's versions
	snap   *catalog.Snapshot   // what Samples index

	mu       sync.Mutex
	plans    map[[2]int][]int32     // (rank, epoch) -> sample indices
	balanced map[int]*balancedEpoch // epoch -> every rank's plan (balance=)
	blocks   map[int][]int          // epochorder: block -> which epoch's permutation each epoch of it uses

	statsMu   sync.Mutex        // guards planStats: reading them never waits for a plan being made
	planStats map[int]PlanStats // epoch -> its plan's figures (balance=), as last made
}

// Layout is where a job's ranks run and its samples are cached.
type Layout struct {
	RankNode []int                // the node of each rank (World of them); -1: unknown
	Owner    func(sample int) int // the node caching sample i (an index of Samples); -1: none
	Cached   int                  // samples the cluster's caches hold, for epochorder
	// ID identifies the layout by content: nodes that see the same
	// placement, ranks and capacity compute the same ID, and a plan made
	// under another ID is made again until it is pinned.
	ID uint64
}

// complete reports whether every rank's node is known.
func (l Layout) complete() bool {
	for _, n := range l.RankNode {
		if n < 0 {
			return false
		}
	}
	return true
}

// balancedEpoch is one epoch's plan under balance=: every rank's samples in
// read order, and its batch sizes.
type balancedEpoch struct {
	id      uint64 // of the layout it was made from
	pinned  bool   // kept whatever the layout does from now on
	orders  [][]int32
	batches [][]int
	stats   PlanStats
}

// PlanStats describe one epoch's plan under balance=.
type PlanStats struct {
	// Layout is the layout's ID (hex): every node that planned the
	// epoch from the same placement shows the same.
	Layout string `json:"layout"`
	// Pinned: the plan no longer changes with the layout (a local rank
	// is in the epoch and every rank's node was known).
	Pinned bool `json:"pinned"`
	// Reads counts the planned reads; Local those whose sample the
	// reader's own node caches, PFS those no node caches.
	Reads int64 `json:"reads"`
	Local int64 `json:"local"`
	PFS   int64 `json:"pfs"`
	// Moved counts the samples Algorithm 1 moved off their node.
	Moved int64 `json:"moved"`
	// ImbalanceMedian and ImbalanceP90 are percentiles, over the global
	// batches, of the share of the batch that balancing had to move
	// (balance.Imbalance, Yang & Cong's measure), in percent.
	ImbalanceMedian float64 `json:"imbalance_median"`
	ImbalanceP90    float64 `json:"imbalance_p90"`
	// MinBatch and MaxBatch are the range of every rank's batch sizes
	// (equal to batch= except the last, unless balance=solar).
	MinBatch int `json:"min_batch"`
	MaxBatch int `json:"max_batch"`
}

// InferredBatch and InferredWorkers are the DataLoader's shape an
// inferred job is planned with until its reads show it: what the
// prefetcher's window assumes of a loader it knows nothing of.
const (
	InferredBatch   = 32
	InferredWorkers = 4
)

// BatchKnown reports whether Spec.Batch is the DataLoader's batch size
// (not InferredBatch, assumed for an inferred job whose reads have not
// shown it).
func (j *Job) BatchKnown() bool { return j.batchKnown }

// WorkersKnown reports the same of Spec.Workers.
func (j *Job) WorkersKnown() bool { return j.workersKnown }

// Ahead is how many samples the prefetcher may fetch ahead of each of the
// job's readers; 0: no bound (every announced job).
func (j *Job) Ahead() int {
	if j.ahead == nil {
		return 0
	}
	return int(j.ahead.Load())
}

// N is the dataset's length.
func (j *Job) N() int { return len(j.Samples) }

// Epochs returns the epochs planned for rank, in order.
func (j *Job) Epochs(rank int) []int {
	e := make([]int, j.Spec.Lookahead)
	for i := range e {
		e[i] = j.RankEpoch[rank] + i
	}
	return e
}

// Planned reports whether epoch is planned for rank.
func (j *Job) Planned(rank, epoch int) bool {
	first, ok := j.RankEpoch[rank]
	return ok && epoch >= first && epoch < first+j.Spec.Lookahead
}

// Order returns the sample indices rank reads in epoch, in order. The
// slice is shared and must not be modified. Indices are 4 bytes: a plan
// position costs that much here (a dataset holds fewer than 2^31 samples).
func (j *Job) Order(rank, epoch int) []int32 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.orderLocked(rank, epoch)
}

func (j *Job) orderLocked(rank, epoch int) []int32 {
	if j.Spec.Balance != "" {
		return j.balancedLocked(epoch).orders[rank]
	}
	if p, ok := j.plans[[2]int{rank, epoch}]; ok {
		return p
	}
	p := narrow(ReadOrder(j.Spec, j.N(), rank, epoch))
	if j.plans == nil {
		j.plans = map[[2]int][]int32{}
	}
	// Keep only the planned windows.
	for k := range j.plans {
		if !j.Planned(k[0], k[1]) {
			delete(j.plans, k)
		}
	}
	j.plans[[2]int{rank, epoch}] = p
	return p
}

// Batches returns the batch sizes rank trains on in epoch, in order: the
// stock B (and a shorter last) unless balance=solar made them differ; nil
// if the batch size is not known (BatchKnown).
func (j *Job) Batches(rank, epoch int) []int {
	if !j.batchKnown {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.Spec.Balance != "" {
		return j.balancedLocked(epoch).batches[rank]
	}
	n := len(j.orderLocked(rank, epoch))
	var out []int
	for n > 0 {
		out = append(out, min(n, j.Spec.Batch))
		n -= j.Spec.Batch
	}
	return out
}

// balancedLocked returns epoch's plan under balance=. A plan is made from
// the layout of the moment and made again when the layout's ID changes,
// until it is pinned: from the time a local rank is in the epoch and every
// rank's node is known, the plan stays as it is for the rest of the epoch
// (membership changes apply from the next epoch; a sample whose owner died
// is read from wherever it is). Plans of epochs no local rank plans any
// more are dropped.
func (j *Job) balancedLocked(epoch int) *balancedEpoch {
	p := j.balanced[epoch]
	if p != nil && p.pinned {
		return p
	}
	var lay Layout
	if j.layout != nil {
		lay = j.layout(j)
	}
	if lay.RankNode == nil {
		lay.RankNode = make([]int, j.Spec.World) // one node, caching all
		lay.Owner = func(int) int { return 0 }
		lay.Cached = j.N()
	}
	if p == nil || p.id != lay.ID {
		p = j.makeBalanced(epoch, lay)
	}
	p.pinned = lay.complete() && j.current(epoch)
	p.stats.Pinned = p.pinned
	if j.balanced == nil {
		j.balanced = map[int]*balancedEpoch{}
	}
	for e := range j.balanced {
		if !j.plannedByAny(e) {
			delete(j.balanced, e)
		}
	}
	j.balanced[epoch] = p
	j.statsMu.Lock()
	j.planStats = map[int]PlanStats{}
	for e, p := range j.balanced {
		j.planStats[e] = p.stats
	}
	j.statsMu.Unlock()
	return p
}

// PlanStats returns the figures of the plans made so far under balance=,
// by epoch, without making any.
func (j *Job) PlanStats() map[int]PlanStats {
	j.statsMu.Lock()
	defer j.statsMu.Unlock()
	return maps.Clone(j.planStats)
}

// makeBalanced plans epoch under lay.
func (j *Job) makeBalanced(epoch int, lay Layout) *balancedEpoch {
	p := &balancedEpoch{id: lay.ID}
	p.stats.Layout = fmt.Sprintf("%016x", lay.ID)
	p.stats.MinBatch = math.MaxInt
	var imb []float64
	plan, _ := BalancedPlan(j.Spec, j.N(), j.permutationLocked(epoch, lay.Cached), lay.RankNode, lay.Owner, func(b balance.Batch, plan balance.Plan) error {
		if j.Spec.Balance == "solar" {
			imb = append(imb, balance.Imbalance(b))
		} else {
			imb = append(imb, float64(plan.Moved)/float64(len(b.Samples))) // balance.Imbalance, without a second pass
		}
		p.stats.Moved += int64(plan.Moved)
		for r, ss := range plan.Ranks {
			p.stats.MinBatch = min(p.stats.MinBatch, len(ss))
			p.stats.MaxBatch = max(p.stats.MaxBatch, len(ss))
			for _, s := range ss {
				p.stats.Reads++
				switch o := lay.Owner(s); {
				case o < 0:
					p.stats.PFS++
				case o == lay.RankNode[r]:
					p.stats.Local++
				}
			}
		}
		return nil
	})
	p.orders, p.batches = plan.Orders, plan.Batches
	if p.stats.MinBatch == math.MaxInt {
		p.stats.MinBatch = 0
	}
	sort.Float64s(imb)
	p.stats.ImbalanceMedian = 100 * quantile(imb, 0.5)
	p.stats.ImbalanceP90 = 100 * quantile(imb, 0.9)
	return p
}

// quantile of sorted xs (nearest rank); 0 for none.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return xs[min(int(q*float64(len(xs))), len(xs)-1)]
}

// current reports whether a local rank is in epoch (or past it).
func (j *Job) current(epoch int) bool {
	for _, e := range j.RankEpoch {
		if e >= epoch {
			return true
		}
	}
	return false
}

// Plan describes epoch's plan under balance= (made if it was not); ok is
// false for a job without balance=.
func (j *Job) Plan(epoch int) (st PlanStats, ok bool) {
	if j.Spec.Balance == "" {
		return PlanStats{}, false
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.balancedLocked(epoch).stats, true
}

// PlanID is the layout ID epoch's plan was made from (0 without
// balance=): a prefetch stream follows a plan while it stays the same.
func (j *Job) PlanID(epoch int) uint64 {
	if j.Spec.Balance == "" {
		return 0
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.balancedLocked(epoch).id
}

// plannedByAny reports whether any local rank plans epoch.
func (j *Job) plannedByAny(epoch int) bool {
	for r := range j.RankEpoch {
		if j.Planned(r, epoch) {
			return true
		}
	}
	return false
}

// permutationLocked is the epoch whose permutation epoch uses: itself,
// unless epochorder=true, which reorders the permutations of each block of
// lookahead epochs for reuse of the caches (balance.EpochOrder). Blocks
// are fixed (epochs b·L to b·L+L−1), so every node and every call agree.
func (j *Job) permutationLocked(epoch, cached int) int {
	if !j.Spec.EpochOrder || j.Spec.Lookahead < 2 {
		return epoch
	}
	l := j.Spec.Lookahead
	block := epoch / l
	order, ok := j.blocks[block]
	if !ok {
		d := Distributed(j.Spec, j.N())
		perms := make([][]int, l)
		for i := range perms {
			perms[i] = d.Global(block*l + i)
		}
		order = balance.EpochOrder(perms, cached)
		if j.blocks == nil {
			j.blocks = map[int][]int{}
		}
		j.blocks[block] = order
	}
	return block*l + order[epoch-block*l]
}

// narrow copies sample indices into 4-byte ones.
func narrow(xs []int) []int32 {
	out := make([]int32, len(xs))
	for i, x := range xs {
		out[i] = int32(x)
	}
	return out
}

// Positions is how many sample positions a job with spec over n samples
// plans: each planned rank's reads over its lookahead epochs. A
// DistributedSampler rank reads ceil(n/world) samples an epoch; every rank
// of another sampler reads all n. With allRanks every rank of the world
// is planned, else only spec.Ranks.
func Positions(spec control.Job, n int, allRanks bool) int64 {
	ranks := int64(len(spec.Ranks))
	if allRanks || spec.Balance != "" {
		ranks = int64(spec.World) // a balanced plan holds every rank's order
	}
	perRank := int64(n)
	if spec.Sampler == "distributed" {
		perRank = (int64(n) + int64(spec.World) - 1) / int64(max(spec.World, 1))
	}
	return ranks * perRank * int64(spec.Lookahead)
}

// CheckRoom reports, before any line of a write is applied, whether the
// jobs named by names fit under MaxJobs with those registered.
func (r *Registry) CheckRoom(names []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.jobs)
	seen := map[string]bool{}
	for _, name := range names {
		if r.jobs[name] == nil && !seen[name] {
			seen[name] = true
			n++
		}
	}
	if n > r.cfg.MaxJobs {
		return fmt.Errorf("%w: %d jobs would be registered, at most %d; end one first (end job=NAME)", ErrJob, n, r.cfg.MaxJobs)
	}
	return nil
}

// MaxPositions is the most sample positions and index samples all jobs
// may hold on this node now (Config.MaxPositions).
func (r *Registry) MaxPositions() int64 {
	if r.cfg.MaxPositions > 0 {
		return r.cfg.MaxPositions
	}
	return max(MinPositions, PositionsPerFile*int64(r.cfg.Snapshot().Files))
}

// checkPositions refuses j if, with every other job, this node would hold
// more than MaxPositions sample positions and index samples.
func (r *Registry) checkPositions(j *Job) error {
	spec, limit := j.Spec, r.MaxPositions()
	indexes := map[*folder.Sample]bool{}
	cost := func(o *Job) int64 {
		p := Positions(o.Spec, o.N(), r.cfg.AllRanks)
		if o.N() > 0 && !indexes[&o.Samples[0]] {
			indexes[&o.Samples[0]] = true // an index shared by several jobs counts once
			p += int64(o.N())
		}
		return p
	}
	total := cost(j)
	r.mu.Lock()
	for name, o := range r.jobs {
		if name != spec.Name {
			total += cost(o)
		}
	}
	r.mu.Unlock()
	if total > limit {
		return fmt.Errorf("%w: job %s would make this node hold %d sample positions and index samples with the other jobs (%d samples, world=%d, lookahead=%d, sampler=%s), over the memory bound of %d (%d per file of SOURCE, at least %d); lower lookahead or end other jobs",
			ErrJob, spec.Name, total, j.N(), spec.World, spec.Lookahead, spec.Sampler, limit, PositionsPerFile, MinPositions)
	}
	return nil
}

// Reads calls fn(rank, i) for every read of sample i by any rank of a job
// with spec over n samples, in epochs from to from+count-1. It draws one
// permutation per epoch for all the ranks of a DistributedSampler;
// RandomSampler and SequentialSampler ranks each read every sample.
func Reads(spec control.Job, n, from, count int, fn func(rank, i int)) {
	for e := from; e < from+count; e++ {
		if spec.Sampler != "distributed" {
			for r := 0; r < spec.World; r++ {
				for i := 0; i < n; i++ {
					fn(r, i)
				}
			}
			continue
		}
		for pos, i := range Distributed(spec, n).Global(e) {
			fn(pos%spec.World, i)
		}
	}
}

// Index builds the dataset index of spec from the current snapshot, as a
// job line with spec would, without registering a job.
func (r *Registry) Index(spec control.Job) ([]folder.Sample, error) {
	return r.IndexAs(access.Root, spec)
}

// IndexAs is Index as user cred sees the dataset: only the samples it may
// read by their paths (see Job.Owner).
func (r *Registry) IndexAs(cred access.Cred, spec control.Job) ([]folder.Sample, error) {
	x, err := r.index(spec, Owner{Cred: cred})
	return x.samples, err
}

// Registry holds the jobs of this node.
type Registry struct {
	cfg Config

	mu   sync.Mutex
	jobs map[string]*Job // mu guards jobs, subs and aheads
	subs []chan struct{}
	// version counts the changes notified to subs.
	version uint64
	aheads  map[string]*atomic.Int64 // Job.Ahead, by name (inferred jobs)
}

// New returns an empty registry.
func New(cfg Config) *Registry {
	if cfg.MaxListBytes <= 0 {
		cfg.MaxListBytes = DefaultMaxListBytes
	}
	if cfg.MaxJobs <= 0 {
		cfg.MaxJobs = DefaultMaxJobs
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Registry{cfg: cfg, jobs: map[string]*Job{}}
}

// Subscribe returns a channel that receives a value (dropped if one is
// already pending) whenever the jobs change.
// Version counts the changes to the jobs so far: whoever read All after
// reading Version v has seen every change up to v.
func (r *Registry) Version() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.version
}

func (r *Registry) Subscribe() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := make(chan struct{}, 1)
	r.subs = append(r.subs, c)
	return c
}

func (r *Registry) notifyLocked() {
	r.version++
	for _, c := range r.subs {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// Apply registers or updates the job of line for root. Nothing changes on
// error.
func (r *Registry) Apply(line control.Job) error { return r.apply(line, false, RootOwner) }

// ApplyAs registers or updates the job of line for owner, who must own
// the job if it exists (or be root or the operator). Nothing changes on
// error.
func (r *Registry) ApplyAs(owner Owner, line control.Job) error { return r.apply(line, false, owner) }

// ApplyInferred registers or updates a job that no one announced (package
// readers inferred it from the reads of a process of user owner). It is
// shown as inferred, and an announced line for the same name makes it an
// announced job.
func (r *Registry) ApplyInferred(owner access.Cred, line control.Job) error {
	return r.apply(line, true, Owner{Cred: owner})
}

// ErrNotOwner means a user tried to change a job that another owns.
var ErrNotOwner = fmt.Errorf("%w: not the job's owner", ErrJob)

// mayChange reports whether who may change or end j.
func (r *Registry) mayChange(who Owner, j *Job) error {
	if who.IsRoot() || who.Uid == r.cfg.Operator || who.Uid == j.Owner.Uid {
		return nil
	}
	return fmt.Errorf("%w: job %s belongs to uid %d (you are uid %d); give yours another name with job=NAME", ErrNotOwner, j.Spec.Name, j.Owner.Uid, who.Uid)
}

// SetAhead bounds how many samples the prefetcher may fetch ahead of the
// readers of job name (0: no bound), now or once it is registered.
func (r *Registry) SetAhead(name string, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// No notification: the plans do not change, and the prefetcher reads
	// the bound whenever it looks for work (every read wakes it).
	r.aheadLocked(name).Store(int64(n))
}

func (r *Registry) aheadLocked(name string) *atomic.Int64 {
	if r.aheads == nil {
		r.aheads = map[string]*atomic.Int64{}
	}
	a := r.aheads[name]
	if a == nil {
		a = new(atomic.Int64)
		r.aheads[name] = a
	}
	return a
}

// AnnouncedRoots returns the dataset roots (relative to the mount, "."
// for all of it) of the registered jobs user uid announced rather than
// inferred, in no order.
func (r *Registry) AnnouncedRoots(uid uint32) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, j := range r.jobs {
		if !j.Inferred && j.Owner.Uid == uid {
			out = append(out, j.Spec.Root)
		}
	}
	return out
}

// Announced reports whether any registered job was announced rather than
// inferred.
func (r *Registry) Announced() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, j := range r.jobs {
		if !j.Inferred {
			return true
		}
	}
	return false
}

func (r *Registry) apply(line control.Job, inferred bool, owner Owner) error {
	r.mu.Lock()
	prev := r.jobs[nameOf(line)]
	r.mu.Unlock()
	base := control.DefaultJob()
	if prev != nil {
		if err := r.mayChange(owner, prev); err != nil {
			return err
		}
		if owner.Uid != prev.Owner.Uid {
			owner = prev.Owner // root or the operator moves another's job: it stays the owner's
		}
		base = prev.Spec
	}
	spec := line.Merge(base)
	// The shape assumed for an inferred job is no one's: a line that
	// takes it over (an announcement) and leaves it out gets the defaults.
	batchKnown, workersKnown := !inferred || line.Set["batch"], !inferred || line.Set["workers"]
	switch {
	case !batchKnown:
		spec.Batch = InferredBatch
	case prev != nil && !prev.batchKnown && !line.Set["batch"]:
		spec.Batch = control.DefaultJob().Batch
	}
	switch {
	case !workersKnown:
		spec.Workers = InferredWorkers
	case prev != nil && !prev.workersKnown && !line.Set["workers"]:
		spec.Workers = control.DefaultJob().Workers
	}
	if err := spec.Check(); err != nil {
		return err
	}
	j := &Job{Spec: spec, RankEpoch: map[int]int{}, layout: r.cfg.Layout, Owner: owner, batchKnown: batchKnown, workersKnown: workersKnown}
	for _, r := range spec.Ranks {
		j.RankEpoch[r] = spec.Epoch
		if prev != nil && line.Set["rank"] && r != line.Ranks[0] {
			if e, ok := prev.RankEpoch[r]; ok {
				j.RankEpoch[r] = e
			}
		}
	}
	if err := r.CheckRoom([]string{spec.Name}); err != nil {
		return err
	}
	if prev != nil && prev.Spec.SameDataset(spec) && prev.Owner.view() == owner.view() {
		j.Samples, j.Classes, j.snap, j.Public = prev.Samples, prev.Classes, prev.snap, prev.Public
	} else {
		x, err := r.index(spec, owner)
		if err != nil {
			return err
		}
		j.Samples, j.Classes, j.snap, j.Public = x.samples, x.classes, x.snap, x.public
	}
	if err := r.checkPositions(j); err != nil {
		return err
	}
	if prev != nil && prev.Spec.SameDataset(spec) && prev.Spec.SamePlans(spec) {
		j.keepPinned(prev)
	}
	r.mu.Lock()
	if cur := r.jobs[spec.Name]; cur != prev && cur != nil {
		if err := r.mayChange(owner, cur); err != nil {
			r.mu.Unlock()
			return err // another user registered the name meanwhile
		}
	}
	j.Inferred = inferred
	if inferred {
		j.ahead = r.aheadLocked(spec.Name)
	} else {
		delete(r.aheads, spec.Name)
	}
	r.jobs[spec.Name] = j
	r.notifyLocked()
	r.mu.Unlock()
	r.cfg.Logger.Info("job registered", "job", spec.Name, "samples", j.N(), "epoch", spec.Epoch,
		"sampler", spec.Sampler, "world", spec.World, "ranks", spec.Ranks)
	return nil
}

func nameOf(line control.Job) string {
	if line.Set["job"] {
		return line.Name
	}
	return control.DefaultJob().Name
}

// keepPinned takes prev's pinned plans and epoch orders (an update of the
// job must not change an epoch's plan under a rank still in it).
func (j *Job) keepPinned(prev *Job) {
	prev.mu.Lock()
	defer prev.mu.Unlock()
	for e, p := range prev.balanced {
		if p.pinned && j.plannedByAny(e) {
			if j.balanced == nil {
				j.balanced = map[int]*balancedEpoch{}
			}
			j.balanced[e] = p
		}
	}
	j.blocks = prev.blocks
}

// indexed is a dataset index as one user sees it.
type indexed struct {
	samples []folder.Sample
	classes int
	snap    *catalog.Snapshot
	public  bool // every user may read every sample
}

// index builds the dataset index of spec from the current snapshot, as
// owner may read it, or shares the index of a registered job over the
// same dataset and snapshot seen by the same user: the jobs of a sweep,
// and the inferred jobs of several reading processes, read one dataset,
// whose index is 24 bytes a sample.
func (r *Registry) index(spec control.Job, owner Owner) (indexed, error) {
	snap := r.cfg.Snapshot()
	r.mu.Lock()
	for _, j := range r.jobs {
		if j.snap == snap && j.Spec.SameDataset(spec) && j.Owner.view() == owner.view() {
			r.mu.Unlock()
			return indexed{j.Samples, j.Classes, snap, j.Public}, nil
		}
	}
	r.mu.Unlock()
	var (
		samples []folder.Sample
		classes int
		err     error
	)
	walked := spec.Dataset != "list"
	if walked {
		samples, classes, err = r.folder(snap, spec)
	} else {
		samples, classes, err = r.list(snap, spec, owner.Cred)
	}
	if err != nil {
		return indexed{}, err
	}
	all := len(samples)
	samples = visible(snap, spec.Root, samples, owner.Cred, walked)
	if len(samples) == 0 {
		return indexed{}, fmt.Errorf("%w: root=%s holds no samples with extensions %v that uid %d may read (of %d)", ErrJob, spec.Root, exts(spec), owner.Uid, all)
	}
	return indexed{samples, classes, snap, public(snap, spec.Root, samples, walked)}, nil
}

// folder builds the ImageFolder index of spec, as root sees it.
func (r *Registry) folder(snap *catalog.Snapshot, spec control.Job) ([]folder.Sample, int, error) {
	idx, err := folder.Build(snap, spec.Root, spec.Extensions)
	if errors.Is(err, folder.ErrTooLarge) {
		return nil, 0, fmt.Errorf("%w: root=%s: %v", ErrJob, spec.Root, err)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%w: root=%s: not a directory of the mount", ErrJob, spec.Root)
	}
	if len(idx.Samples) == 0 {
		return nil, 0, fmt.Errorf("%w: root=%s holds no samples with extensions %v", ErrJob, spec.Root, exts(spec))
	}
	return idx.Samples, len(idx.Classes), nil
}

func exts(spec control.Job) []string {
	if spec.Extensions == nil {
		return folder.IMGExtensions
	}
	return spec.Extensions
}

// list reads dataset=list:PATH: one sample path per line, relative to
// root; blank lines are skipped. The list must be a file cred may read:
// its lines are quoted in errors.
func (r *Registry) list(snap *catalog.Snapshot, spec control.Job, cred access.Cred) ([]folder.Sample, int, error) {
	e, err := folder.Resolve(snap, spec.ListPath)
	if err != nil || !e.IsRegular() || !cred.CanRead(e) {
		return nil, 0, fmt.Errorf("%w: dataset=list:%s: no such file in the mount that uid %d may read", ErrJob, spec.ListPath, cred.Uid)
	}
	if e.Size > r.cfg.MaxListBytes {
		return nil, 0, fmt.Errorf("%w: dataset=list:%s: %d bytes is more than %d", ErrJob, spec.ListPath, e.Size, r.cfg.MaxListBytes)
	}
	data, err := r.cfg.ReadFile(e)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: dataset=list:%s: %v", ErrJob, spec.ListPath, err)
	}
	root := strings.Trim(path.Clean("/"+spec.Root), "/")
	var out []folder.Sample
	for i, line := range bytes.Split(data, []byte("\n")) {
		p := strings.TrimSpace(string(line))
		if p == "" {
			continue
		}
		full := strings.Trim(path.Clean("/"+root+"/"+p), "/")
		f, err := folder.Resolve(snap, full)
		if err != nil || !f.IsRegular() {
			return nil, 0, fmt.Errorf("%w: dataset=list:%s line %d: %q is not a file of the mount", ErrJob, spec.ListPath, i+1, p)
		}
		out = append(out, folder.NewSample(full, f, 0))
	}
	if len(out) == 0 {
		return nil, 0, fmt.Errorf("%w: dataset=list:%s lists no samples", ErrJob, spec.ListPath)
	}
	return out, 0, nil
}

// Reindex rebuilds every job's dataset index from the current snapshot,
// after a refresh. A job whose dataset no longer indexes (its root is
// gone) is dropped, with a warning.
func (r *Registry) Reindex() {
	for _, old := range r.All() {
		x, err := r.index(old.Spec, old.Owner)
		r.mu.Lock()
		if r.jobs[old.Spec.Name] != old {
			r.mu.Unlock()
			continue // replaced meanwhile
		}
		if err != nil {
			delete(r.jobs, old.Spec.Name)
			r.cfg.Logger.Warn("job dropped: its dataset is gone after the refresh", "job", old.Spec.Name, "err", err)
		} else {
			r.jobs[old.Spec.Name] = &Job{Spec: old.Spec, Samples: x.samples, Classes: x.classes, RankEpoch: old.RankEpoch, layout: r.cfg.Layout,
				Inferred: old.Inferred, ahead: old.ahead, snap: x.snap, Owner: old.Owner, Public: x.public}
		}
		r.notifyLocked()
		r.mu.Unlock()
	}
}

// Relayout tells subscribers that the plans of jobs with balance= may
// have changed: the layout they are made from did.
func (r *Registry) Relayout() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, j := range r.jobs {
		if j.Spec.Balance != "" {
			r.notifyLocked()
			return
		}
	}
}

// End drops a job.
func (r *Registry) End(name string) error { return r.EndAs(RootOwner, name) }

// EndAs drops a job for who, who must own it (or be root or the
// operator).
func (r *Registry) EndAs(who Owner, name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	j, ok := r.jobs[name]
	if !ok {
		return fmt.Errorf("%w: end job=%s: no such job", ErrJob, name)
	}
	if err := r.mayChange(who, j); err != nil {
		return err
	}
	delete(r.jobs, name)
	delete(r.aheads, name)
	r.notifyLocked()
	return nil
}

// Get returns the job called name, or nil.
func (r *Registry) Get(name string) *Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.jobs[name]
}

// All returns the jobs sorted by name.
func (r *Registry) All() []*Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Job, 0, len(r.jobs))
	for _, j := range r.jobs {
		out = append(out, j)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Spec.Name < out[b].Spec.Name })
	return out
}

// Status is a job as reported in .dlfs/control.
type Status struct {
	Root       string         `json:"root"`
	Dataset    string         `json:"dataset"`
	Samples    int            `json:"samples"`
	Classes    int            `json:"classes,omitempty"`
	Sampler    string         `json:"sampler"`
	Seed       uint64         `json:"seed"`
	Epoch      int            `json:"epoch"`
	World      int            `json:"world"`
	Ranks      []int          `json:"ranks"`
	Shuffle    bool           `json:"shuffle"`
	DropLast   bool           `json:"drop_last"`
	Batch      int            `json:"batch"`
	Workers    int            `json:"workers"`
	Lookahead  int            `json:"lookahead"`
	RankEpoch  map[string]int `json:"rank_epochs"`
	Extensions []string       `json:"extensions,omitempty"`
	Inferred   bool           `json:"inferred,omitempty"`
	// Unknown names what an inferred job's reads have not shown yet:
	// "batch", "workers" (each shown as 0 then).
	Unknown    []string `json:"unknown,omitempty"`
	Balance    string   `json:"balance,omitempty"`
	EpochOrder bool     `json:"epochorder,omitempty"`
	// Plans are the plans made under balance=, by "epoch-E".
	Plans map[string]PlanStats `json:"plans,omitempty"`
}

// Statuses describes every job, by name.
func (r *Registry) Statuses() map[string]Status {
	out := map[string]Status{}
	for _, j := range r.All() {
		s := j.Spec
		ds := s.Dataset
		if ds == "list" {
			ds = "list:" + s.ListPath
		}
		out[s.Name] = Status{Root: s.Root, Dataset: ds, Samples: j.N(), Classes: j.Classes, Sampler: s.Sampler,
			Seed: s.Seed, Epoch: s.Epoch, World: s.World, Ranks: s.Ranks, Shuffle: s.Shuffle, DropLast: s.DropLast,
			Batch: s.Batch, Workers: s.Workers, Lookahead: s.Lookahead, RankEpoch: map[string]int{}, Extensions: s.Extensions,
			Inferred: j.Inferred}
		st := out[s.Name]
		if !j.batchKnown {
			st.Batch, st.Unknown = 0, append(st.Unknown, "batch")
		}
		if !j.workersKnown {
			st.Workers, st.Unknown = 0, append(st.Unknown, "workers")
		}
		out[s.Name] = st
		for r, e := range j.RankEpoch {
			out[s.Name].RankEpoch[fmt.Sprintf("rank-%d", r)] = e
		}
		if s.Balance != "" {
			st := out[s.Name]
			st.Balance, st.EpochOrder, st.Plans = s.Balance, s.EpochOrder, map[string]PlanStats{}
			for e, p := range j.PlanStats() {
				st.Plans[fmt.Sprintf("epoch-%d", e)] = p
			}
			out[s.Name] = st
		}
	}
	return out
}
