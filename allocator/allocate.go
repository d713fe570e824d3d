package allocator

import (
	"cmp"
	"math"
	"slices"
)

// even splits cpus workers equally between n ranks, the remainder to the
// first, at least one each and at most maxWorkers. With more ranks than
// cpus, the first cpus ranks get one and the rest none (their main
// processes load).
func even(n, cpus, maxWorkers int) []int {
	d := make([]int, n)
	for i := range d {
		switch {
		case n > cpus:
			d[i] = min(1, max(0, cpus-i))
		default:
			d[i] = cpus / n
			if i < cpus%n {
				d[i]++
			}
		}
		d[i] = min(d[i], maxWorkers)
	}
	return d
}

// need chooses at most cpus workers in all, one per rank at least, to
// maximise the ranks' predicted total samples/s on cores processors
// (A-Dloader's Algorithm 1, by marginal gain):
//
//  1. Every rank gets one worker; with as many ranks as CPUs or more,
//     that is all (Algorithm 1, lines 1-2).
//  2. A rank that even would serve better than this allocation by more
//     than a tenth gets workers first, the furthest behind first, so
//     that no rank is much slower than under even unless even cannot
//     make it faster either.
//  3. Then each further worker goes where it adds the most samples/s to
//     the total, as long as it adds at least a fiftieth of what an
//     average worker delivers: a rank whose workers outrun its model
//     (λ(d) ≥ μ), or whose share of a saturated CPU would only move from
//     another rank, gets none (no over-provisioning), and the rest of the
//     budget stays unused.
//
// The total never exceeds cpus and no rank exceeds maxWorkers. With more
// ranks than cpus, the cpus ranks that one worker speeds up most get one
// and the rest none: their main processes load (DataLoader's
// num_workers=0).
func need(fits []Fit, cpus int, cores float64, maxWorkers int) []int {
	n := len(fits)
	if n > cpus {
		return firstWorkers(fits, cpus, cores)
	}
	d := make([]int, n)
	for i := range d {
		d[i] = 1
	}
	if n == 0 || n == cpus {
		return d
	}
	c := cores
	budget := cpus - n
	floor := predict(fits, even(n, cpus, maxWorkers), c)
	for i := range floor {
		floor[i] *= 0.9
	}

	// Step 2: floors.
	for budget > 0 {
		t := predict(fits, d, c)
		best, worst := -1, 1.0
		for i := range fits {
			if d[i] >= maxWorkers || t[i] >= floor[i] {
				continue
			}
			if r := t[i] / floor[i]; r < worst {
				best, worst = i, r
			}
		}
		if best < 0 {
			break
		}
		d[best]++
		budget--
	}

	// Step 3: marginal gain.
	for budget > 0 {
		t := predict(fits, d, c)
		total := sum(t)
		workers := 0
		for _, x := range d {
			workers += x
		}
		minGain := 0.02 * total / float64(workers)
		best, gain := -1, minGain
		for i := range fits {
			if d[i] >= maxWorkers {
				continue
			}
			d[i]++
			u := predict(fits, d, c)
			d[i]--
			if !keepsFloors(t, u, floor) {
				continue
			}
			if g := sum(u) - total; g > gain {
				best, gain = i, g
			}
		}
		if best < 0 {
			break
		}
		d[best]++
		budget--
	}
	return d
}

// firstWorkers gives one worker to each of the cpus ranks whose rate it
// raises most over loading in the main process, and none to the rest.
func firstWorkers(fits []Fit, cpus int, cores float64) []int {
	n := len(fits)
	d := make([]int, n)
	none := predict(fits, d, cores)
	one := make([]int, n)
	for i := range one {
		one[i] = 1
	}
	all := predict(fits, one, cores)
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(i, j int) int { return cmp.Compare(all[j]-none[j], all[i]-none[i]) })
	for _, i := range idx[:max(0, cpus)] {
		d[i] = 1
	}
	return d
}

// keepsFloors reports whether moving from rates t to u leaves every rank
// that met its floor still meeting it.
func keepsFloors(t, u, floor []float64) bool {
	for i := range t {
		if t[i] >= floor[i] && u[i] < floor[i] {
			return false
		}
	}
	return true
}

// prefetchFactor is the DataLoader prefetch_factor advised for a rank with
// d workers: enough that at least four batches are queued or in flight,
// so one slow read does not stall a rank with few workers, and torch's
// default 2 otherwise.
func prefetchFactor(d int) int {
	if d <= 0 {
		return 2
	}
	return min(8, max(2, int(math.Ceil(4/float64(d)))))
}
