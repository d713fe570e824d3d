// Package allocator divides a node's loader CPUs between the DataLoaders
// of the training jobs that read through it, by what each needs
// (A-Dloader, seed 002).
//
// # Inputs
//
// Every rank's DataLoader (the Python helper's dlfs.DataLoader) reports
// every few seconds how long its training loop held each batch, how long
// it waited for the next, its workers and their time and CPU time per
// sample (package control's report line); dlfs adds its own time to serve
// a sample (Figures.Read).
//
// # Model and allocation
//
// model.go fits each rank's throughput T(d) = min(μ, λ(d)), with a knee
// where the workers of all ranks ask for more CPU than the node has.
// allocate.go chooses workers per rank: need (Algorithm 1, by marginal
// gain, no rank far below what even would give it) or even.
//
// # When
//
// A new allocation is made when a rank first reports (arrival), when a
// job ends (End, or no report from any of its ranks for Config.Idle), and
// when a rank's figures drift from those its advice was made from by more
// than Config.Drift, the last at most once per epoch of that job. Expiry
// is checked on every call, so the allocator needs no goroutine of its
// own. The helper applies advice when its next epoch starts.
package allocator

import (
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
)

// Mode is how workers are shared.
type Mode string

const (
	// Need gives workers where the model says they add the most.
	Need Mode = "need"
	// Even splits them equally, for comparison.
	Even Mode = "even"
)

// ParseMode parses a --allocation value.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case Need, Even:
		return Mode(s), nil
	}
	return "", fmt.Errorf("allocation %q: want need or even", s)
}

// Config configures an Allocator.
type Config struct {
	// CPUs are the node's CPUs for loading: the most workers advised in
	// total (but one per rank at least).
	CPUs int // default runtime.NumCPU()
	// Cores are the processors the workers run on, where the model's
	// contention knee is: workers that mostly wait on reads may
	// outnumber them, workers that decode may not.
	Cores int  // default runtime.NumCPU()
	Mode  Mode // default Need
	// Idle ends a job none of whose ranks reported, or read (LastRead),
	// for this long.
	Idle time.Duration // default 2 min
	// LastRead returns when dlfs last served a read to a rank's
	// processes (zero: never, or unknown); nil counts reports alone.
	LastRead func(Key) time.Time
	// Drift is the relative change in a rank's fit (μ, or its workers'
	// time per sample) that calls for a new allocation.
	Drift float64 // default 0.2
	// MaxWorkers bounds one rank's workers.
	MaxWorkers int // default 64
	// History is how many changes the timeline keeps.
	History int // default 1024
	// MaxRanks bounds the ranks reporting at once: each costs the
	// allocation time (it grows with ranks² × CPUs) and memory.
	MaxRanks int // default 256
	// NodeCPU returns the node's busy and total CPU time so far (any one
	// unit), from which the model learns what the node spends per sample
	// beyond the workers; nil leaves that out.
	NodeCPU func() (busy, total float64, err error)
	Logger  *slog.Logger
	Now     func() time.Time // default time.Now
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{CPUs: runtime.NumCPU(), Cores: runtime.NumCPU(), Mode: Need, Idle: 2 * time.Minute, Drift: 0.2, MaxWorkers: 64, History: 1024, MaxRanks: 256}
}

// Key names one rank of one job.
type Key struct {
	Job  string
	Rank int
}

func (k Key) String() string { return fmt.Sprintf("%s/rank-%d", k.Job, k.Rank) }

// Advice is what a rank's DataLoader should run with.
type Advice struct {
	Workers        int     `json:"workers"`
	PrefetchFactor int     `json:"prefetch_factor"`
	Predicted      float64 `json:"predicted_samples_per_second"`
	Mode           Mode    `json:"mode"`
	// Generation counts the allocations made on this node; Reason says
	// what made this one (arrival, end, idle or drift).
	Generation int64  `json:"generation"`
	Reason     string `json:"reason"`
}

// Change is one rank's worker count changing, for the timeline.
type Change struct {
	Seconds float64 `json:"seconds"` // since the allocator started
	Job     string  `json:"job"`
	Rank    int     `json:"rank"`
	Workers int     `json:"workers"` // 0: the rank left
	Reason  string  `json:"reason"`
}

type rank struct {
	figures Figures // the last report
	smooth  Figures // the reports since its workers last changed, each new one weighing half
	latest  Fit     // from smooth
	used    Fit     // the one the current advice was made from
	advice  Advice
	seen    time.Time
}

