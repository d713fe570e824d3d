package owners

import (
	"math"
	"strconv"

	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/jobs"
)

// rankReads are the reads of one job's samples by rank over the
// placement window, by sample: sample i is read once by each rank in
// ranks[start[i]:start[i+1]]. Which rank reads which sample depends on
// the job, the window and the dataset only, not on the members: a member
// that joins or leaves changes who runs the ranks, not what they read.
// So a table change counts the members' reads in one pass in sample
// order, where drawing the epochs' permutations again and adding them up
// in their random order cost more than half a CPU-second at a million
// samples. 12 bytes a sample with four epochs.
type rankReads struct {
	key   string   // the job's line, less its ranks, with the window and the sample count
	start []uint32 // len n+1
	ranks []uint16 // control.MaxWorld ranks fit
	used  bool     // asked for at the last table change
}

// rankReadsCache holds the rankReads of the jobs of the last table
// change. The watcher's only.
type rankReadsCache struct{ m map[string]*rankReads }

// get returns the reads of n samples by spec's ranks over epochs epochs
// from spec.Epoch, counted once; nil where they are too many to keep
// (more than 2^32 reads: count them directly). Which rank reads sample i
// depends on the job and n only (jobs.Reads), not on which file is i.
func (c *rankReadsCache) get(spec control.Job, n, epochs int) *rankReads {
	spec.Ranks = nil
	key := spec.Line() + " n=" + strconv.Itoa(n) + " window=" + strconv.Itoa(epochs)
	if r := c.m[key]; r != nil {
		r.used = true
		return r
	}
	counts := make([]uint32, n+1)
	var total uint64
	jobs.Reads(spec, n, spec.Epoch, epochs, func(_, i int) {
		counts[i+1]++
		total++
	})
	if total > math.MaxUint32 {
		return nil
	}
	for i := 1; i <= n; i++ {
		counts[i] += counts[i-1]
	}
	r := &rankReads{key: key, start: counts, ranks: make([]uint16, total), used: true}
	next := append([]uint32(nil), counts[:n]...)
	jobs.Reads(spec, n, spec.Epoch, epochs, func(rank, i int) {
		r.ranks[next[i]] = uint16(rank)
		next[i]++
	})
	if c.m == nil {
		c.m = map[string]*rankReads{}
	}
	c.m[key] = r
	return r
}

// sweep forgets the reads not asked for since the last sweep.
func (c *rankReadsCache) sweep() {
	for k, r := range c.m {
		if !r.used {
			delete(c.m, k)
		}
		r.used = false
	}
}
