package daemon

import (
	_ "embed"
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// The status page: GET / on --metrics-addr serves status/index.html, a
// page with no external assets that polls stats.json (the document of
// .dlfs/stats) and history.json (the rates of the last minutes, sampled
// here) every two seconds and draws them.

//go:embed status/index.html
var statusPage []byte

// historyEvery is how often the rates are sampled, and historyLen how
// many samples are kept: ten minutes.
const (
	historyEvery = 5 * time.Second
	historyLen   = 120
)

// RatePoint is one sample of the node's rates, over the interval before
// T (Unix seconds).
type RatePoint struct {
	T          float64            `json:"t"`
	Reads      map[string]float64 `json:"reads_per_second"` // by tier
	Served     float64            `json:"served_bytes_per_second"`
	PFS        float64            `json:"pfs_bytes_per_second"`
	Prefetched float64            `json:"prefetched_bytes_per_second"`
}

// rateHistory keeps the last historyLen samples. Safe for concurrent use.
type rateHistory struct {
	mu     sync.Mutex
	points []RatePoint // oldest first (mu)
	last   counters    // the counters at the last sample (mu)
	lastAt time.Time   // (mu)
}

// counters are the cumulative figures the rates are taken from.
type counters struct {
	reads              map[string]int64
	served, pfs, fetch int64
}

func (n *Node) counters() counters {
	ls := n.tiers.load.Stats()
	c := counters{reads: map[string]int64{}, pfs: n.src.Stats().Bytes}
	for t, s := range ls.Served {
		c.reads[t] = s.Reads
		c.served += s.Bytes
	}
	pf, _ := n.pf.Stats()
	c.fetch = pf.FetchedBytes
	return c
}

// sample adds the rates since the last sample.
func (h *rateHistory) sample(now time.Time, c counters) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.lastAt.IsZero() {
		dt := now.Sub(h.lastAt).Seconds()
		p := RatePoint{T: float64(now.UnixNano()) / 1e9, Reads: map[string]float64{},
			Served: float64(c.served-h.last.served) / dt, PFS: float64(c.pfs-h.last.pfs) / dt, Prefetched: float64(c.fetch-h.last.fetch) / dt}
		for t, r := range c.reads {
			p.Reads[t] = float64(r-h.last.reads[t]) / dt
		}
		if len(h.points) == historyLen {
			h.points = append(h.points[:0], h.points[1:]...)
		}
		h.points = append(h.points, p)
	}
	h.last, h.lastAt = c, now
}

func (h *rateHistory) snapshot() []RatePoint {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]RatePoint(nil), h.points...)
}

// startHistory samples the rates every every until Close.
func (n *Node) startHistory(every time.Duration) {
	n.metrics.history.sample(time.Now(), n.counters())
	t := time.NewTicker(every)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case now := <-t.C:
				n.metrics.history.sample(now, n.counters())
			}
		}
	}()
	// Registered last, it stops first: before the parts it samples.
	n.onClose("history", func() error { close(quit); <-done; return nil })
}

// statusHandlers adds the status page and its data to mux.
func (n *Node) statusHandlers(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
		_, _ = w.Write(statusPage)
	})
	mux.HandleFunc("GET /stats.json", func(w http.ResponseWriter, r *http.Request) {
		b, err := n.statsJSON()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	})
	mux.HandleFunc("GET /history.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"every_seconds": historyEvery.Seconds(), "points": n.metrics.history.snapshot()})
	})
}
