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
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/dlfs/dlfs/access"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
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

// Version counts the changes to the jobs so far: whoever read All after
// reading Version v has seen every change up to v.
func (r *Registry) Version() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.version
}

// Subscribe returns a channel that receives a value (dropped if one is
// already pending) whenever the jobs change.
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
