package sampler

import "testing"

// TestShuffleMatchesRandperm: drawing position by position gives torch's
// randperm exactly, across resets of one Shuffle and sizes.
func TestShuffleMatchesRandperm(t *testing.T) {
	var s Shuffle
	for _, n := range []int{1, 2, 7, 1000, 5000, 100, 70000} {
		for seed := uint64(0); seed < 3; seed++ {
			want := Randperm(n, NewMT19937(seed), Torch1)
			s.Reset(n, NewMT19937(seed))
			for i, w := range want {
				if got := s.Next(); got != w {
					t.Fatalf("n=%d seed=%d position %d: %d, randperm %d", n, seed, i, got, w)
				}
			}
			if s.Next() != -1 {
				t.Fatalf("n=%d: a value past the end", n)
			}
		}
	}
}
