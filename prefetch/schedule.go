package prefetch

import "sort"

// A schedule orders a stream's positions the way a DataLoader with workers
// asks for them: batch k goes to worker k % workers, the workers run side
// by side and each reads its batch in order, so within a round of workers
// batches the i-th samples of all of them come before the (i+1)-th.
// Prefetching in this order serves the first batches of an epoch, which
// every worker asks for at once, in time.
//
// It is arithmetic over the batch boundaries, not a table: a planned
// position costs nothing here (two int32 tables, order and its inverse,
// were 8 of the 24 bytes a position cost). A round's positions keep their
// range in schedule steps (the round starting at position p starts at step
// p), so both directions work within one round of at most workers batches.
type schedule struct {
	workers int
	epochs  []batches
}

// batches are one epoch's batch boundaries.
type batches struct {
	lo, hi int // the epoch's positions
	size   int // every batch's size but the last, when starts is nil
	// starts[k] is batch k's first position, relative to lo, and
	// starts[len-1] = hi-lo; set when sizes differ (balance=solar). A batch
	// may be empty: it still takes its worker's turn.
	starts []int32
}

// newSchedule returns the schedule of the epochs delimited by starts
// (positions), whose batches are batch long unless sizes[e] is set for
// epoch e. Sizes that run out before the epoch does leave the rest as one
// batch; sizes beyond its end are cut.
func newSchedule(starts []int, workers, batch int, sizes [][]int) *schedule {
	s := &schedule{workers: max(workers, 1)}
	for e := 0; e+1 < len(starts); e++ {
		b := batches{lo: starts[e], hi: starts[e+1], size: max(batch, 1)}
		if e < len(sizes) && sizes[e] != nil {
			n := b.hi - b.lo
			at := 0
			b.starts = make([]int32, 0, len(sizes[e])+2)
			for _, z := range sizes[e] {
				b.starts = append(b.starts, int32(at))
				at = min(at+max(z, 0), n)
			}
			if at < n || len(b.starts) == 0 {
				b.starts = append(b.starts, int32(at)) // the rest, as one batch
			}
			b.starts = append(b.starts, int32(n))
		}
		s.epochs = append(s.epochs, b)
	}
	return s
}

// count is the number of batches.
func (b *batches) count() int {
	if b.starts != nil {
		return len(b.starts) - 1
	}
	return (b.hi - b.lo + b.size - 1) / b.size
}

// start is batch k's first position relative to lo; start(count()) is the
// epoch's length.
func (b *batches) start(k int) int {
	if b.starts != nil {
		return int(b.starts[k])
	}
	return min(k*b.size, b.hi-b.lo)
}

// batchOf returns the batch holding rel, a position relative to lo.
func (b *batches) batchOf(rel int) int {
	if b.starts == nil {
		return rel / b.size
	}
	return sort.Search(b.count(), func(k int) bool { return int(b.starts[k+1]) > rel })
}

// roundOf returns the first batch of the round holding rel.
func (b *batches) roundOf(rel, workers int) int {
	if b.starts == nil {
		return rel / (b.size * workers) * workers
	}
	n := b.count()
	r := sort.Search((n+workers-1)/workers, func(r int) bool { return b.start(min((r+1)*workers, n)) > rel })
	return r * workers
}

// epoch returns the epoch holding position pos.
func (s *schedule) epoch(pos int) *batches {
	k := sort.Search(len(s.epochs), func(e int) bool { return s.epochs[e].hi > pos })
	return &s.epochs[k]
}

// len is the number of positions.
func (s *schedule) len() int {
	if len(s.epochs) == 0 {
		return 0
	}
	return s.epochs[len(s.epochs)-1].hi
}

// step returns pos's step: how many positions the DataLoader asks for
// before it.
func (s *schedule) step(pos int) int {
	b := s.epoch(pos)
	rel := pos - b.lo
	k := b.batchOf(rel)
	first := k / s.workers * s.workers
	last := min(first+s.workers, b.count())
	i := rel - b.start(k) // pos's layer: its place in its batch
	n := b.lo + b.start(first)
	for m := first; m < last; m++ {
		z := b.start(m+1) - b.start(m)
		if m < k {
			n += min(z, i+1)
		} else {
			n += min(z, i)
		}
	}
	return n
}

// at returns the position at step t: the inverse of step.
func (s *schedule) at(t int) int {
	b := s.epoch(t)
	rel := t - b.lo
	first := b.roundOf(rel, s.workers)
	last := min(first+s.workers, b.count())
	base := b.start(first)
	rel -= base
	// Layers below the round's shortest remaining batch hold one position
	// of every batch still running; walk them in runs of equal width.
	layer := 0
	for {
		width, next := 0, -1 // batches longer than layer; the shortest of them
		for m := first; m < last; m++ {
			if z := b.start(m+1) - b.start(m); z > layer {
				width++
				if next < 0 || z < next {
					next = z
				}
			}
		}
		if width == 0 {
			return -1 // t is past the round: roundOf keeps it from happening
		}
		if span := (next - layer) * width; rel >= span {
			rel, layer = rel-span, next
			continue
		}
		layer += rel / width
		j := rel % width // the j-th batch still running at layer
		for m := first; m < last; m++ {
			if b.start(m+1)-b.start(m) > layer {
				if j == 0 {
					return b.lo + b.start(m) + layer
				}
				j--
			}
		}
	}
}
