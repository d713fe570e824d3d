// Package latency keeps the daemon's latency histograms: reads by the
// tier that served them, FUSE requests by operation, peer requests by
// member.
//
// # Cost
//
// A Histogram is a fixed array of bucket counters and a sum, updated with
// two atomic adds and no lock, so that observing every read costs the read
// path nothing it would notice (docs/benchmarks.md measures it on and
// off). A nil *Histogram and a nil *Vec observe nothing: a daemon with
// histograms off passes nil and pays one comparison.
//
// # Buckets
//
// Every histogram has the same bounds, from 1 µs (a FUSE request the
// daemon answers from memory) to 10 s (a PFS under load), three to a
// decade, so that histograms add
// and compare across sources and nodes.
//
// # Export
//
// A Vec is a prometheus.Collector: its histograms are gathered as
// constant histograms with their label, in seconds. Summary gives the
// same figures for .dlfs/stats: count, mean and quantiles interpolated
// within their bucket.
package latency

import (
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Bounds are the buckets' upper bounds in seconds; a last bucket holds
// what lies beyond.
var Bounds = [...]float64{
	1e-6, 2.5e-6, 5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
	1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
	100e-3, 250e-3, 500e-3, 1, 2.5, 5, 10,
}

// boundsNs are Bounds in nanoseconds.
var boundsNs = func() []int64 {
	out := make([]int64, len(Bounds))
	for i, b := range Bounds {
		out[i] = int64(math.Round(b * 1e9))
	}
	return out
}()

// Histogram counts durations. Safe for concurrent use; never blocks.
type Histogram struct {
	counts [len(Bounds) + 1]atomic.Uint64 // the last is beyond the bounds
	sumNs  atomic.Int64
}

// Observe counts d. A nil Histogram ignores it.
func (h *Histogram) Observe(d time.Duration) {
	if h == nil {
		return
	}
	ns := int64(d)
	i := sort.Search(len(boundsNs), func(i int) bool { return boundsNs[i] >= ns })
	h.counts[i].Add(1)
	h.sumNs.Add(ns)
}

// Since observes the time since t0.
func (h *Histogram) Since(t0 time.Time) {
	if h != nil {
		h.Observe(time.Since(t0))
	}
}

// snapshot returns the bucket counts (not cumulative), their total and the
// sum in seconds. Counts and sum are read one by one, so a snapshot taken
// while observations land may be off by those few.
func (h *Histogram) snapshot() (counts []uint64, total uint64, sum float64) {
	counts = make([]uint64, len(h.counts))
	for i := range h.counts {
		counts[i] = h.counts[i].Load()
		total += counts[i]
	}
	return counts, total, float64(h.sumNs.Load()) / 1e9
}

// Summary is a histogram as .dlfs/stats shows it, in seconds.
type Summary struct {
	Count uint64  `json:"count"`
	Sum   float64 `json:"sum_seconds"`
	Mean  float64 `json:"mean_seconds"`
	P50   float64 `json:"p50_seconds"`
	P90   float64 `json:"p90_seconds"`
	P99   float64 `json:"p99_seconds"`
}

// Summary returns h's count, mean and quantiles. Safe for concurrent use.
func (h *Histogram) Summary() Summary {
	counts, total, sum := h.snapshot()
	s := Summary{Count: total, Sum: sum}
	if total == 0 {
		return s
	}
	s.Mean = ns(sum / float64(total))
	s.P50, s.P90, s.P99 = ns(quantile(counts, total, 0.5)), ns(quantile(counts, total, 0.9)), ns(quantile(counts, total, 0.99))
	return s
}

// ns rounds seconds to the nanosecond, as they were measured.
func ns(s float64) float64 { return math.Round(s*1e9) / 1e9 }

// quantile interpolates the q-quantile linearly within its bucket, as
// Prometheus's histogram_quantile does; beyond the last bound it answers
// that bound.
func quantile(counts []uint64, total uint64, q float64) float64 {
	rank := q * float64(total)
	var seen float64
	for i, c := range counts {
		if c == 0 {
			continue
		}
		if seen+float64(c) >= rank {
			if i == len(Bounds) {
				return Bounds[len(Bounds)-1]
			}
			lo := 0.0
			if i > 0 {
				lo = Bounds[i-1]
			}
			return lo + (Bounds[i]-lo)*(rank-seen)/float64(c)
		}
		seen += float64(c)
	}
	return Bounds[len(Bounds)-1]
}

// Vec is a family of histograms by one label (a tier, an operation, a
// member), exported to Prometheus under one name. Safe for concurrent
// use; With never blocks on Collect.
type Vec struct {
	desc *prometheus.Desc
	max  int // labels kept at most; beyond, observations go to "other"

	mu sync.RWMutex
	by map[string]*Histogram // (mu)
}

// NewVec returns a histogram family called name (with its unit, as in
// dlfs_read_duration_seconds) with label label, keeping at most max label
// values (0: no bound); observations for further values count under
// "other", so that a label fed from outside (a member's name) cannot grow
// the daemon's memory.
func NewVec(name, help, label string, max int) *Vec {
	return &Vec{desc: prometheus.NewDesc(name, help, []string{label}, nil), max: max, by: map[string]*Histogram{}}
}

// With returns the histogram for value, making it on first use. A nil Vec
// returns nil, which observes nothing.
func (v *Vec) With(value string) *Histogram {
	if v == nil {
		return nil
	}
	v.mu.RLock()
	h := v.by[value]
	v.mu.RUnlock()
	if h != nil {
		return h
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if h = v.by[value]; h != nil {
		return h
	}
	if v.max > 0 && len(v.by) >= v.max {
		value = "other"
		if h = v.by[value]; h != nil {
			return h
		}
	}
	h = &Histogram{}
	v.by[value] = h
	return h
}

// Summaries returns every histogram's summary by label value, leaving out
// those with nothing observed. A nil Vec returns nil.
func (v *Vec) Summaries() map[string]Summary {
	if v == nil {
		return nil
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make(map[string]Summary, len(v.by))
	for k, h := range v.by {
		if s := h.Summary(); s.Count > 0 {
			out[k] = s
		}
	}
	return out
}

// Describe implements prometheus.Collector.
func (v *Vec) Describe(ch chan<- *prometheus.Desc) { ch <- v.desc }

// Collect implements prometheus.Collector.
func (v *Vec) Collect(ch chan<- prometheus.Metric) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	for k, h := range v.by {
		counts, total, sum := h.snapshot()
		buckets := make(map[float64]uint64, len(Bounds))
		var cum uint64
		for i, b := range Bounds {
			cum += counts[i]
			buckets[b] = cum
		}
		ch <- prometheus.MustNewConstHistogram(v.desc, total, sum, buckets, k)
	}
}
