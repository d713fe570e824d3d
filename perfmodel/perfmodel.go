// Package perfmodel estimates how long a read of n bytes takes from each
// source a node can read a block from: its SSD, each peer, the PFS.
//
// # Model
//
// A read from a source costs latency + n / bandwidth. Both are fitted
// online from every completed read (bytes, seconds) by least squares over
// exponentially weighted moments, so the estimate follows a source whose
// speed changes (a busy peer, a contended PFS) within a few dozen reads.
// When the reads seen so far are all about one size, the two cannot be
// told apart; the fit then keeps the split it had (at first, the prior's)
// and scales both to what was measured, which predicts reads of that size
// exactly.
//
// A source never read has its prior (Config.Priors). A source whose read
// failed (an error, a timeout) is estimated as unreachable for
// Config.Backoff, doubled for each failure in a row up to 32 times; then
// it is tried again. Failures while a source is skipped (the other reads
// that were in flight to it) do not lengthen the wait.
//
// A Model is safe for concurrent use.
package perfmodel

import (
	"math"
	"sort"
	"sync"
	"time"
)

// Prior is what a source is assumed to cost before it is measured.
type Prior struct {
	Latency   time.Duration
	Bandwidth float64 // bytes per second
}

// Config configures a Model.
type Config struct {
	// Weight is the share of the moments a new read replaces; default
	// 0.05 (the last ~20 reads dominate).
	Weight float64
	// Priors by source kind: the part of a source name before any ':'
	// ("peer:node-2" has kind "peer").
	Priors map[string]Prior
	// Backoff is how long a source whose read failed is skipped; default
	// 1 s, doubled per failure in a row up to 32 s.
	Backoff time.Duration
	// Now is the clock backoffs and Since are read from.
	Now func() time.Time // default time.Now
}

// DefaultConfig returns the defaults: priors that order an unmeasured
// source as usual (RAM, SSD, peer, PFS) until reads say otherwise.
func DefaultConfig() Config {
	return Config{
		Weight:  0.05,
		Backoff: time.Second,
		Now:     time.Now,
		Priors: map[string]Prior{
			"ram":  {Latency: time.Microsecond, Bandwidth: 10e9},
			"ssd":  {Latency: 100 * time.Microsecond, Bandwidth: 1e9},
			"peer": {Latency: 500 * time.Microsecond, Bandwidth: 1e9},
			"pfs":  {Latency: 5 * time.Millisecond, Bandwidth: 200e6},
		},
	}
}

// Model holds one estimate per source.
type Model struct {
	cfg Config
	mu  sync.Mutex
	src map[string]*fit // mu guards src and every fit
}

// fit holds the weighted moments of one source's reads.
type fit struct {
	n                   int64 // reads observed
	failures, inARow    int64
	skipUntil           time.Time // after a failure
	x, y, xx, xy        float64   // weighted means of bytes, seconds, bytes², bytes·seconds
	latency, secPerByte float64   // the current estimate
	last                time.Time
}

// New returns a model.
func New(cfg Config) *Model {
	d := DefaultConfig()
	if cfg.Weight <= 0 || cfg.Weight > 1 {
		cfg.Weight = d.Weight
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = d.Backoff
	}
	if cfg.Priors == nil {
		cfg.Priors = d.Priors
	}
	if cfg.Now == nil {
		cfg.Now = d.Now
	}
	return &Model{cfg: cfg, src: map[string]*fit{}}
}

func (m *Model) prior(source string) Prior {
	kind := source
	for i := 0; i < len(source); i++ {
		if source[i] == ':' {
			kind = source[:i]
			break
		}
	}
	if p, ok := m.cfg.Priors[kind]; ok {
		return p
	}
	return Prior{Latency: 10 * time.Millisecond, Bandwidth: 100e6}
}

