package prefetch

import (
	"slices"
	"strconv"
	"time"
)

// Stats are one rank's figures, as shown under jobs in .dlfs/stats. Epoch,
// Predicted, Consumed and Cursor are the present epoch's; the counters
// below them add up over the job's life (they are exported as Prometheus
// counters). A rank's figures stay, marked Ended, for Config.KeepEnded
// after its job ends or is dropped.
type Stats struct {
	Epoch     int   `json:"epoch"`     // the epoch the reader is in
	Predicted int64 `json:"predicted"` // that epoch's samples
	Consumed  int64 `json:"consumed"`  // of them, the reads so far
	// Epochs counts the epochs the rank has read in, and ConsumedTotal
	// its reads of planned samples in all of them.
	Epochs        int     `json:"epochs"`
	ConsumedTotal int64   `json:"consumed_total"`
	Inferred      int64   `json:"inferred"`
	Hits          int64   `json:"hits"`
	Late          int64   `json:"late"`
	Misses        int64   `json:"misses"`
	StallSeconds  float64 `json:"stall_seconds"`
	Wasted        int64   `json:"wasted"`
	Pushed        int64   `json:"pushed"`
	Cursor        int     `json:"cursor"`
	// Rate is how fast the reader consumes, in samples per second, and
	// LeadSeconds how long it takes to reach the frontier at that rate:
	// how far ahead of it the prefetcher is, in time.
	Rate        float64 `json:"samples_per_second"`
	LeadSeconds float64 `json:"lead_seconds"`
	// Ended is set once the job has ended or been dropped, EndedSeconds
	// ago; the figures are then its last.
	Ended        bool    `json:"ended,omitempty"`
	EndedSeconds float64 `json:"ended_seconds_ago,omitempty"`
}

// rankHistory is a rank's Stats over its job's life, and what is needed
// to keep them.
type rankHistory struct {
	Stats
	lastEpoch int       // the last epoch counted in Epochs; -1 before
	ended     time.Time // zero while the job runs
}

// maxEnded bounds the ended ranks whose figures are kept.
const maxEnded = 1024

// Totals are the node-wide figures, shown as prefetch in .dlfs/stats.
type Totals struct {
	Workers         int   `json:"workers"`
	StagingCapacity int64 `json:"staging_capacity_bytes"`
	StagedBytes     int64 `json:"staged_bytes"`
	StagedBlocks    int   `json:"staged_blocks"`
	// StagedBackingBytes are the pages of the backing files kept beside
	// staged blocks (counted in Staging with them).
	StagedBackingBytes int64 `json:"staged_backing_bytes"`
	InFlight           int   `json:"in_flight"`
	Fetched            int64 `json:"fetched"`
	FetchedBytes       int64 `json:"fetched_bytes"`
	Wasted             int64 `json:"wasted"`
	WastedBytes        int64 `json:"wasted_bytes"`
	Unpredicted        int64 `json:"unpredicted_reads"`
	Errors             int64 `json:"errors"`
	// Pushing into the page cache: samples pushed and their bytes, samples
	// found cached already, pushes that failed, reads that reached dlfs
	// for a sample pushed (the kernel had evicted it), and the bytes
	// pushed and not yet behind their cursor (counted in Staging).
	Pushed         int64 `json:"pushed"`
	PushedBytes    int64 `json:"pushed_bytes"`
	PushCached     int64 `json:"push_cached"`
	PushFailed     int64 `json:"push_failed"`
	PushedThenRead int64 `json:"pushed_then_read"`
	PushedHeld     int64 `json:"pushed_held_bytes"`
}

// statsOfLocked returns the figures of the first stream that plans ino
// (among those of accepts, if not nil), or nil.
func (p *Prefetcher) statsOfLocked(ino uint64, accepts func(*stream) bool) *Stats {
	for _, s := range p.streams {
		if s.has(ino) && (accepts == nil || accepts(s)) {
			return s.stats
		}
	}
	return nil
}

// Stats returns the node-wide totals and the per-stream figures, keyed
// "JOB" then "rank-R".
func (p *Prefetcher) Stats() (Totals, map[string]map[string]Stats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.totals
	t.Workers, t.StagingCapacity = p.cfg.Workers, p.cfg.Staging
	f := p.stage.figures()
	t.StagedBytes, t.StagedBlocks, t.InFlight, t.PushedHeld = f.stagedBytes, f.stagedBlocks, f.inFlight, f.pushedHeld
	t.StagedBackingBytes = f.backedBytes
	fallback := p.fallbackRateLocked()
	for _, s := range p.streams {
		s.stats.Rate, s.stats.LeadSeconds = s.rate, 0
		if s.rate > 0 || fallback > 0 {
			s.stats.LeadSeconds = s.lead(fallback)
		}
		s.epochStatsLocked()
	}
	now := time.Now()
	p.pruneEndedLocked(now)
	per := map[string]map[string]Stats{}
	for id, h := range p.history {
		if per[id.job] == nil {
			per[id.job] = map[string]Stats{}
		}
		st := h.Stats
		if !h.ended.IsZero() {
			st.Ended, st.EndedSeconds = true, now.Sub(h.ended).Seconds()
		}
		per[id.job][rankName(id.rank)] = st
	}
	return t, per
}

// epochStatsLocked sets the stream's present figures: the epoch of its
// furthest read, or of the last position its cursor passed (an epoch
// read to its end is shown, not the next one, still unread), that
// epoch's length and its reads.
func (s *stream) epochStatsLocked() {
	i := min(s.epochOf(max(s.maxSeen, s.cursor-1, 0)), len(s.epochs)-1)
	s.stats.Epoch = s.epochs[i]
	s.stats.Predicted = int64(s.starts[i+1] - s.starts[i])
	s.stats.Consumed = s.epochReads[i]
}

// pruneEndedLocked forgets the figures of ranks whose job ended more
// than KeepEnded ago, and the oldest past maxEnded.
func (p *Prefetcher) pruneEndedLocked(now time.Time) {
	var ended []streamID
	for id, h := range p.history {
		switch {
		case h.ended.IsZero():
		case now.Sub(h.ended) > p.cfg.KeepEnded:
			delete(p.history, id)
		default:
			ended = append(ended, id)
		}
	}
	if len(ended) <= maxEnded {
		return
	}
	slices.SortFunc(ended, func(a, b streamID) int { return p.history[a].ended.Compare(p.history[b].ended) })
	for _, id := range ended[:len(ended)-maxEnded] {
		delete(p.history, id)
	}
}

func rankName(r int) string { return "rank-" + strconv.Itoa(r) }
