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

// TestReleaseDue: the governor returns freed memory once the tier's heap
// has fallen by heapHeadroom from its highest since the last release
// (blocks moved into backing files, or dropped), not on churn.
func TestReleaseDue(t *testing.T) {
	peak := int64(0)
	steps := []struct {
		held    int64
		release bool
	}{
		{100 << 20, false},                // filling
		{100<<20 - heapHeadroom/2, false}, // half the headroom freed
		{100<<20 - heapHeadroom/2, false}, // churn at the same level
		{100<<20 - heapHeadroom, true},    // the headroom freed in all
		{100<<20 - heapHeadroom, false},   // released: a new peak
		{100 << 20, false},                // filled again
		{100<<20 - 2*heapHeadroom, true},  // a large drop at once
	}
	for i, s := range steps {
		var release bool
		peak, release = releaseDue(peak, s.held)
		if release != s.release {
			t.Fatalf("step %d (held %d): release %v, want %v", i, s.held, release, s.release)
		}
	}
}