// get returns the fit of source, starting it at its prior. mu is held.
func (m *Model) get(source string) *fit {
	f := m.src[source]
	if f == nil {
		p := m.prior(source)
		f = &fit{latency: p.Latency.Seconds(), secPerByte: 1 / p.Bandwidth}
		m.src[source] = f
	}
	return f
}

// Observe records a completed read of n bytes from source that took d.
func (m *Model) Observe(source string, n int64, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.get(source)
	f.inARow = 0
	m.observe(f, float64(max(n, 0)), max(d.Seconds(), 0))
}

// Fail records a read from source that failed or timed out.
func (m *Model) Fail(source string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.get(source)
	f.failures++
	now := m.cfg.Now()
	if now.Before(f.skipUntil) {
		return // one outage fails every read in flight: count it once
	}
	f.skipUntil = now.Add(m.cfg.Backoff << min(f.inARow, 5))
	f.inARow++
}

// Unreachable is the estimate of a source skipped after a failure.
const Unreachable = time.Duration(math.MaxInt64)

func (m *Model) observe(f *fit, x, y float64) {
	w := m.cfg.Weight
	if f.n == 0 {
		w = 1
	}
	f.n++
	f.last = m.cfg.Now()
	f.x += w * (x - f.x)
	f.y += w * (y - f.y)
	f.xx += w * (x*x - f.xx)
	f.xy += w * (x*y - f.xy)
	if v := f.xx - f.x*f.x; v > 1e-3*f.x*f.x+1 { // sizes vary: fit both
		f.secPerByte = math.Max((f.xy-f.x*f.y)/v, 0)
		f.latency = math.Max(f.y-f.secPerByte*f.x, 0)
		return
	}
	// All about one size: keep the split between latency and transfer
	// and scale both to what was measured.
	if pred := f.latency + f.secPerByte*f.x; pred > 0 {
		scale := f.y / pred
		f.latency, f.secPerByte = f.latency*scale, f.secPerByte*scale
	}
}

// Estimate returns the expected time to read n bytes from source.
func (m *Model) Estimate(source string, n int64) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.get(source)
	if m.cfg.Now().Before(f.skipUntil) {
		return Unreachable
	}
	return time.Duration((f.latency + f.secPerByte*float64(max(n, 0))) * 1e9)
}

// Order sorts sources by their estimate for n bytes, fastest first (ties
// keep the given order).
func (m *Model) Order(sources []string, n int64) {
	est := make(map[string]time.Duration, len(sources))
	for _, s := range sources {
		est[s] = m.Estimate(s, n)
	}
	sort.SliceStable(sources, func(i, j int) bool { return est[sources[i]] < est[sources[j]] })
}

// Since returns how long ago source was last observed (a very long time
// if never).
func (m *Model) Since(source string) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.src[source]; f != nil && f.n > 0 {
		return m.cfg.Now().Sub(f.last)
	}
	return math.MaxInt64
}

// Source is one source's estimate as reported in stats.
type Source struct {
	LatencyMs     float64 `json:"latency_ms"`
	BandwidthMBps float64 `json:"bandwidth_mbps"` // 0: no cost per byte is measurable
	Reads         int64   `json:"reads"`
	Failures      int64   `json:"failures"`
	Skipped       bool    `json:"skipped"` // after a failure, for now
}

// Stats returns the estimates of every source seen.
func (m *Model) Stats() map[string]Source {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]Source, len(m.src))
	for name, f := range m.src {
		s := Source{LatencyMs: f.latency * 1e3, Reads: f.n, Failures: f.failures, Skipped: m.cfg.Now().Before(f.skipUntil)}
		if f.secPerByte > 0 {
			s.BandwidthMBps = 1 / f.secPerByte / 1e6
		}
		out[name] = s
	}
	return out
}

// Fit returns source's fitted latency and seconds per byte.
func (m *Model) Fit(source string) (latency time.Duration, perByte float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.get(source)
	return time.Duration(f.latency * 1e9), f.secPerByte
}
