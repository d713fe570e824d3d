package allocator

import (
	"math"
)

// Fit is the throughput model of one rank (a DataLoader), fitted from its
// last report and dlfs's own read times (A-Dloader's formulas 2-7):
//
//	T(d) = min(μ, λ(d))            samples/s with d workers
//	μ    = batch / step            what the training loop can consume
//	λ(d) = d / (k·(io + cpu·s))    what d workers deliver
//
// io is the part of a worker's time per sample in __getitem__ that is not
// CPU (waiting for reads), cpu its CPU seconds there, and s ≥ 1 the CPU
// contention: while the workers of all ranks ask for no more CPU than the
// node's cores, s = 1 and λ grows linearly with d; past that knee, s
// grows until they ask for exactly the cores there are (see slowdown).
// The CPU a sample asks of the node is the workers' cpu plus what the node
// spends on it elsewhere (Extra: dlfs, the PFS client, the main process
// unpickling it), measured from the node's busy time when NodeCPU is
// given; the knee is where all ranks together ask for all the cores.
// k ≥ 1 is what a worker spends beyond __getitem__ (collating, pickling,
// the queue to the main process), relative to it: it shows when the
// loader is the bottleneck (the training loop waits), for then the
// workers deliver just λ(d) = batch / (step + wait), so
// k = d·(step + wait) / (batch·decode); until it shows, k = 1.
// With no workers (d = 0) the main process loads between steps:
// T = batch / (step + batch·k·(io + cpu·s)).
//
// A DataLoader starts its workers anew every epoch, and the first batch
// waits for them: each worker's start (w seconds, from the reported time
// to the first batch) and then one worker filling a whole batch alone,
// batch·k·(io + cpu·s). With an epoch of n samples (reported), a rank
// delivers n / (w·d + batch·k·(io + cpu·s) + n/T(d)) over an epoch. That
// is the rate the model predicts and compares, and it makes a worker that
// adds little in steady state cost more than it brings.
type Fit struct {
	Batch int     `json:"batch"`
	Mu    float64 `json:"mu_samples_per_second"`
	IO    float64 `json:"io_seconds_per_sample"`
	CPU   float64 `json:"cpu_seconds_per_sample"`
	// Slowdown is the contention s under which the report was measured,
	// as the fit reads it: (decode − io) / cpu.
	Slowdown float64 `json:"measured_slowdown"`
	// Overhead is k; 0 until a report shows the loader as the
	// bottleneck.
	Overhead float64 `json:"overhead"`
	// Extra is the node's CPU seconds per sample beyond the workers',
	// the same for every rank (set at each allocation).
	Extra float64 `json:"extra_cpu_seconds_per_sample"`
	// Start is the seconds each worker adds to an epoch's start beyond
	// the first batch itself, and Length the samples of an epoch (0: not
	// reported; then the start is left out).
	Start  float64 `json:"start_seconds_per_worker"`
	Length int     `json:"epoch_length"`
	// Measured is the samples/s the report shows over an epoch:
	// batch / (step + wait) in steady state, with the epoch's start.
	Measured float64 `json:"measured_samples_per_second"`
	Workers  int     `json:"measured_workers"`
}

// loaderBound is the share of a batch's time the training loop must wait
// for the loader to count as its bottleneck.
const loaderBound = 0.05

// Figures are what one rank reports (package control's Report) plus what
// dlfs measured itself.
type Figures struct {
	Epoch    int
	Batch    int
	Workers  int
	Prefetch int
	Step     float64 // seconds the training loop held a batch
	Wait     float64 // seconds it waited for the next batch
	Decode   float64 // a worker's seconds per sample (read and decode)
	CPU      float64 // a worker's CPU seconds per sample
	Samples  int
	// Read is dlfs's mean seconds to serve one sample to this rank's
	// processes (0: dlfs saw none of its reads). As much of it as decode
	// − cpu leaves room for is taken as io.
	Read float64
	// Start is the seconds from an epoch's start to its first batch,
	// Length the samples of an epoch (0: not reported).
	Start  float64
	Length int
	// ReadBySource is dlfs's mean seconds per read request, by the tier
	// that served it (ram, ssd, peer, moved, pfs), for stats.
	ReadBySource map[string]float64
}

// fit turns figures into a model. Figures are validated by package
// control; fit still never divides by zero.
func fit(f Figures) Fit { return fitCarrying(f, 0) }

