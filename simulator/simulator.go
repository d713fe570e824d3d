// Package simulator runs dlfs's own placement and balance code over a
// cluster that does not exist: nodes × ranks per node drawing torch's
// DistributedSampler permutations of a dataset of a given size, with no
// FUSE, no network and no bytes. It answers, at up to 1,024 nodes, what
// the seeds' models ask:
//
//   - the imbalance of each global batch (Yang & Cong, Fig. 6): the sum of
//     the ranks' deficits once every sample went to a rank of the node that
//     caches it, over the batch's size;
//   - the share of reads that cross the network with the stock order (eq. 7:
//     (p−1)/p) against a locality plan (eq. 8: β);
//   - the PFS reads per epoch when the caches hold a fraction α < 1 of the
//     dataset, with and without SOLAR's epoch order;
//   - the epoch time of eqs. 1–8 for given PFS, peer and training rates.
//
// Placement is placement.New over members of equal capacity (hash
// placement); with α < 1 a fixed α of the samples, chosen by hash, is
// cached at all. Plans are balance=locality's, made by the daemon's own
// jobs.BalancedPlan.
package simulator

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/dlfs/dlfs/balance"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/jobs"
	"github.com/dlfs/dlfs/placement"
)

// Config says what to simulate. Rates are in samples per second.
type Config struct {
	Nodes        []int   // cluster sizes p; default 4, 16, 64, 256, 1024
	RanksPerNode int     // default 1
	Batches      []int   // local (per-rank) batch sizes; default 32, 64, 128
	Samples      int     // dataset length; default 1,281,167 (ImageNet-1k)
	Epochs       int     // default 2
	Alpha        float64 // share of the dataset the caches hold, in (0, 1]; default 1
	SampleBytes  int64   // mean sample size, to turn counts into bytes; default 110 KiB
	Seed         uint64  // the sampler's seed
	PFSRate      float64 // R: the PFS's aggregate rate; default 20,000
	PeerRate     float64 // R_c = R_b: the interconnect's aggregate rate; default 400,000
	TrainRate    float64 // V: one node's training rate; default 1,200
	// Workers run configurations side by side; default GOMAXPROCS.
	Workers int
	Logger  *slog.Logger // progress; nil: discard
}

// Defaults of Config.
const (
	DefaultSamples     = 1281167
	DefaultSampleBytes = 110 << 10
	DefaultPFSRate     = 20000
	DefaultPeerRate    = 400000
	DefaultTrainRate   = 1200
)

// MaxNodes bounds a cluster size, MaxSamples the dataset.
const (
	MaxNodes   = 1 << 14
	MaxSamples = 1 << 27
)