type job struct {
	seen        time.Time
	epoch       int // the highest epoch its ranks reported
	changeEpoch int // the epoch its advice last changed for drift
}

// Allocator keeps the ranks' figures and advice. Safe for concurrent use.
//
// Locking: mu guards everything below it. Config.NodeCPU and
// Config.LastRead are called with mu held, so they must not call the
// Allocator.
type Allocator struct {
	// Read-only after New.
	cfg   Config
	log   *slog.Logger
	start time.Time

	mu      sync.Mutex
	ranks   map[Key]*rank
	jobs    map[string]*job
	gen     int64
	changes []Change
	slow    float64 // the predicted contention of the current advice

	// The node's CPU (cfg.NodeCPU): the last reading, and the share of
	// it busy, each window of a second or more weighing half.
	cpuAt             time.Time
	cpuBusy, cpuTotal float64
	busy              float64
}

// New returns an empty allocator.
func New(cfg Config) *Allocator {
	def := DefaultConfig()
	if cfg.CPUs <= 0 {
		cfg.CPUs = def.CPUs
	}
	if cfg.Cores <= 0 {
		cfg.Cores = def.Cores
	}
	if cfg.Mode == "" {
		cfg.Mode = def.Mode
	}
	if cfg.Idle <= 0 {
		cfg.Idle = def.Idle
	}
	if cfg.Drift <= 0 {
		cfg.Drift = def.Drift
	}
	if cfg.MaxWorkers <= 0 {
		cfg.MaxWorkers = def.MaxWorkers
	}
	if cfg.History <= 0 {
		cfg.History = def.History
	}
	if cfg.MaxRanks <= 0 {
		cfg.MaxRanks = def.MaxRanks
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Allocator{cfg: cfg, log: log, start: cfg.Now(), ranks: map[Key]*rank{}, jobs: map[string]*job{}, slow: 1}
}

// Report records a rank's figures and returns its advice, allocating
// anew on arrival or drift. A new rank beyond Config.MaxRanks is refused.
func (a *Allocator) Report(k Key, f Figures) (Advice, error) {
	now := a.lock()
	defer a.mu.Unlock()
	a.sampleCPULocked(now)
	if a.ranks[k] == nil && len(a.ranks) >= a.cfg.MaxRanks {
		return Advice{}, fmt.Errorf("%d ranks report already, at most %d; end a job first (end job=NAME)", len(a.ranks), a.cfg.MaxRanks)
	}
	j := a.jobs[k.Job]
	if j == nil {
		j = &job{changeEpoch: f.Epoch} // its arrival is its change for this epoch
		a.jobs[k.Job] = j
	}
	j.seen = now
	j.epoch = max(j.epoch, f.Epoch)
	r := a.ranks[k]
	if r == nil {
		m := fit(f)
		a.ranks[k] = &rank{figures: f, smooth: f, latest: m, used: m, seen: now}
		a.allocateLocked("arrival")
		return a.ranks[k].advice, nil
	}
	r.smooth = blend(r.smooth, f)
	m := fitCarrying(r.smooth, r.latest.Overhead)
	r.figures, r.latest, r.seen = f, m, now
	if j.epoch > j.changeEpoch && a.drifted(r.used, m) {
		j.changeEpoch = j.epoch
		a.allocateLocked("drift")
	}
	return r.advice, nil
}

// sampleCPULocked reads the node's CPU time, at most once a second.
func (a *Allocator) sampleCPULocked(now time.Time) {
	if a.cfg.NodeCPU == nil || (!a.cpuAt.IsZero() && now.Sub(a.cpuAt) < time.Second) {
		return
	}
	busy, total, err := a.cfg.NodeCPU()
	if err != nil {
		a.log.Debug("loader allocation: the node's CPU time", "err", err)
		return
	}
	if !a.cpuAt.IsZero() && total > a.cpuTotal {
		share := min(1, max(0, (busy-a.cpuBusy)/(total-a.cpuTotal)))
		if a.busy > 0 {
			share = (a.busy + share) / 2
		}
		a.busy = share
	}
	a.cpuAt, a.cpuBusy, a.cpuTotal = now, busy, total
}

// extraLocked is the node's CPU seconds per sample beyond the workers':
// its busy cores less the workers' CPU, over the samples/s the ranks
// measured; 0 before the node's CPU was read twice.
func (a *Allocator) extraLocked(fits []Fit) float64 {
	var rate, workerCPU float64
	for _, m := range fits {
		rate += m.Measured
		workerCPU += m.CPU * m.Measured
	}
	if a.busy <= 0 || rate <= 0 {
		return 0
	}
	return max(0, a.busy*float64(a.cfg.Cores)-workerCPU) / rate
}

// fitsLocked returns the ranks' latest fits, in keys' order, with the
// node's extra CPU per sample.
func (a *Allocator) fitsLocked(keys []Key) []Fit {
	fits := make([]Fit, len(keys))
	for i, k := range keys {
		fits[i] = a.ranks[k].latest
	}
	extra := a.extraLocked(fits)
	for i := range fits {
		fits[i].Extra = extra
	}
	return fits
}

// blend averages a rank's reports while it runs with the same workers,
// so one noisy report does not move its fit far: each new report weighs
// half. A report with other workers starts anew.
func blend(was, f Figures) Figures {
	if was.Workers != f.Workers || was.Batch != f.Batch {
		return f
	}
	mix := func(x, y float64) float64 { return (x + y) / 2 }
	out := f
	out.Step, out.Wait = mix(was.Step, f.Step), mix(was.Wait, f.Wait)
	out.Decode, out.CPU = mix(was.Decode, f.Decode), mix(was.CPU, f.CPU)
	switch {
	case was.Read > 0 && f.Read > 0:
		out.Read = mix(was.Read, f.Read)
	case f.Read == 0:
		out.Read = was.Read // dlfs saw none of this interval's reads
	}
	switch {
	case was.Start > 0 && f.Start > 0:
		out.Start = mix(was.Start, f.Start)
	case f.Start == 0:
		out.Start = was.Start // no epoch started in this interval
	}
	if f.Length == 0 {
		out.Length = was.Length
	}
	return out
}

// drifted reports whether fit m differs from was by more than cfg.Drift in
// what the allocation depends on.
func (a *Allocator) drifted(was, m Fit) bool {
	rel := func(x, y float64) bool {
		if math.IsInf(x, 1) || math.IsInf(y, 1) {
			return math.IsInf(x, 1) != math.IsInf(y, 1)
		}
		if x == y {
			return false
		}
		return math.Abs(x-y) > a.cfg.Drift*max(math.Abs(x), math.Abs(y))
	}
	return rel(was.Mu, m.Mu) || rel(was.IO+was.CPU, m.IO+m.CPU) || rel(was.CPU, m.CPU)
}

// End drops a job's ranks and reallocates; it reports whether the job had
// any.
func (a *Allocator) End(name string) bool {
	a.lock()
	defer a.mu.Unlock()
	if a.jobs[name] == nil {
		return false
	}
	a.dropLocked(name, "end")
	a.allocateLocked("end")
	return true
}

// Advice returns a rank's current advice.
func (a *Allocator) Advice(k Key) (Advice, bool) {
	a.lock()
	defer a.mu.Unlock()
	r := a.ranks[k]
	if r == nil {
		return Advice{}, false
	}
	return r.advice, true
}

// Jobs returns the names of the jobs with reporting ranks, sorted.
func (a *Allocator) Jobs() []string {
	a.lock()
	defer a.mu.Unlock()
	var out []string
	for name := range a.jobs {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// Ranks returns a job's reporting ranks, sorted.
func (a *Allocator) Ranks(name string) []int {
	a.lock()
	defer a.mu.Unlock()
	var out []int
	for k := range a.ranks {
		if k.Job == name {
			out = append(out, k.Rank)
		}
	}
	slices.Sort(out)
	return out
}

// lock takes mu and ends the jobs that went idle, so that no caller sees
// them; it returns the time it did so. The caller unlocks mu.
func (a *Allocator) lock() time.Time {
	now := a.cfg.Now()
	a.mu.Lock()
	a.expireLocked(now)
	return now
}

// expireLocked ends the jobs that went idle.
func (a *Allocator) expireLocked(now time.Time) {
	gone := false
	for name, j := range a.jobs {
		if now.Sub(j.seen) > a.cfg.Idle && !a.readingLocked(name, now) {
			a.dropLocked(name, "idle")
			gone = true
		}
	}
	if gone {
		a.allocateLocked("idle")
	}
}

// readingLocked reports whether dlfs served a read to any rank of job
// name within Idle: a job whose helper stopped reporting keeps its advice
// while it reads.
func (a *Allocator) readingLocked(name string, now time.Time) bool {
	if a.cfg.LastRead == nil {
		return false
	}
	for k := range a.ranks {
		if k.Job == name {
			if t := a.cfg.LastRead(k); !t.IsZero() && now.Sub(t) <= a.cfg.Idle {
				return true
			}
		}
	}
	return false
}

func (a *Allocator) dropLocked(name, reason string) {
	for k := range a.ranks {
		if k.Job == name {
			delete(a.ranks, k)
			a.noteLocked(Change{Job: k.Job, Rank: k.Rank, Workers: 0, Reason: reason})
		}
	}
	delete(a.jobs, name)
	a.log.Info("loader allocation: job left", "job", name, "reason", reason)
}

func (a *Allocator) noteLocked(c Change) {
	c.Seconds = a.cfg.Now().Sub(a.start).Seconds()
	if len(a.changes) >= a.cfg.History {
		a.changes = slices.Delete(a.changes, 0, len(a.changes)-a.cfg.History+1)
	}
	a.changes = append(a.changes, c)
}

// sortedLocked returns the ranks in a stable order.
func (a *Allocator) sortedLocked() []Key {
	keys := make([]Key, 0, len(a.ranks))
	for k := range a.ranks {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(x, y Key) int {
		if c := strings.Compare(x.Job, y.Job); c != 0 {
			return c
		}
		return x.Rank - y.Rank
	})
	return keys
}

// minGain is how much more a new allocation must be predicted to deliver
// in all than the current one, under the same new fits, to replace it
// on a drift: less is within the figures' noise, and a change costs each
// DataLoader a restart of its workers.
const minGain = 0.05

// keepLocked reports whether the current advice, which every rank has,
// stays on a drift because d would not deliver minGain more, nor lift a
// rank to its floor (see need); then it only updates the fits and
// predictions the advice rests on.
func (a *Allocator) keepLocked(keys []Key, fits []Fit, d []int) bool {
	cur := make([]int, len(keys))
	for i, k := range keys {
		adv := a.ranks[k].advice
		if adv.Generation == 0 {
			return false // a rank without advice yet
		}
		cur[i] = adv.Workers
	}
	c := float64(a.cfg.Cores)
	t, u := predict(fits, cur, c), predict(fits, d, c)
	if sum(u) >= (1+minGain)*sum(t) {
		return false
	}
	floor := predict(fits, even(len(keys), a.cfg.CPUs, a.cfg.MaxWorkers), c)
	for i := range floor {
		if t[i] < 0.9*floor[i] && u[i] >= 0.9*floor[i] {
			return false // d lifts a rank the current advice leaves below its floor
		}
	}
	for i, k := range keys {
		r := a.ranks[k]
		r.used, r.advice.Predicted = fits[i], finite(t[i])
	}
	a.slow = slowdown(fits, cur, c)
	return true
}

// allocateLocked makes a new allocation from every rank's latest fit.
func (a *Allocator) allocateLocked(reason string) {
	keys := a.sortedLocked()
	if len(keys) == 0 {
		return
	}
	fits := a.fitsLocked(keys)
	var d []int
	if a.cfg.Mode == Even {
		d = even(len(keys), a.cfg.CPUs, a.cfg.MaxWorkers)
	} else {
		d = need(fits, a.cfg.CPUs, float64(a.cfg.Cores), a.cfg.MaxWorkers)
	}
	c := float64(a.cfg.Cores)
	if reason == "drift" && a.keepLocked(keys, fits, d) {
		return
	}
	a.slow = slowdown(fits, d, c)
	t := predict(fits, d, c)
	a.gen++
	var summary []string
	for i, k := range keys {
		r := a.ranks[k]
		old := r.advice.Workers
		pf := prefetchFactor(d[i])
		if a.cfg.Mode == Even {
			pf = 2
		}
		r.used = fits[i]
		r.advice = Advice{Workers: d[i], PrefetchFactor: pf, Predicted: finite(t[i]), Mode: a.cfg.Mode, Generation: a.gen, Reason: reason}
		if old != d[i] {
			a.noteLocked(Change{Job: k.Job, Rank: k.Rank, Workers: d[i], Reason: reason})
		}
		summary = append(summary, fmt.Sprintf("%s=%d", k, d[i]))
	}
	a.log.Info("loader allocation", "reason", reason, "mode", a.cfg.Mode, "cpus", a.cfg.CPUs, "workers", strings.Join(summary, " "))
}
