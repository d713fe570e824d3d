package daemon

import "testing"

// TestHeapLimit: the collector may let garbage grow by half of what is
// live outside the tier, at least the headroom, and at least what the tier
// has yet to fill; never by the tier's own bytes.
func TestHeapLimit(t *testing.T) {
	for _, c := range []struct{ live, held, capacity, want int64 }{
		{0, 0, 0, heapHeadroom},
		{100 << 20, 0, 0, 100<<20 + heapHeadroom},
		{200 << 20, 0, 0, 300 << 20},
		{3<<30 + 200<<20, 3 << 30, 3 << 30, 3<<30 + 300<<20},
		{3 << 30, 3 << 30, 3 << 30, 3<<30 + heapHeadroom},
		{1 << 20, 2 << 20, 2 << 20, 2<<20 + heapHeadroom}, // blocks added since the last collection
		// Filling: the tier's unfilled capacity is headroom, up to a bound.
		{100 << 20, 0, 2 << 30, 100<<20 + heapFillHeadroom},
		{1<<30 + 100<<20, 1 << 30, 2 << 30, 1<<30 + 100<<20 + heapFillHeadroom},
		{1<<30 + 100<<20, 1 << 30, 1<<30 + 100<<20, 1<<30 + 100<<20 + 100<<20},
		{2<<30 - 10<<20, 2<<30 - 10<<20, 2 << 30, 2<<30 - 10<<20 + heapHeadroom},
	} {
		if got := limit(c.live, c.held, c.capacity); got != c.want {
			t.Errorf("limit(%d, %d, %d) = %d, want %d", c.live, c.held, c.capacity, got, c.want)
		}
	}
}
