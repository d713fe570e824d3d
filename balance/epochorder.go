package balance

// EpochOrder chooses which of a job's planned permutations each epoch
// uses, so that consecutive epochs reuse what the caches hold (SOLAR
// §4.2). perms[i] is permutation i; cached is how many samples the
// cluster's caches hold. At an epoch's end they hold the last cached
// samples it read, and the next epoch reuses those it reads among its
// first cached ones. The first epoch keeps permutation 0 (its caches are
// cold whatever it reads); the rest follow a greedy tour over the reuse
// matrix, improved by 2-opt. It returns order: epoch i uses
// perms[order[i]]. With cached ≥ every permutation's length, every order
// reuses everything and it returns the identity.
func EpochOrder(perms [][]int, cached int) []int {
	n := len(perms)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	if n < 3 || cached <= 0 || cached >= len(perms[0]) {
		return order
	}
	r := Reuse(perms, cached)
	// Greedy: from permutation 0, always the unused one reusing most of
	// the last (ties to the lower index).
	used := make([]bool, n)
	used[0] = true
	for i := 1; i < n; i++ {
		best := -1
		for j := 0; j < n; j++ {
			if !used[j] && (best < 0 || r[order[i-1]][j] > r[order[i-1]][best]) {
				best = j
			}
		}
		order[i], used[best] = best, true
	}
	// 2-opt on the path, the first position fixed: reverse order[i..j]
	// while that raises the total.
	gain := func(i, j int) int {
		// Edges (i-1,i) and (j,j+1) become (i-1,j) and (i,j+1); the
		// reversed inside is read the other way, so its edges change
		// direction too.
		before, after := r[order[i-1]][order[i]], r[order[i-1]][order[j]]
		if j+1 < n {
			before += r[order[j]][order[j+1]]
			after += r[order[i]][order[j+1]]
		}
		for k := i; k < j; k++ {
			before += r[order[k]][order[k+1]]
			after += r[order[k+1]][order[k]]
		}
		return after - before
	}
	for improved := true; improved; {
		improved = false
		for i := 1; i < n-1; i++ {
			for j := i + 1; j < n; j++ {
				if gain(i, j) > 0 {
					for a, b := i, j; a < b; a, b = a+1, b-1 {
						order[a], order[b] = order[b], order[a]
					}
					improved = true
				}
			}
		}
	}
	return order
}

// Reuse returns the reuse matrix of perms for caches of cached samples:
// r[i][j] is how many of the last cached samples of perms[i] are among the
// first cached of perms[j].
func Reuse(perms [][]int, cached int) [][]int {
	n := len(perms)
	tails := make([]map[int]bool, n)
	for i, p := range perms {
		c := min(cached, len(p))
		tails[i] = make(map[int]bool, c)
		for _, s := range p[len(p)-c:] {
			tails[i][s] = true
		}
	}
	r := make([][]int, n)
	for i := range r {
		r[i] = make([]int, n)
		for j, p := range perms {
			if i == j {
				continue
			}
			for _, s := range p[:min(cached, len(p))] {
				if tails[i][s] {
					r[i][j]++
				}
			}
		}
	}
	return r
}

// TourReuse is the reuse an order of the permutations gets: the sum over
// consecutive epochs.
func TourReuse(r [][]int, order []int) int {
	t := 0
	for i := 1; i < len(order); i++ {
		t += r[order[i-1]][order[i]]
	}
	return t
}
