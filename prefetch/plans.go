package prefetch

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
	"github.com/dlfs/dlfs/jobs"
	"github.com/dlfs/dlfs/loader"
)

type streamID struct {
	job  string
	rank int
}

// stream is one local rank's planned reads. Its order (epochs, starts,
// orders, index, order) does not change once built; NextUse reads it
// without a lock, with the consumed bits (atomic) and the published
// cursor (at). The rest is read and written under the Prefetcher's mu.
type stream struct {
	id       streamID
	job      *jobs.Job                       // for its Ahead bound and owner (mu: replaced by a new version of the job)
	samples  atomic.Pointer[[]folder.Sample] // the job's Samples, read without mu (trimStage): a new version of the job replaces them
	plan     planKey                         // what the order was drawn from: a stream is reused only for the same
	epochs   []int
	starts   []int              // position where each epoch begins
	orders   [][]int32          // each epoch's order, shared with the job: the index in job.Samples of the sample at each position
	index    []uint64           // ino<<32 | pos for every position with a file, sorted: each file's positions in order
	consumed bitset             // a position without a file (a dangling link) is consumed from the start
	cursor   int                // first position not consumed
	at       atomic.Int64       // cursor, published for NextUse when advanceLocked moves it
	maxSeen  int                // furthest position consumed by a read; -1 before any
	spans    []loader.Span      // where each position's sample lies in a packed container
	packed   []bool             // whether spans[pos] is known
	runs     map[string][]int32 // container -> one position per file in it, by offset
	runIdx   []int32            // runIdx[pos]: the index of pos's file in runs[its container]
	order    *schedule          // the order the DataLoader will ask for positions in
	frontier int                // next step of order to consider fetching
	pushStep int                // next step of order to consider pushing
	slack    int
	hist     *rankHistory // the rank's, shared with the streams before and after a plan change
	stats    *Stats       // &hist.Stats
	// epochReads counts the reads matched to each epoch's positions
	// (Stats.Consumed is the cursor's epoch's).
	epochReads []int64
	// rate is how fast the cursor moves, in positions per second: a mean
	// over windows of rateWindow, each weighing half; 0 until the first
	// window closes. rateAt and rateFrom open the current window.
	rate     float64
	rateAt   time.Time
	rateFrom int
}

// watch rebuilds the streams whenever the jobs change.
func (p *Prefetcher) watch(ctx context.Context, changes <-chan struct{}) {
	defer p.wg.Done()
	p.rebuild()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changes:
			p.rebuild()
		}
	}
}

// rebuild computes the streams of every job (outside the lock: plans of
// large datasets take a while), swaps them in, and offers RAM what the
// new plans no longer want staged. A stream whose job and first epoch did
// not change keeps its progress.
func (p *Prefetcher) rebuild() {
	v := p.plans.Version() // before swap reads the plans
	p.swap()
	p.builtMu.Lock()
	p.built = max(p.built, v)
	p.builtCond.Broadcast()
	p.builtMu.Unlock()
	trimmed := p.trimStage()
	for _, b := range trimmed {
		if !p.load.Offer(b.key, b.Block) {
			p.mu.Lock()
			p.totals.Wasted++
			p.totals.WastedBytes += int64(len(b.Data))
			p.mu.Unlock()
		}
	}
	if len(trimmed) > 0 {
		p.kick() // the stage has room again
	}
}