// fitCarrying is fit for a rank whose earlier reports measured overhead
// k (0: none did). A report where the loader is not the bottleneck cannot
// measure k, so the earlier k carries over, but only as far as this
// report allows: its workers kept up with the loop, so each took at most
// workers·(step + wait) / batch per sample, and k·decode is no more. (A
// k measured while the workers were starting, kept after they had, made
// the model see a rank with workers to spare as starved.)
func fitCarrying(f Figures, k float64) Fit {
	b := float64(max(f.Batch, 1))
	m := Fit{Batch: max(f.Batch, 1), Workers: f.Workers}
	if f.Step > 0 {
		m.Mu = b / f.Step
	} else {
		m.Mu = math.Inf(1)
	}
	m.Length = f.Length
	// A worker's wall time per sample is io plus its CPU time stretched
	// by contention s. What dlfs took to serve the read is io, as far as
	// the wall time leaves room for it beside the CPU time; with no read
	// seen, all of that room is io (s = 1).
	m.CPU = min(f.CPU, f.Decode)
	room := f.Decode - m.CPU
	m.IO = room
	if f.Read > 0 {
		m.IO = min(f.Read, room)
	}
	m.Slowdown = 1
	if m.CPU > 0 {
		m.Slowdown = (f.Decode - m.IO) / m.CPU
	}
	if f.Decode > 0 && f.Wait > loaderBound*(f.Step+f.Wait) {
		perSample := f.Wait / b // the main process loads: wait = batch·k·decode
		if f.Workers > 0 {
			perSample = float64(f.Workers) * (f.Step + f.Wait) / b
		}
		m.Overhead = max(1, perSample/f.Decode)
	} else if k > 0 {
		m.Overhead = k
		if f.Decode > 0 && f.Workers > 0 {
			m.Overhead = max(1, min(k, float64(f.Workers)*(f.Step+f.Wait)/(b*f.Decode)))
		}
	}
	// The reported start less the first batch, as one worker took it.
	first := b * max(1, m.Overhead) * f.Decode
	if f.Start > first {
		m.Start = (f.Start - first) / float64(max(f.Workers, 1))
	}
	if f.Step+f.Wait > 0 {
		m.Measured = m.overEpoch(b/(f.Step+f.Wait), first, f.Workers)
	}
	return m
}

// overEpoch returns the samples/s over an epoch of a rank that delivers
// steady samples/s once its d workers have started and the first batch,
// which took first seconds, has come.
func (m Fit) overEpoch(steady, first float64, d int) float64 {
	if m.Length <= 0 || steady <= 0 || math.IsInf(steady, 1) {
		return steady
	}
	n := float64(m.Length)
	return n / (m.Start*float64(max(d, 1)) + first + n/steady)
}

// rate returns the samples/s over an epoch for a rank of fit m with d
// workers under slowdown s.
func (m Fit) rate(d int, s float64) float64 {
	return m.overEpoch(m.steady(d, s), float64(m.Batch)*m.perSample(s), d)
}

// perSample is a worker's seconds per sample under slowdown s.
func (m Fit) perSample(s float64) float64 {
	return max(1, m.Overhead) * (m.IO + m.CPU*s)
}

// steady returns T(d) under slowdown s, once the workers have started.
func (m Fit) steady(d int, s float64) float64 {
	per := m.perSample(s)
	if d == 0 {
		step := 0.0
		if !math.IsInf(m.Mu, 1) && m.Mu > 0 {
			step = float64(m.Batch) / m.Mu
		}
		if step+float64(m.Batch)*per <= 0 {
			return m.Mu
		}
		return float64(m.Batch) / (step + float64(m.Batch)*per)
	}
	if per <= 0 {
		return m.Mu
	}
	return min(m.Mu, float64(d)/per)
}

// slowdown returns the contention s ≥ 1 at which the ranks, with workers
// d[i], ask for no more than cpus CPUs: s = 1 when they fit, otherwise the
// s at which the CPU they use, Σ cpu_i·T_i(d_i, s), equals cpus (found by
// bisection: the CPU asked for falls as s grows).
func slowdown(fits []Fit, d []int, cpus float64) float64 {
	demand := func(s float64) float64 {
		var sum float64
		for i, m := range fits {
			sum += (m.CPU + m.Extra) * m.rate(d[i], s)
		}
		return sum
	}
	if cpus <= 0 || demand(1) <= cpus {
		return 1
	}
	lo, hi := 1.0, 2.0
	for demand(hi) > cpus && hi < 1e9 {
		lo, hi = hi, hi*2
	}
	for range 60 {
		mid := (lo + hi) / 2
		if demand(mid) > cpus {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}

// predict returns each rank's samples/s with workers d on cpus CPUs.
func predict(fits []Fit, d []int, cpus float64) []float64 {
	s := slowdown(fits, d, cpus)
	out := make([]float64, len(fits))
	for i, m := range fits {
		out[i] = m.rate(d[i], s)
	}
	return out
}

func sum(xs []float64) float64 {
	var t float64
	for _, x := range xs {
		t += x
	}
	return t
}
