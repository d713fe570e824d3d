package readers

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/dlfs/dlfs/sampler"
)

// Guess is a torch order that explains a stream's first reads: rank Rank
// of a DistributedSampler(shuffle=True) of World ranks whose generator was
// seeded Seed (the sampler's seed plus the epoch). World 1 is also
// RandomSampler with a generator seeded Seed, for its first epoch.
type Guess struct {
	Seed  uint64
	World int
	Rank  int
}

// Search limits.
const (
	// MaxSeed bounds the generator seeds searched (seed + epoch).
	MaxSeed = 1 << 16
	// SearchReads is how many of a stream's first files a search places.
	SearchReads = 16
	// searchWindow bounds how far into its order a rank's first reads may
	// lie (a DataLoader's workers start side by side, batch_size apart).
	searchWindow = 4096
	// maxSteps bounds the shuffle steps spent on one candidate seed.
	maxSteps = 1 << 20
)

// searchDistributed looks for the Guess under which xs, the index
// positions of a stream's first files in an index of n samples (arrival
// order), are all early reads of one rank: every one at a position r + j·W
// of the seed's permutation with j below min(searchWindow, n/4). It tries
// seeds in increasing order (the default seed 0 and small epochs first),
// below maxSeed, on workers goroutines, and returns the smallest that fits.
func searchDistributed(ctx context.Context, xs []int, n, workers, maxSeed int) (Guess, bool) {
	if len(xs) < 8 || n < 2*len(xs) || n >= sampler.LargeN {
		return Guess{}, false
	}
	// want[v] is 1 + the index in xs of value v, or 0.
	want := make([]uint8, n)
	if len(xs) > 255 {
		xs = xs[:255]
	}
	for i, x := range xs {
		if x < 0 || x >= n {
			return Guess{}, false
		}
		want[x] = uint8(i + 1)
	}
	var (
		best atomic.Int64 // the smallest seed found, or MaxSeed
		next atomic.Int64
		mu   sync.Mutex
		out  Guess
		wg   sync.WaitGroup
	)
	best.Store(int64(maxSeed))
	for w := 0; w < max(workers, 1); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var sh sampler.Shuffle
			g := sampler.NewMT19937(0)
			pos := make([]int, len(xs))
			for {
				seed := next.Add(1) - 1
				if seed >= best.Load() || ctx.Err() != nil {
					return
				}
				g.Seed(uint64(seed))
				sh.Reset(n, g)
				if guess, ok := tryShuffle(&sh, want, pos, n); ok {
					guess.Seed = uint64(seed)
					mu.Lock()
					if seed < best.Load() {
						best.Store(seed)
						out = guess
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return out, best.Load() < int64(maxSeed) && ctx.Err() == nil
}

// tryShuffle draws sh until it has placed every wanted value (pos[i] is
// xs[i]'s position), or it is clear they are not a rank's early reads,
// and returns the world and rank they fit. The world divides the
// differences between the positions placed so far, so the positions can
// reach at most lo mod g + window·g, g their greatest common divisor; and
// the first read (one of the first firstReads) is a rank's first sample,
// at a position below MaxStride.
func tryShuffle(sh *sampler.Shuffle, want []uint8, pos []int, n int) (Guess, bool) {
	for i := range pos {
		pos[i] = -1
	}
	window := min(searchWindow, n/4)
	found, lo, g := 0, -1, 0
	limit := min(n, MaxStride)
	early := false // one of the first reads is in the first MaxStride positions
	for found < len(pos) {
		p := sh.Pos()
		if p >= limit {
			if !early {
				return Guess{}, false
			}
			if g == 0 {
				limit = min(n, maxSteps)
			} else {
				limit = min(n, lo%g+window*g)
			}
			if p >= limit {
				return Guess{}, false
			}
		}
		v := sh.Next()
		if v < 0 {
			return Guess{}, false
		}
		i := int(want[v]) - 1
		if i < 0 {
			continue
		}
		pos[i] = p
		found++
		if lo < 0 {
			lo = p
		} else {
			g = gcd(g, p-lo)
			if g <= MaxStride {
				limit = min(n, lo%g+window*g)
			}
		}
		if i < firstReads && p < MaxStride {
			early = true
		}
	}
	return fit(pos, n)
}

// firstReads: one of a stream's first reads is a rank's first sample
// (a DataLoader's workers start side by side).
const firstReads = 8

// fit returns the world and rank under which every position in pos is
// r + j·W with a small j: W is the greatest common divisor of their
// differences.
func fit(pos []int, n int) (Guess, bool) {
	lo := pos[0]
	for _, p := range pos {
		lo = min(lo, p)
	}
	w := 0
	for _, p := range pos {
		w = gcd(w, p-lo)
	}
	if w < 1 || w > MaxStride {
		return Guess{}, false
	}
	r := lo % w
	window := min(searchWindow, n/4)
	for _, p := range pos {
		if (p-r)/w >= window {
			return Guess{}, false
		}
	}
	return Guess{World: w, Rank: r}, true
}
