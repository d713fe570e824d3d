// Package runs plans reads of neighbouring samples of a packed dataset:
// which samples of one container are read with one request.
//
// # Runs
//
// A sample of a packed dataset lies at a Span of a container. Samples
// near each other are cheaper read together: one request from the first's
// start to the last's end costs one latency, and the bytes between them
// (a gap: samples not wanted, or not samples at all) cost their transfer.
// A run is such a request. It ends where the next span lies more than a
// gap limit past it (reading through would cost more than a request's
// latency), or where taking it would make the run longer than a length
// limit (transfer time dominates, and a longer run saves little).
//
// Plan cuts a set of spans into runs; Grow grows one run around a span a
// reader wants next. Both apply the same rule (joins). Reading each run
// once, and each of its samples alone if it fails, is the caller's
// (package loader).
//
// Spans of one container do not overlap. The functions are pure and safe
// for concurrent use.
package runs

import (
	"cmp"
	"slices"
)

// Span is where a sample's bytes lie in a packed container.
type Span struct {
	Container string
	Off, Len  int64
}

// End is where s ends.
func (s Span) End() int64 { return s.Off + s.Len }

// joins says whether s, beside the run [lo, hi) (before it, or after it),
// may join it: it lies at most gap bytes from the run, and the run with
// it spans at most limit bytes.
func joins(lo, hi int64, s Span, before bool, gap, limit int64) bool {
	far := s.Off - hi
	if before {
		far = lo - s.End()
	}
	return far <= gap && max(hi, s.End())-min(lo, s.Off) <= limit
}

// Run is one request: the indexes of its spans in the input, in offset
// order.
type Run []int

// Plan sorts spans by container and offset (stably: equal spans keep
// their order) and cuts them into runs: a run ends at a change of
// container, before a span more than gap bytes past its end, and before
// a span that would make it longer than limit bytes. A span longer than
// limit is a run of its own.
func Plan(spans []Span, gap, limit int64) []Run {
	idx := make([]int, len(spans))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		return cmp.Or(cmp.Compare(spans[a].Container, spans[b].Container), cmp.Compare(spans[a].Off, spans[b].Off))
	})
	var out []Run
	for a := 0; a < len(idx); {
		first := spans[idx[a]]
		lo, hi := first.Off, first.End()
		b := a + 1
		for ; b < len(idx); b++ {
			s := spans[idx[b]]
			if s.Container != first.Container || !joins(lo, hi, s, false, gap, limit) {
				break
			}
			hi = max(hi, s.End())
		}
		out = append(out, Run(idx[a:b:b]))
		a = b
	}
	return out
}

// Take is what a span beside a growing run does (Grow).
type Take int

const (
	Join Take = iota // it joins the run
	Skip             // it is read through: its bytes are a gap
	Stop             // the run grows no further on its side
)

// Grow returns the run around span seed of n spans of one container in
// offset order (span(i) is the i-th). It grows to the right of seed, then
// to its left, one span at a time, nearest first, while the next span
// lies within gap bytes of the run and leaves it within limit bytes
// (joins); take says what that span does. It returns the indexes of the
// spans that joined, seed among them, in offset order.
func Grow(n, seed int, span func(i int) Span, gap, limit int64, take func(i int) Take) Run {
	lo, hi := span(seed).Off, span(seed).End()
	var sides [2][]int // right, then left; nearest first
	for side, step := range []int{1, -1} {
	grow:
		for j := seed + step; j >= 0 && j < n; j += step {
			s := span(j)
			if !joins(lo, hi, s, step < 0, gap, limit) {
				break
			}
			switch take(j) {
			case Stop:
				break grow
			case Join:
				sides[side] = append(sides[side], j)
				lo, hi = min(lo, s.Off), max(hi, s.End())
			}
		}
	}
	out := slices.Clone(sides[1])
	slices.Reverse(out)
	out = append(out, seed)
	return append(out, sides[0]...)
}
