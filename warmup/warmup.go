// Package warmup fetches chosen parts of the dataset into the caches before
// training reads them (dlfs warmup, dlfs mount --warmup).
//
// A warm-up takes the files under some paths in the order cheapest for the
// PFS: packed samples by container and offset, in runs of neighbours read
// in one request (package runs plans them); plain files by path. It warms as many bytes as the caches
// hold, and no more, and says how many fit. Half as many workers
// (Config.Workers) as the prefetcher has fetch, so that a training job
// reading beside it is not starved. Where
// each block lands is the loader's business: in a cluster, a sample
// another node owns is fetched through that node, which keeps it.
//
// One warm-up runs at a time; starting another stops the first. Stopping
// returns at once: the fetches in flight are cancelled (Source.Warm ends
// when its context does), and the caches stay consistent: a block is
// cached whole or not at all. Sizes are summed without overflow: sparse
// files may claim up to 2^63 bytes each.
package warmup

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/loader/runs"
)

// Source is what a warm-up fetches through.
type Source interface {
	// Locate says where a packed sample lies; ok is false for a plain
	// file.
	Locate(e *catalog.Entry) (runs.Span, bool)
	// RunLimits are the longest gap to read through and the longest run
	// of one request, for packed neighbours.
	RunLimits() (gap, run int64)
	// Warm fetches first, and the neighbours in its container in the same
	// request, into the caches.
	// Warm stops early, with ctx's error, when ctx is done.
	Warm(ctx context.Context, first *catalog.Entry, neighbours []*catalog.Entry) error
}

// Config configures a Warmer.
type Config struct {
	Workers int          // fetches at once; default 64 (the prefetcher has 128)
	Logger  *slog.Logger // nil: discard
}

// Status describes the latest warm-up, as shown under warmup in
// .dlfs/stats.
type Status struct {
	State       string   `json:"state"` // "" (none yet), "running", "done" or "stopped"
	Paths       []string `json:"paths,omitempty"`
	Files       int      `json:"files"`         // selected
	Bytes       int64    `json:"bytes"`         // selected
	FitBytes    int64    `json:"fit_bytes"`     // of them, what the caches hold
	FitFiles    int      `json:"fit_files"`     // the files warmed
	DoneFiles   int64    `json:"done_files"`    // warmed so far
	DoneBytes   int64    `json:"done_bytes"`    // warmed so far
	Errors      int64    `json:"errors"`        // files that failed
	Seconds     float64  `json:"seconds"`       // since it started, or its length once over
	BytesPerSec float64  `json:"bytes_per_sec"` // DoneBytes / Seconds
}

// Warmer runs warm-ups. Safe for concurrent use.
type Warmer struct {
	cfg Config
	src Source
	log *slog.Logger

	runs sync.WaitGroup // every warm-up's goroutines, stopped ones included

	mu     sync.Mutex
	status Status    // (mu) the latest warm-up's
	cur    *progress // (mu) the latest warm-up's; nil before the first
}

// progress is one warm-up's: a stopped one's fetches may still end after
// the next has started, and count for their own.
type progress struct {
	start              time.Time
	cancel             context.CancelFunc
	done               chan struct{} // closed when its goroutines end
	files, bytes, errs atomic.Int64
}

// New returns an idle Warmer.
func New(cfg Config, src Source) *Warmer {
	if cfg.Workers <= 0 {
		cfg.Workers = 64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Warmer{cfg: cfg, src: src, log: cfg.Logger}
}

// Start stops any warm-up under way and warms entries (regular files),
// the first ones up to capacity bytes in PFS order; paths are what the
// user named, for the status.
func (w *Warmer) Start(paths []string, entries []*catalog.Entry, capacity int64) Status {
	w.Stop()
	units, st := plan(w.src, entries, capacity)
	st.State, st.Paths = "running", paths
	ctx, cancel := context.WithCancel(context.Background())
	p := &progress{start: time.Now(), cancel: cancel, done: make(chan struct{})}
	w.mu.Lock()
	w.status, w.cur = st, p
	w.mu.Unlock()
	w.log.Info("warm-up started", "paths", paths, "files", st.Files, "bytes", st.Bytes, "fit_bytes", st.FitBytes)
	w.runs.Add(1)
	go w.run(ctx, units, p)
	return w.Status()
}

// run fetches units with the workers, then marks the warm-up over.
func (w *Warmer) run(ctx context.Context, units [][]*catalog.Entry, p *progress) {
	defer w.runs.Done()
	defer close(p.done)
	next := make(chan []*catalog.Entry)
	var wg sync.WaitGroup
	for i := 0; i < w.cfg.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for u := range next {
				if err := w.src.Warm(ctx, u[0], u[1:]); err != nil {
					p.errs.Add(1)
					w.log.Debug("warm-up: fetch failed", "path", u[0].Path(), "err", err)
					continue
				}
				var b int64
				for _, e := range u {
					b = catalog.AddSize(b, e.Size)
				}
				p.files.Add(int64(len(u)))
				p.bytes.Add(b)
			}
		}()
	}