func (c Config) withDefaults() Config {
	if len(c.Nodes) == 0 {
		c.Nodes = []int{4, 16, 64, 256, 1024}
	}
	if c.RanksPerNode == 0 {
		c.RanksPerNode = 1
	}
	if len(c.Batches) == 0 {
		c.Batches = []int{32, 64, 128}
	}
	if c.Samples == 0 {
		c.Samples = DefaultSamples
	}
	if c.Epochs == 0 {
		c.Epochs = 2
	}
	if c.Alpha == 0 {
		c.Alpha = 1
	}
	if c.SampleBytes == 0 {
		c.SampleBytes = DefaultSampleBytes
	}
	if c.PFSRate == 0 {
		c.PFSRate = DefaultPFSRate
	}
	if c.PeerRate == 0 {
		c.PeerRate = DefaultPeerRate
	}
	if c.TrainRate == 0 {
		c.TrainRate = DefaultTrainRate
	}
	if c.Workers == 0 {
		c.Workers = runtime.GOMAXPROCS(0)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first setting out of range.
func (c Config) Validate() error {
	c = c.withDefaults()
	for _, p := range c.Nodes {
		if p < 1 || p > MaxNodes {
			return fmt.Errorf("simulator: %d nodes: want 1 to %d", p, MaxNodes)
		}
	}
	for _, b := range c.Batches {
		if b < 1 || b > 1<<16 {
			return fmt.Errorf("simulator: local batch %d: want 1 to 65536", b)
		}
	}
	switch {
	case c.RanksPerNode < 1 || c.RanksPerNode > 64:
		return fmt.Errorf("simulator: %d ranks per node: want 1 to 64", c.RanksPerNode)
	case c.Samples < 1 || c.Samples > MaxSamples:
		return fmt.Errorf("simulator: %d samples: want 1 to %d", c.Samples, MaxSamples)
	case c.Epochs < 1 || c.Epochs > 64:
		return fmt.Errorf("simulator: %d epochs: want 1 to 64", c.Epochs)
	case !(c.Alpha > 0 && c.Alpha <= 1):
		return fmt.Errorf("simulator: cache ratio %g: want more than 0 and at most 1", c.Alpha)
	case c.SampleBytes < 1:
		return fmt.Errorf("simulator: sample size %d: want at least 1 byte", c.SampleBytes)
	case !(c.PFSRate > 0 && c.PeerRate > 0 && c.TrainRate > 0):
		return fmt.Errorf("simulator: rates must be positive (pfs %g, peer %g, train %g)", c.PFSRate, c.PeerRate, c.TrainRate)
	}
	return nil
}

// Quartiles summarise a distribution (in percent for imbalance).
type Quartiles struct {
	Median float64 `json:"median"`
	P25    float64 `json:"p25"`
	P75    float64 `json:"p75"`
	P90    float64 `json:"p90"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// Fractions are shares of all reads that cross the network.
type Fractions struct {
	Stock    float64 `json:"stock"`    // torch's DistributedSampler order
	Locality float64 `json:"locality"` // a balance=locality plan
}

// Run is one (p, local batch) configuration's outcome.
type Run struct {
	Nodes        int       `json:"nodes"`
	Ranks        int       `json:"ranks"`
	Batch        int       `json:"batch"`
	GlobalBatch  int       `json:"global_batch"`
	Steps        int       `json:"steps"` // global batches simulated
	ImbalancePct Quartiles `json:"imbalance_pct"`
	// Imbalances are every global batch's, in percent (for the plots).
	Imbalances []float64 `json:"-"`
	Network    Fractions `json:"network_fraction"`
	// NetworkBytes per epoch, stock and locality.
	NetworkBytes struct {
		Stock    int64 `json:"stock"`
		Locality int64 `json:"locality"`
	} `json:"network_bytes_per_epoch"`
	Moved     int64     `json:"moved"`     // samples Algorithm 1 moved, over all epochs
	Transfers int64     `json:"transfers"` // Algorithm 1's messages, over all epochs
	MaxTrans  int       `json:"max_transfers_per_batch"`
	Time      EpochTime `json:"epoch_seconds"`
	Seconds   float64   `json:"seconds"` // wall time of this configuration
}

// EpochTime is one epoch by the performance model (Yang & Cong eqs. 1–8):
// the training time, and the true cost (the larger of training and
// sample I/O) with no cache, distributed caching in the stock order, and
// the locality plan.
type EpochTime struct {
	Training    float64 `json:"training"`      // eq. 1: D / (p·V)
	NoCache     float64 `json:"no_cache"`      // eq. 6 with eq. 2: I/O D / R
	Distributed float64 `json:"distributed"`   // eq. 7's I/O, stock order
	Locality    float64 `json:"locality"`      // eq. 8's I/O, locality plan
	PlateauP    float64 `json:"plateau_nodes"` // eq. 5: p beyond which no-cache I/O dominates, R / V
}

// EpochPFS is the PFS reads of one epoch with caches holding α of the
// dataset: a fixed cached subset (eqs. 7 and 8), and caches holding what
// the last epoch read last, in the sampler's epoch order and in SOLAR's.
type EpochPFS struct {
	Epoch      int   `json:"epoch"`
	Static     int64 `json:"static"`
	Stock      int64 `json:"stock_order"`
	EpochOrder int64 `json:"epochorder"`
	Uses       int   `json:"uses_permutation"` // which epoch's permutation SOLAR's order gives this epoch
}

// Result is a whole simulation.
type Result struct {
	Config       Config     `json:"-"`
	Samples      int        `json:"samples"`
	Runs         []Run      `json:"configs"`
	ImbalancePct Quartiles  `json:"imbalance_pct"`    // every global batch of every configuration
	Network      Fractions  `json:"network_fraction"` // all configurations' reads together
	PFS          []EpochPFS `json:"pfs_samples,omitempty"`
	Seconds      float64    `json:"seconds"`
}

// Simulate runs every configuration of cfg.
func Simulate(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	start := time.Now()
	keys := make([]string, cfg.Samples)
	cached := make([]bool, cfg.Samples)
	for i := range keys {
		keys[i] = fmt.Sprintf("train/n%05d/%08d.JPEG", i%1000, i)
		cached[i] = cfg.Alpha >= 1 || unit(uint64(i)^cfg.Seed) < cfg.Alpha
	}
	res := &Result{Config: cfg, Samples: cfg.Samples}
	type config struct{ p, b int }
	var configs []config
	for _, p := range cfg.Nodes {
		for _, b := range cfg.Batches {
			configs = append(configs, config{p, b})
		}
	}
	res.Runs = make([]Run, len(configs))
	owners := map[int][]int32{}
	var ownersMu sync.Mutex
	ownersOf := func(p int) ([]int32, error) {
		ownersMu.Lock()
		defer ownersMu.Unlock()
		if o, ok := owners[p]; ok {
			return o, nil
		}
		o, err := place(p, keys, cached, cfg.Workers)
		owners[p] = o
		return o, err
	}
	var (
		wg       sync.WaitGroup
		next     = make(chan int)
		firstErr error
		errMu    sync.Mutex
	)
	for w := 0; w < cfg.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				o, err := ownersOf(configs[i].p)
				if err == nil {
					res.Runs[i], err = simulate(ctx, cfg, configs[i].p, configs[i].b, o)
				}
				if err != nil {
					errMu.Lock()
					firstErr = err
					errMu.Unlock()
					continue
				}
				r := res.Runs[i]
				cfg.Logger.Info("simulated", "nodes", r.Nodes, "batch", r.Batch, "imbalance_median_pct", r.ImbalancePct.Median,
					"network_stock", r.Network.Stock, "network_locality", r.Network.Locality, "seconds", r.Seconds)
			}
		}()
	}
feed:
	for i := range configs {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("simulator: %w", err)
	}
	if firstErr != nil {
		return nil, firstErr
	}
	var all []float64
	var reads, stock, local float64
	for _, r := range res.Runs {
		all = append(all, r.Imbalances...)
		n := float64(r.Steps * r.GlobalBatch) // about its reads
		reads += n
		stock += r.Network.Stock * n
		local += r.Network.Locality * n
	}
	res.ImbalancePct = quartiles(all)
	res.Network = Fractions{Stock: stock / reads, Locality: local / reads}
	if cfg.Alpha < 1 {
		res.PFS = pfsReads(cfg, cached)
	}
	res.Seconds = time.Since(start).Seconds()
	return res, nil
}

// place returns each sample's owner among p equal members, or −1 where
// the sample is not cached, computed by workers goroutines.
func place(p int, keys []string, cached []bool, workers int) ([]int32, error) {
	ms := make([]placement.Member, p)
	for i := range ms {
		ms[i] = placement.Member{Name: fmt.Sprintf("node-%05d", i), Capacity: 1 << 40}
	}
	t, err := placement.New(ms)
	if err != nil {
		return nil, fmt.Errorf("simulator: %w", err)
	}
	out := make([]int32, len(keys))
	var wg sync.WaitGroup
	chunk := (len(keys) + workers - 1) / workers
	for lo := 0; lo < len(keys); lo += chunk {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			for i := lo; i < hi; i++ {
				out[i] = -1
				if cached[i] {
					out[i] = int32(t.Owner(keys[i]))
				}
			}
		}(lo, min(lo+chunk, len(keys)))
	}
	wg.Wait()
	return out, nil
}

// simulate runs cfg.Epochs epochs of one configuration.
func simulate(ctx context.Context, cfg Config, p, b int, owner []int32) (Run, error) {
	start := time.Now()
	world := p * cfg.RanksPerNode
	r := Run{Nodes: p, Ranks: world, Batch: b, GlobalBatch: b * world}
	rankNode := make([]int, world)
	for i := range rankNode {
		rankNode[i] = i / cfg.RanksPerNode
	}
	own := func(s int) int { return int(owner[s]) }
	spec := control.DefaultJob() // DistributedSampler, shuffled, torch 2.6
	spec.World, spec.Seed, spec.Batch, spec.Balance = world, cfg.Seed, b, "locality"
	var reads, stock, local int64
	for e := 0; e < cfg.Epochs; e++ {
		_, err := jobs.BalancedPlan(spec, cfg.Samples, e, rankNode, own, func(batch balance.Batch, plan balance.Plan) error {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("simulator: %w", err)
			}
			gb := batch.Samples
			for i, s := range gb { // stock: position i of a global batch is rank i mod world's
				if o := own(s); o >= 0 && o != rankNode[i%world] {
					stock++
				}
			}
			r.Imbalances = append(r.Imbalances, 100*float64(plan.Moved)/float64(len(gb))) // balance.Imbalance, without a second pass
			r.Moved += int64(plan.Moved)
			r.Transfers += int64(len(plan.Transfers))
			r.MaxTrans = max(r.MaxTrans, len(plan.Transfers))
			for rk, ss := range plan.Ranks {
				for _, s := range ss {
					if o := own(s); o >= 0 && o != rankNode[rk] {
						local++
					}
				}
			}
			reads += int64(len(gb))
			r.Steps++
			return nil
		})
		if err != nil {
			return r, err
		}
	}
	r.ImbalancePct = quartiles(slices.Clone(r.Imbalances))
	r.Network = Fractions{Stock: float64(stock) / float64(reads), Locality: float64(local) / float64(reads)}
	r.NetworkBytes.Stock = stock * cfg.SampleBytes / int64(cfg.Epochs)
	r.NetworkBytes.Locality = local * cfg.SampleBytes / int64(cfg.Epochs)
	r.Time = model(cfg, p, r.Network)
	r.Seconds = time.Since(start).Seconds()
	return r, nil
}

// model is Yang & Cong's eqs. 1–8 for p nodes, with the measured network
// fractions in place of (p−1)/p and β.
func model(cfg Config, p int, f Fractions) EpochTime {
	D, a := float64(cfg.Samples), cfg.Alpha
	training := D / (float64(p) * cfg.TrainRate) // (1)
	pfs := (1 - a) * D / cfg.PFSRate             // the storage term of (7) and (8)
	return EpochTime{
		Training:    training,
		NoCache:     math.Max(training, D/cfg.PFSRate),                   // (6) with (2)
		Distributed: math.Max(training, pfs+a*D/cfg.PeerRate*f.Stock),    // (7)
		Locality:    math.Max(training, pfs+a*D/cfg.PeerRate*f.Locality), // (8)
		PlateauP:    cfg.PFSRate / cfg.TrainRate,                         // (5)
	}
}

// pfsReads is the PFS reads of each epoch when the caches hold α of the
// dataset: a fixed subset (static), or what the previous epoch read last
// (balance.Reuse's model) in the sampler's order and in balance.EpochOrder's.
func pfsReads(cfg Config, cached []bool) []EpochPFS {
	spec := control.DefaultJob() // one rank's DistributedSampler, shuffled, torch 2.6
	spec.Seed = cfg.Seed
	d := jobs.Distributed(spec, cfg.Samples)
	perms := make([][]int, cfg.Epochs)
	for e := range perms {
		perms[e] = d.Global(e)
	}
	n := 0
	for _, c := range cached {
		if c {
			n++
		}
	}
	capacity := int(cfg.Alpha * float64(cfg.Samples))
	reuse := balance.Reuse(perms, capacity)
	order := balance.EpochOrder(perms, capacity)
	out := make([]EpochPFS, cfg.Epochs)
	for e := range out {
		out[e] = EpochPFS{Epoch: e, Static: int64(cfg.Samples - n), Stock: int64(cfg.Samples), EpochOrder: int64(cfg.Samples), Uses: order[e]}
		if e > 0 {
			out[e].Stock -= int64(reuse[e-1][e])
			out[e].EpochOrder -= int64(reuse[order[e-1]][order[e]])
		}
	}
	return out
}

// quartiles of xs (sorted in place).
func quartiles(xs []float64) Quartiles {
	if len(xs) == 0 {
		return Quartiles{}
	}
	sort.Float64s(xs)
	at := func(q float64) float64 { return xs[min(int(q*float64(len(xs))), len(xs)-1)] }
	return Quartiles{Median: at(0.5), P25: at(0.25), P75: at(0.75), P90: at(0.9), Min: xs[0], Max: xs[len(xs)-1]}
}

// unit hashes x to [0, 1) (splitmix64).
func unit(x uint64) float64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}