// swap builds and swaps in the streams.
func (p *Prefetcher) swap() {
	var fresh, others []*stream
	for _, j := range p.plans.All() {
		local := map[int]bool{}
		for _, r := range j.Spec.Ranks {
			local[r] = true
			s := build(j, r, j.Epochs(r))
			p.locate(s)
			fresh = append(fresh, s)
		}
		for r := 0; p.cfg.AllRanks && r < j.Spec.World; r++ {
			if !local[r] {
				// Assumed to be in the epoch of this node's first rank.
				others = append(others, build(j, r, j.Epochs(j.Spec.Ranks[0])))
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	old := map[streamID]*stream{}
	for _, s := range p.streams {
		old[s.id] = s
		s.epochStatsLocked() // the last figures of a rank whose job ends now
	}
	for i, s := range fresh {
		if o := old[s.id]; o != nil && o.plan == s.plan {
			o.job = s.job // same plan: keep the progress; the job's bound and owner are the new version's
			o.samples.Store(&s.job.Samples)
			fresh[i] = o
			continue
		}
		// Counters are cumulative over the job's life (they are exported
		// as Prometheus counters); Epoch, Predicted, Consumed and Cursor
		// describe the present (statsLocked). A job that ended starts
		// afresh.
		h := p.history[s.id]
		if h == nil || !h.ended.IsZero() {
			h = &rankHistory{lastEpoch: -1}
			p.history[s.id] = h
		}
		h.Cursor = 0
		s.hist, s.stats = h, &h.Stats
	}
	live := map[streamID]bool{}
	for _, s := range fresh {
		live[s.id] = true
	}
	now := time.Now()
	for id, h := range p.history {
		if !live[id] && h.ended.IsZero() {
			h.ended = now // its last figures stay for KeepEnded
			h.Rate, h.LeadSeconds = 0, 0
		}
	}
	p.pruneEndedLocked(now)
	p.streams = fresh
	p.oracle.publish(fresh, others, p.stage)
	p.dropUnneededPushedLocked()
	p.dropUnneededLocked()
	p.kick()
}

// planKey is everything a stream's order is drawn from: the dataset index
// (by identity: a refresh or a new root makes a new one), the keys of the
// job that decide its plans and the DataLoader's shape, the rank and the
// epochs.
type planKey struct {
	samples *folder.Sample
	n       int
	spec    string // control.FacetPlans and control.FacetLoader
	rank    int
	epochs  string
	layouts string // balance=: the layout ID of each epoch's plan
}

func keyOf(j *jobs.Job, rank int, epochs []int) planKey {
	k := planKey{n: len(j.Samples), spec: j.Spec.Key(control.FacetPlans | control.FacetLoader), rank: rank, epochs: fmt.Sprint(epochs)}
	if len(j.Samples) > 0 {
		k.samples = &j.Samples[0]
	}
	if j.Spec.Balance != "" {
		ids := make([]uint64, len(epochs))
		for i, e := range epochs {
			ids[i] = j.PlanID(e)
		}
		k.layouts = fmt.Sprint(ids)
	}
	return k
}

func build(j *jobs.Job, rank int, epochs []int) *stream {
	s := &stream{id: streamID{j.Spec.Name, rank}, job: j, plan: keyOf(j, rank, epochs), epochs: epochs, maxSeen: -1,
		epochReads: make([]int64, len(epochs))}
	s.samples.Store(&j.Samples)
	var sizes [][]int // each epoch's batch sizes
	n := 0
	for _, e := range s.epochs {
		n += len(j.Order(rank, e))
	}
	s.index = make([]uint64, 0, n)
	s.consumed = newBitset(n)
	pos := 0
	for _, e := range s.epochs {
		if j.Spec.Balance != "" {
			sizes = append(sizes, j.Batches(rank, e))
		} else {
			sizes = append(sizes, nil) // every batch full but the last
		}
		s.starts = append(s.starts, pos)
		order := j.Order(rank, e)
		s.orders = append(s.orders, order)
		for _, i := range order {
			if ent := j.Samples[i].Entry; ent != nil && ent.Ino < 1<<32 {
				s.index = append(s.index, ent.Ino<<32|uint64(pos))
			} else {
				// A dangling symlink, or one leaving the dataset: torchvision
				// lists it, but there is nothing to fetch, and its read fails.
				// (No catalog numbers 2^32 inodes.)
				s.consumed.set(pos)
			}
			pos++
		}
	}
	slices.Sort(s.index)
	s.starts = append(s.starts, pos)
	s.order = newSchedule(s.starts, j.Spec.Workers, j.Spec.Batch, sizes)
	// The DataLoader has up to prefetch_factor (2) batches per worker in
	// flight; reads arrive out of order within that window.
	window := 2 * max(j.Spec.Workers, 1) * j.Spec.Batch
	s.slack = 2*window + j.Spec.Batch + 16
	return s
}

// entry returns the file at position pos.
// (nil for a dangling link: such a position is consumed from the start).
func (s *stream) entry(pos int) *catalog.Entry {
	e := s.epochOf(pos)
	return (*s.samples.Load())[s.orders[e][pos-s.starts[e]]].Entry
}

// len is the number of positions.
func (s *stream) len() int { return s.starts[len(s.starts)-1] }

// positions returns ino's entries of the index, in position order.
func (s *stream) positions(ino uint64) []uint64 {
	if ino >= 1<<32 {
		return nil // never planned (build skips it), and ino<<32 would wrap
	}
	lo, _ := slices.BinarySearch(s.index, ino<<32)
	hi, _ := slices.BinarySearch(s.index, (ino+1)<<32)
	return s.index[lo:hi]
}

// has reports whether ino is planned at all.
func (s *stream) has(ino uint64) bool { return len(s.positions(ino)) > 0 }

// bitset is one bit per position. Set under the Prefetcher's mu; read
// with or without it (NextUse).
type bitset []atomic.Uint64

func newBitset(n int) bitset    { return make(bitset, (n+63)/64) }
func (b bitset) get(i int) bool { return b[i/64].Load()&(1<<(i%64)) != 0 }
func (b bitset) set(i int)      { b[i/64].Or(1 << (i % 64)) }

// locate records where each sample of s lies, when SOURCE is packed, so
// that next can coalesce neighbours without calling out under mu.
func (p *Prefetcher) locate(s *stream) {
	if !p.load.Coalesces() {
		return // not a packed dataset: nothing to hold
	}
	s.spans, s.packed = make([]loader.Span, s.len()), make([]bool, s.len())
	s.runs, s.runIdx = map[string][]int32{}, make([]int32, s.len())
	spans := map[uint64]int{} // ino -> first position located
	for pos := range s.len() {
		e := s.entry(pos)
		if e == nil || s.consumed.get(pos) {
			continue // a dangling link: nothing to locate
		}
		if q, ok := spans[e.Ino]; ok {
			s.spans[pos], s.packed[pos] = s.spans[q], s.packed[q]
			continue
		}
		s.spans[pos], s.packed[pos] = p.load.Locate(e)
		spans[e.Ino] = pos
		if s.packed[pos] {
			c := s.spans[pos].Container
			s.runs[c] = append(s.runs[c], int32(pos))
		}
	}
	for _, list := range s.runs {
		sort.Slice(list, func(i, j int) bool { return s.spans[list[i]].Off < s.spans[list[j]].Off })
	}
	for pos := range s.len() {
		if s.packed[pos] {
			e := s.entry(pos)
			list := s.runs[s.spans[pos].Container]
			first := spans[e.Ino]
			s.runIdx[pos] = int32(sort.Search(len(list), func(i int) bool { return s.spans[list[i]].Off >= s.spans[first].Off }))
		}
	}
}

// epochOf returns the index into s.epochs of position pos.
func (s *stream) epochOf(pos int) int {
	return sort.SearchInts(s.starts[1:], pos+1)
}

// pending returns the first unconsumed position of ino at or after the
// cursor, or -1.
func (s *stream) pending(ino uint64) int { return s.pendingFrom(ino, s.cursor) }

// pendingFrom returns the first unconsumed position of ino at or after
// cursor, or -1. It takes no lock: NextUse calls it with the published
// cursor.
func (s *stream) pendingFrom(ino uint64, cursor int) int {
	list := s.positions(ino)
	i, _ := slices.BinarySearch(list, ino<<32|uint64(cursor))
	for ; i < len(list); i++ {
		if q := int(uint32(list[i])); !s.consumed.get(q) {
			return q
		}
	}
	return -1
}

// consumedThisEpoch reports whether ino was already consumed in the epoch
// the cursor is in.
func (s *stream) consumedThisEpoch(ino uint64) bool {
	ep := s.epochOf(s.cursor)
	for _, k := range s.positions(ino) {
		if q := int(uint32(k)); s.epochOf(q) == ep && s.consumed.get(q) {
			return true
		}
	}
	return false
}
