package jobs

import (
	"fmt"

	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
)

// The memory bound: the sample positions a job plans, and all jobs' total
// against MaxPositions.

// Positions is how many sample positions a job with spec over n samples
// plans: each planned rank's reads over its lookahead epochs. A
// DistributedSampler rank reads ceil(n/world) samples an epoch; every rank
// of another sampler reads all n. With allRanks every rank of the world
// is planned, else only spec.Ranks.
func Positions(spec control.Job, n int, allRanks bool) int64 {
	ranks := int64(len(spec.Ranks))
	if allRanks || spec.Balance != "" {
		ranks = int64(spec.World) // a balanced plan holds every rank's order
	}
	perRank := int64(n)
	if spec.Sampler == "distributed" {
		perRank = (int64(n) + int64(spec.World) - 1) / int64(max(spec.World, 1))
	}
	return ranks * perRank * int64(spec.Lookahead)
}

// MaxPositions is the most sample positions and index samples all jobs
// may hold on this node now (Config.MaxPositions).
func (r *Registry) MaxPositions() int64 {
	if r.cfg.MaxPositions > 0 {
		return r.cfg.MaxPositions
	}
	return max(MinPositions, PositionsPerFile*int64(r.cfg.Snapshot().Files))
}

// checkPositions refuses j if, with every other job, this node would hold
// more than MaxPositions sample positions and index samples.
func (r *Registry) checkPositions(j *Job) error {
	spec, limit := j.Spec, r.MaxPositions()
	indexes := map[*folder.Sample]bool{}
	cost := func(o *Job) int64 {
		p := Positions(o.Spec, o.N(), r.cfg.AllRanks)
		if o.N() > 0 && !indexes[&o.Samples[0]] {
			indexes[&o.Samples[0]] = true // an index shared by several jobs counts once
			p += int64(o.N())
		}
		return p
	}
	total := cost(j)
	r.mu.Lock()
	for name, o := range r.jobs {
		if name != spec.Name {
			total += cost(o)
		}
	}
	r.mu.Unlock()
	if total > limit {
		return fmt.Errorf("%w: job %s would make this node hold %d sample positions and index samples with the other jobs (%d samples, world=%d, lookahead=%d, sampler=%s), over the memory bound of %d (%d per file of SOURCE, at least %d); lower lookahead or end other jobs",
			ErrJob, spec.Name, total, j.N(), spec.World, spec.Lookahead, spec.Sampler, limit, PositionsPerFile, MinPositions)
	}
	return nil
}

// Reads calls fn(rank, i) for every read of sample i by any rank of a job
// with spec over n samples, in epochs from to from+count-1. It draws one
// permutation per epoch for all the ranks of a DistributedSampler;
// RandomSampler and SequentialSampler ranks each read every sample.
func Reads(spec control.Job, n, from, count int, fn func(rank, i int)) {
	for e := from; e < from+count; e++ {
		if spec.Sampler != "distributed" {
			for r := 0; r < spec.World; r++ {
				for i := 0; i < n; i++ {
					fn(r, i)
				}
			}
			continue
		}
		for pos, i := range Distributed(spec, n).Global(e) {
			fn(pos%spec.World, i)
		}
	}
}
