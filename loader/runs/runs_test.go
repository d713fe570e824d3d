package runs

import (
	"reflect"
	"testing"
)

func TestPlan(t *testing.T) {
	sp := func(c string, off, n int64) Span { return Span{Container: c, Off: off, Len: n} }
	for _, c := range []struct {
		name       string
		spans      []Span
		gap, limit int64
		want       []Run
	}{
		{"none", nil, 10, 100, nil},
		{"one", []Span{sp("a", 0, 10)}, 0, 100, []Run{{0}}},
		{"adjacent, one run", []Span{sp("a", 0, 10), sp("a", 10, 10), sp("a", 20, 10)}, 0, 100, []Run{{0, 1, 2}}},
		{"sorted by offset", []Span{sp("a", 20, 10), sp("a", 0, 10), sp("a", 10, 10)}, 0, 100, []Run{{1, 2, 0}}},
		{"a gap at the limit is read through", []Span{sp("a", 0, 10), sp("a", 15, 10)}, 5, 100, []Run{{0, 1}}},
		{"a gap past the limit splits", []Span{sp("a", 0, 10), sp("a", 16, 10)}, 5, 100, []Run{{0}, {1}}},
		{"the length limit splits", []Span{sp("a", 0, 10), sp("a", 10, 10), sp("a", 20, 10)}, 0, 20, []Run{{0, 1}, {2}}},
		{"a span longer than the limit stands alone", []Span{sp("a", 0, 50), sp("a", 50, 10), sp("a", 60, 10)}, 0, 20, []Run{{0}, {1, 2}}},
		{"containers split, in name order", []Span{sp("b", 0, 10), sp("a", 10, 10), sp("a", 0, 10), sp("b", 10, 10)}, 0, 100,
			[]Run{{2, 1}, {0, 3}}},
		{"equal spans keep their order", []Span{sp("a", 0, 0), sp("a", 0, 0)}, 0, 100, []Run{{0, 1}}},
		{"no length limit", []Span{sp("a", 0, 1<<40), sp("a", 1<<40, 1<<40)}, 0, 1<<63 - 1, []Run{{0, 1}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Plan(c.spans, c.gap, c.limit); !reflect.DeepEqual(got, c.want) {
				t.Errorf("Plan = %v, want %v", got, c.want)
			}
		})
	}
}

func TestGrow(t *testing.T) {
	// Ten spans of 10 bytes, 2 bytes apart: span i at 12*i.
	span := func(i int) Span { return Span{Container: "a", Off: 12 * int64(i), Len: 10} }
	all := func(int) Take { return Join }
	for _, c := range []struct {
		name       string
		seed       int
		gap, limit int64
		take       func(i int) Take
		want       Run
	}{
		{"alone: the gaps are too wide", 4, 1, 1000, all, Run{4}},
		{"everything within the limits", 4, 2, 1000, all, Run{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"right first, then left within the length", 4, 2, 34, all, Run{4, 5, 6}},
		{"left when the right ends", 8, 2, 34, all, Run{7, 8, 9}},
		{"at the start", 0, 2, 22, all, Run{0, 1}},
		{"skipped spans are read through", 4, 14, 1000, func(i int) Take {
			if i%2 == 1 {
				return Skip
			}
			return Join
		}, Run{0, 2, 4, 6, 8}},
		{"a skipped span is a gap", 4, 12, 1000, func(i int) Take {
			if i == 5 || i == 6 || i == 2 {
				return Skip
			}
			return Join
		}, Run{3, 4}},
		{"stop ends one side only", 4, 2, 1000, func(i int) Take {
			if i == 6 {
				return Stop
			}
			return Join
		}, Run{0, 1, 2, 3, 4, 5}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Grow(10, c.seed, span, c.gap, c.limit, c.take); !reflect.DeepEqual(got, c.want) {
				t.Errorf("Grow = %v, want %v", got, c.want)
			}
		})
	}
}
