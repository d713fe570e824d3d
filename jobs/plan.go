package jobs

import (
	"github.com/dlfs/dlfs/balance"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/sampler"
)

// This file turns a job's spec into what its ranks read: one function
// for a rank's order, one for an epoch's balanced plan. The registry's
// plans, inference (package readers) and the simulator all call them, so
// that they draw the same orders.

// Distributed is the DistributedSampler of a job with spec over n samples,
// for rank 0 (set Rank for another).
func Distributed(spec control.Job, n int) sampler.Distributed {
	return sampler.Distributed{N: n, World: spec.World, Shuffle: spec.Shuffle, Seed: spec.Seed, DropLast: spec.DropLast, Version: version(spec)}
}

func version(s control.Job) sampler.Version {
	if s.Torch27 {
		return sampler.Torch27
	}
	return sampler.Torch1
}

// ReadOrder returns the sample indices rank of a job with spec over n
// samples reads in epoch, in order, as its sampler draws them in torch.
// Under balance= the order is the epoch's plan's instead (BalancedPlan).
func ReadOrder(spec control.Job, n, rank, epoch int) []int {
	switch spec.Sampler {
	case "distributed":
		d := Distributed(spec, n)
		d.Rank = rank
		return d.Epoch(epoch)
	case "random":
		return sampler.Random{N: n, Seed: spec.Seed, Version: version(spec)}.Epoch(epoch)
	}
	return sampler.Sequential(n)
}

// Balanced is an epoch's plan under balance=: every rank's samples in
// read order, and the size of each of its batches.
type Balanced struct {
	Orders  [][]int32 // by rank
	Batches [][]int   // by rank
}

// BalancedPlan plans an epoch of a job with spec over n samples under
// balance=: the DistributedSampler's permutation of epoch perm, in global
// batches of spec.Batch·spec.World samples, each given to the ranks by
// balance.Locality, or balance.Solar for balance=solar. Rank r runs on
// node rankNode[r] and owner(i) is the node that caches sample i (−1:
// none). each, if not nil, is called with every global batch and its plan
// in order, for figures; an error from it stops the plan and is returned.
func BalancedPlan(spec control.Job, n, perm int, rankNode []int, owner func(int) int, each func(balance.Batch, balance.Plan) error) (Balanced, error) {
	out := Balanced{Orders: make([][]int32, spec.World), Batches: make([][]int, spec.World)}
	for _, gb := range balance.GlobalBatches(Distributed(spec, n).Global(perm), spec.Batch, spec.World) {
		b := balance.Batch{Samples: gb, Owner: owner, RankNode: rankNode, Sizes: balance.StockSizes(len(gb), spec.World)}
		var plan balance.Plan
		if spec.Balance == "solar" {
			plan = balance.Solar(b)
		} else {
			plan = balance.Locality(b)
		}
		for r, ss := range plan.Ranks {
			for _, s := range ss {
				out.Orders[r] = append(out.Orders[r], int32(s))
			}
			out.Batches[r] = append(out.Batches[r], len(ss))
		}
		if each != nil {
			if err := each(b, plan); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}
