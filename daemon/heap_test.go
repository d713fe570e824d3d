package daemon

import "testing"

// TestHeapLimit: the collector may let garbage grow by half of what is
// live outside the tier, at least the headroom, and never by the tier.
func TestHeapLimit(t *testing.T) {
	for _, c := range []struct{ live, held, want int64 }{
		{0, 0, heapHeadroom},
		{100 << 20, 0, 100<<20 + heapHeadroom},
		{200 << 20, 0, 300 << 20},
		{3<<30 + 200<<20, 3 << 30, 3<<30 + 300<<20},
		{3 << 30, 3 << 30, 3<<30 + heapHeadroom},
		{1 << 20, 2 << 20, 2<<20 + heapHeadroom}, // blocks added since the last collection
	} {
		if got := limit(c.live, c.held); got != c.want {
			t.Errorf("limit(%d, %d) = %d, want %d", c.live, c.held, got, c.want)
		}
	}
}