feed:
	for _, u := range units {
		select {
		case next <- u:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur != p {
		return // a later warm-up's status is showing
	}
	if w.status.State == "running" {
		w.status.State = "done"
		if ctx.Err() != nil {
			w.status.State = "stopped"
		}
	}
	w.status.Seconds = time.Since(p.start).Seconds()
	w.log.Info("warm-up over", "state", w.status.State, "files", p.files.Load(), "bytes", p.bytes.Load(),
		"errors", p.errs.Load(), "seconds", w.status.Seconds)
}

// Stop stops the warm-up under way, if any, and returns at once; its
// fetches in flight end on their own, cancelled.
func (w *Warmer) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur == nil {
		return
	}
	w.cur.cancel()
	if w.status.State == "running" {
		w.status.State = "stopped"
		w.status.Seconds = time.Since(w.cur.start).Seconds()
	}
}

// Close stops the warm-up under way and waits for every warm-up's
// fetches to end.
func (w *Warmer) Close() {
	w.Stop()
	w.runs.Wait()
}

// Status returns the latest warm-up's figures.
func (w *Warmer) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.status
	if p := w.cur; p != nil {
		st.DoneFiles, st.DoneBytes, st.Errors = p.files.Load(), p.bytes.Load(), p.errs.Load()
		if st.State == "running" {
			st.Seconds = time.Since(p.start).Seconds()
		}
	}
	if st.Seconds > 0 {
		st.BytesPerSec = float64(st.DoneBytes) / st.Seconds
	}
	return st
}

// plan orders entries for the PFS, keeps what fits in capacity, and
// groups packed neighbours into runs: each unit is fetched in one request.
func plan(src Source, entries []*catalog.Entry, capacity int64) ([][]*catalog.Entry, Status) {
	type item struct {
		e      *catalog.Entry
		span   runs.Span
		packed bool
	}
	items := make([]item, 0, len(entries))
	var st Status
	for _, e := range entries {
		sp, ok := src.Locate(e)
		items = append(items, item{e, sp, ok})
		st.Files++
		st.Bytes = catalog.AddSize(st.Bytes, e.Size)
	}
	sort.Slice(items, func(i, j int) bool {
		a, b := items[i], items[j]
		if a.packed != b.packed {
			return a.packed
		}
		if a.packed {
			if a.span.Container != b.span.Container {
				return a.span.Container < b.span.Container
			}
			return a.span.Off < b.span.Off
		}
		return a.e.Path() < b.e.Path()
	})
	// What fits: the first items, in that order, up to capacity.
	n := 0
	for n < len(items) && items[n].e.Size <= capacity-st.FitBytes {
		st.FitBytes += items[n].e.Size
		n++
	}
	st.FitFiles = n
	items = items[:n]
	// Packed samples come first: in runs of neighbours, each one unit.
	packed := 0
	for packed < len(items) && items[packed].packed {
		packed++
	}
	spans := make([]runs.Span, packed)
	for i := range spans {
		spans[i] = items[i].span
	}
	gap, limit := src.RunLimits()
	var units [][]*catalog.Entry
	for _, run := range runs.Plan(spans, gap, limit) {
		u := make([]*catalog.Entry, len(run))
		for k, i := range run {
			u[k] = items[i].e
		}
		units = append(units, u)
	}
	for _, it := range items[packed:] {
		units = append(units, []*catalog.Entry{it.e})
	}
	return units, st
}
