package readers

import (
	"slices"
)

// posRead is a first read of a file at a plan's position: the unwrapped
// position (epoch e's position q is e·length + q) and the process that
// read it.
type posRead struct {
	u    int
	proc int
}

// Shape limits.
const (
	// shapeWindow bounds the reads an inferred job keeps to tell its
	// loader's shape: batch sizes up to about a third of it show.
	shapeWindow = 2048
	// shapeEvery: new reads between two looks at the shape.
	shapeEvery = 32
)

// shapeOf tells a DataLoader's batch size and number of workers from the
// first reads of one plan's files: obs are unwrapped positions in the
// plan, with the process that read each; length is the positions in an
// epoch; main is the stream's own process.
//
// With W workers, worker k % W reads batch k, the B positions of an epoch
// from k·B; each worker is a process of its own. So a run of consecutive
// positions that one process read, with positions that other processes
// read on both sides, is one batch. batch is B when at least two such
// runs, none at an epoch's end (its last batch may be short), are all B
// long, and no run crosses a multiple of B; otherwise 0: not shown. workers is W
// when, within an epoch, two batches of one process are W apart and
// batches of one process are exactly those a multiple of W apart;
// 0 when the stream's own process read them all (num_workers=0); and −1:
// not shown (one worker, or batches too large to see whole).
func shapeOf(obs []posRead, length, main int) (batch, workers int) {
	if len(obs) < MinEvidence || length <= 0 {
		return 0, -1
	}
	rs := slices.Clone(obs)
	slices.SortStableFunc(rs, func(a, b posRead) int { return a.u - b.u })
	rs = slices.CompactFunc(rs, func(a, b posRead) bool { return a.u == b.u }) // a re-read keeps its first reader
	if !slices.ContainsFunc(rs, func(r posRead) bool { return r.proc != main }) {
		return 0, 0
	}
	// Runs of consecutive positions of one process, cut at epochs' ends.
	type run struct {
		lo, hi      int // positions, inclusive
		proc        int
		left, right bool // a position of another process, or the epoch's edge, on that side
	}
	var runs []run
	for i, r := range rs {
		if n := len(runs); n > 0 && runs[n-1].hi == r.u-1 && runs[n-1].proc == r.proc && r.u%length != 0 {
			runs[n-1].hi = r.u
			continue
		}
		left := r.u%length == 0 || i > 0 && rs[i-1].u == r.u-1 && rs[i-1].proc != r.proc
		runs = append(runs, run{lo: r.u, hi: r.u, proc: r.proc, left: left})
	}
	for i := range runs {
		end := runs[i].hi%length == length-1
		runs[i].right = end || i+1 < len(runs) && runs[i+1].lo == runs[i].hi+1
	}
	complete := 0
	for _, r := range runs {
		if !r.left || !r.right || r.hi%length == length-1 {
			continue
		}
		n := r.hi - r.lo + 1
		switch {
		case batch == 0:
			batch = n
		case n != batch:
			return 0, -1
		}
		complete++
	}
	if complete < 2 {
		return 0, -1
	}
	for _, r := range runs {
		if (r.lo%length)/batch != (r.hi%length)/batch {
			return 0, -1 // across a batch boundary (or off them): not batches of B
		}
	}
	// Each batch's process, by epoch.
	type batchKey struct{ epoch, k int }
	procOf := map[batchKey]int{}
	for _, r := range runs {
		procOf[batchKey{r.lo / length, (r.lo % length) / batch}] = r.proc
	}
	keys := make([]batchKey, 0, len(procOf))
	for k := range procOf {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b batchKey) int {
		if a.epoch != b.epoch {
			return a.epoch - b.epoch
		}
		return a.k - b.k
	})
	// W is the least distance between two batches of one process with
	// every batch between them seen; then every two batches up to 2W
	// apart must agree with it.
	w := 0
	for i, a := range keys {
		for j := i + 1; j < len(keys); j++ {
			b := keys[j]
			if b.epoch != a.epoch || w > 0 && b.k-a.k >= w {
				break
			}
			if procOf[a] == procOf[b] {
				if j-i == b.k-a.k {
					w = b.k - a.k
				}
				break
			}
		}
	}
	if w == 0 {
		return batch, -1
	}
	for i, a := range keys {
		for _, b := range keys[i+1:] {
			if b.epoch != a.epoch || b.k-a.k > 2*w {
				break
			}
			if (procOf[a] == procOf[b]) != ((b.k-a.k)%w == 0) {
				return batch, -1
			}
		}
	}
	return batch, w
}
