package allocator

import (
	"maps"
	"math"
)

// Stats is the allocator's part of .dlfs/stats.
type Stats struct {
	Mode  Mode `json:"mode"`
	CPUs  int  `json:"loader_cpus"`
	Cores int  `json:"cores"`
	// Workers are advised in total; Predicted and Measured are the
	// ranks' samples/s summed.
	Workers   int     `json:"workers"`
	Predicted float64 `json:"predicted_samples_per_second"`
	Measured  float64 `json:"measured_samples_per_second"`
	// Slowdown is the CPU contention the model predicts for the advice.
	Slowdown float64 `json:"predicted_slowdown"`
	// Busy is the share of the node's CPU in use (0: not measured).
	Busy        float64     `json:"node_cpu_busy"`
	Allocations int64       `json:"allocations"`
	Ranks       []RankStats `json:"ranks"`
	// Changes is the timeline of worker counts, oldest first; their
	// seconds count from Started (Unix seconds).
	Changes []Change `json:"changes"`
	Started float64  `json:"started_unix_seconds"`
}

// RankStats is one rank: what it reported, its fit, its advice, and how
// well the model explains what it measured.
type RankStats struct {
	Job     string        `json:"job"`
	Rank    int           `json:"rank"`
	Figures FiguresStats  `json:"figures"`
	Fit     Fit           `json:"fit"`
	Advice  Advice        `json:"advice"`
	Model   ModelAccuracy `json:"model"`
	// IdleSeconds is the time since its last report.
	IdleSeconds float64 `json:"idle_seconds"`
}

// FiguresStats are the figures of the last report, as JSON.
type FiguresStats struct {
	Epoch    int     `json:"epoch"`
	Batch    int     `json:"batch"`
	Workers  int     `json:"workers"`
	Prefetch int     `json:"prefetch_factor"`
	Step     float64 `json:"step_seconds"`
	Wait     float64 `json:"wait_seconds"`
	Decode   float64 `json:"decode_seconds_per_sample"`
	CPU      float64 `json:"cpu_seconds_per_sample"`
	Read     float64 `json:"read_seconds_per_sample"`
	Start    float64 `json:"start_seconds"`
	Length   int     `json:"epoch_length"`
	// ReadBySource is dlfs's seconds per read request, by tier.
	ReadBySource map[string]float64 `json:"read_seconds_by_source,omitempty"`
	Samples      int                `json:"samples"`
}

// ModelAccuracy compares the model's samples/s for the workers every rank
// ran with (not the advice) against what the rank measured.
type ModelAccuracy struct {
	Predicted float64 `json:"predicted_samples_per_second"`
	Measured  float64 `json:"measured_samples_per_second"`
	// Error is |predicted − measured| / measured (0 when nothing was
	// measured).
	Error float64 `json:"error"`
}

// Stats returns the current figures.
func (a *Allocator) Stats() Stats {
	now := a.lock()
	defer a.mu.Unlock()
	st := Stats{Mode: a.cfg.Mode, CPUs: a.cfg.CPUs, Cores: a.cfg.Cores, Slowdown: a.slow, Busy: a.busy, Allocations: a.gen, Ranks: []RankStats{}, Changes: append([]Change{}, a.changes...),
		Started: float64(a.start.UnixNano()) / 1e9}
	keys := a.sortedLocked()
	fits := a.fitsLocked(keys)
	ran := make([]int, len(keys))
	for i, k := range keys {
		ran[i] = a.ranks[k].figures.Workers
	}
	now2 := predict(fits, ran, float64(a.cfg.Cores))
	for i, k := range keys {
		r := a.ranks[k]
		f := r.figures
		acc := ModelAccuracy{Predicted: finite(now2[i]), Measured: r.latest.Measured}
		if acc.Measured > 0 {
			acc.Error = math.Abs(acc.Predicted-acc.Measured) / acc.Measured
		}
		fit := fits[i]
		fit.Mu = finite(fit.Mu)
		st.Ranks = append(st.Ranks, RankStats{
			Job: k.Job, Rank: k.Rank, Fit: fit, Advice: r.advice, Model: acc,
			Figures: FiguresStats{Epoch: f.Epoch, Batch: f.Batch, Workers: f.Workers, Prefetch: f.Prefetch, Step: f.Step,
				Wait: f.Wait, Decode: f.Decode, CPU: f.CPU, Read: f.Read, Start: f.Start, Length: f.Length, ReadBySource: maps.Clone(f.ReadBySource), Samples: f.Samples},
			IdleSeconds: now.Sub(r.seen).Seconds(),
		})
		st.Workers += r.advice.Workers
		st.Predicted += finite(r.advice.Predicted)
		st.Measured += r.latest.Measured
	}
	return st
}

// finite maps +Inf (a model step of zero seconds) to 0 for JSON, which
// cannot carry it.
func finite(x float64) float64 {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return 0
	}
	return x
}
