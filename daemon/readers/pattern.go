package readers

import (
	"fmt"
	"slices"
)

// Pattern is what a stream's recent reads look like in a dataset index.
type Pattern struct {
	Kind   string // "sequential", "strided", "random", or "torch" (a seeded shuffle; see Guess)
	Stride int    // positions between consecutive samples (1: sequential)
	Rank   int    // the first position modulo Stride
}

func (p Pattern) String() string {
	switch p.Kind {
	case "sequential":
		return "sequential"
	case "strided":
		return fmt.Sprintf("strided %d+%d", p.Stride, p.Rank)
	case "torch":
		return "torch"
	}
	return p.Kind
}

// Detection thresholds.
const (
	// MinEvidence is how many distinct files must be placed before a
	// stream's pattern is judged.
	MinEvidence = 8
	// maxGaps: the positions read may cover at most this many times the
	// span they need (a DataLoader's workers read batches side by side,
	// and the page cache hides some reads).
	maxGaps = 3
	// MinRandom is how many distinct files it takes to call a stream
	// random (a loader's first reads can look scattered).
	MinRandom = 64
	// loaderWindow bounds the span a DataLoader's side-by-side batches
	// may scatter reads over and still be sequential.
	loaderWindow = 1024
	// MaxStride is the largest stride taken for a DistributedSampler
	// world (issue 12: worlds up to 1,024).
	MaxStride = 1024
)

// Detect judges positions, the positions in an index of n samples of a
// stream's recent first reads of files, in arrival order (−1: not in the
// index). They are sequential when, sorted, they step by 1 with few gaps;
// strided when they step by a common stride (a DistributedSampler without
// shuffle: rank r reads r, r+W, r+2W, …); random otherwise. Few gaps is at
// most maxGaps times the span the positions need, or a DataLoader's window
// (a sixteenth of the index, at most loaderWindow): its workers read
// batches side by side; and at most half the index. Fewer than
// MinEvidence placed positions, or a
// quarter of them not in the index, say nothing (ok is false); so does a
// random look from fewer than MinRandom.
func Detect(positions []int, n int) (p Pattern, ok bool) {
	var ps []int
	missing := 0
	for _, x := range positions {
		if x < 0 {
			missing++
			continue
		}
		ps = append(ps, x)
	}
	slices.Sort(ps)
	ps = slices.Compact(ps)
	if len(ps) < MinEvidence || 4*missing > len(positions) {
		return Pattern{}, false
	}
	g := 0
	for i := 1; i < len(ps); i++ {
		g = gcd(g, ps[i]-ps[i-1])
	}
	lo, hi := ps[0], ps[len(ps)-1]
	p = Pattern{Kind: "random", Stride: g}
	if g < 1 || g > MaxStride {
		return p, len(ps) >= MinRandom
	}
	if span := (hi-lo)/g + 1; span > max(maxGaps*len(ps), min(loaderWindow, n/16)) {
		return p, len(ps) >= MinRandom
	}
	// Random reads covering much of a small index can look dense: a scan
	// spans at most half of it at any time.
	if (hi-lo)/g+1 > n/2 {
		return p, len(ps) >= MinRandom
	}
	p.Rank = lo % g
	if g == 1 {
		p.Kind = "sequential"
	} else {
		p.Kind = "strided"
	}
	return p, true
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
