package prefetch

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestSchedule(t *testing.T) {
	check := func(s *schedule, want []int32) {
		t.Helper()
		var order []int32
		for k := 0; k < s.len(); k++ {
			order = append(order, int32(s.at(k)))
		}
		if fmt.Sprint(order) != fmt.Sprint(want) {
			t.Errorf("order %v, want %v", order, want)
		}
		for i, p := range order {
			if got := s.step(int(p)); got != i {
				t.Errorf("step(%d) = %d, want %d", p, got, i)
			}
		}
	}
	// Two epochs of 10 and 7 samples, 2 workers, batches of 3: worker 0
	// reads batch 0 (0,1,2) while worker 1 reads batch 1 (3,4,5).
	check(newSchedule([]int{0, 10, 17}, 2, 3, nil), []int32{0, 3, 1, 4, 2, 5, 6, 9, 7, 8, 10, 13, 11, 14, 12, 15, 16})
	// Uneven batches (balance=solar): 2, 4, 0, 3 in one epoch of 9; then
	// sizes that run out (the rest is one batch).
	check(newSchedule([]int{0, 9, 13}, 2, 3, [][]int{{2, 4, 0, 3}, {1}}), []int32{0, 2, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
}

// TestScheduleAgainstTable compares the arithmetic with the table it
// replaced, over random epochs, batch sizes and worker counts.
func TestScheduleAgainstTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 500; trial++ {
		workers, batch := 1+rng.IntN(9), 1+rng.IntN(7)
		starts := []int{0}
		var sizes [][]int
		for e := 0; e < 1+rng.IntN(3); e++ {
			n := rng.IntN(60)
			starts = append(starts, starts[len(starts)-1]+n)
			var sz []int
			switch rng.IntN(3) {
			case 0: // stock: every batch full but the last
				for left := n; left > 0; left -= batch {
					sz = append(sz, min(left, batch))
				}
			case 1: // uneven, maybe running out or over
				for i := rng.IntN(2 + n/2); i > 0; i-- {
					sz = append(sz, rng.IntN(2*batch+1))
				}
			}
			sizes = append(sizes, sz)
		}
		table := make([][]int, len(sizes))
		for e, sz := range sizes {
			table[e] = sz
			if sz == nil { // newSchedule's uniform batches, spelled out
				for left := starts[e+1] - starts[e]; left > 0; left -= batch {
					table[e] = append(table[e], min(left, batch))
				}
			}
		}
		order, sched := scheduleTable(starts, workers, table)
		s := newSchedule(starts, workers, batch, sizes)
		if s.len() != len(order) {
			t.Fatalf("len %d, want %d", s.len(), len(order))
		}
		for k, p := range order {
			if got := s.at(k); got != int(p) {
				t.Fatalf("trial %d (starts %v, workers %d, batch %d, sizes %v): at(%d) = %d, want %d", trial, starts, workers, batch, sizes, k, got, p)
			}
			if got := s.step(int(p)); got != int(sched[p]) {
				t.Fatalf("trial %d: step(%d) = %d, want %d", trial, p, got, sched[p])
			}
		}
	}
}

// scheduleTable is the schedule as tables (what the prefetcher kept before
// issue 13): order[k] is the position at step k, sched its inverse.
func scheduleTable(starts []int, workers int, sizes [][]int) (order, sched []int32) {
	n := starts[len(starts)-1]
	order = make([]int32, 0, n)
	sched = make([]int32, n)
	type run struct{ at, n int }
	for e := 0; e+1 < len(starts); e++ {
		lo, hi := starts[e], starts[e+1]
		for k, pos := 0, lo; pos < hi; k += workers {
			var round []run
			longest := 0
			for w := 0; w < workers && pos < hi; w++ {
				z := hi - pos
				if k+w < len(sizes[e]) {
					z = min(sizes[e][k+w], z)
				}
				round = append(round, run{pos, z})
				pos += z
				longest = max(longest, z)
			}
			for i := 0; i < longest; i++ {
				for _, b := range round {
					if i < b.n {
						sched[b.at+i] = int32(len(order))
						order = append(order, int32(b.at+i))
					}
				}
			}
		}
	}
	return order, sched
}
