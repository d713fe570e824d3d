package jobs

import (
	"fmt"
	"maps"
	"math"
	"sort"

	"github.com/dlfs/dlfs/balance"
)

// Plans under balance=: one per epoch for every rank, made from the
// cluster's layout and pinned once a local rank is in the epoch.

// Layout is where a job's ranks run and its samples are cached.
type Layout struct {
	RankNode []int                // the node of each rank (World of them); -1: unknown
	Owner    func(sample int) int // the node caching sample i (an index of Samples); -1: none
	Cached   int                  // samples the cluster's caches hold, for epochorder
	// ID identifies the layout by content: nodes that see the same
	// placement, ranks and capacity compute the same ID, and a plan made
	// under another ID is made again until it is pinned.
	ID uint64
}

// complete reports whether every rank's node is known.
func (l Layout) complete() bool {
	for _, n := range l.RankNode {
		if n < 0 {
			return false
		}
	}
	return true
}

// balancedEpoch is one epoch's plan under balance=: every rank's samples in
// read order, and its batch sizes.
type balancedEpoch struct {
	id      uint64 // of the layout it was made from
	pinned  bool   // kept whatever the layout does from now on
	orders  [][]int32
	batches [][]int
	stats   PlanStats
}

// PlanStats describe one epoch's plan under balance=.
type PlanStats struct {
	// Layout is the layout's ID (hex): every node that planned the
	// epoch from the same placement shows the same.
	Layout string `json:"layout"`
	// Pinned: the plan no longer changes with the layout (a local rank
	// is in the epoch and every rank's node was known).
	Pinned bool `json:"pinned"`
	// Reads counts the planned reads; Local those whose sample the
	// reader's own node caches, PFS those no node caches.
	Reads int64 `json:"reads"`
	Local int64 `json:"local"`
	PFS   int64 `json:"pfs"`
	// Moved counts the samples Algorithm 1 moved off their node.
	Moved int64 `json:"moved"`
	// ImbalanceMedian and ImbalanceP90 are percentiles, over the global
	// batches, of the share of the batch that balancing had to move
	// (balance.Imbalance, Yang & Cong's measure), in percent.
	ImbalanceMedian float64 `json:"imbalance_median"`
	ImbalanceP90    float64 `json:"imbalance_p90"`
	// MinBatch and MaxBatch are the range of every rank's batch sizes
	// (equal to batch= except the last, unless balance=solar).
	MinBatch int `json:"min_batch"`
	MaxBatch int `json:"max_batch"`
}

// balancedLocked returns epoch's plan under balance=. A plan is made from
// the layout of the moment and made again when the layout's ID changes,
// until it is pinned: from the time a local rank is in the epoch and every
// rank's node is known, the plan stays as it is for the rest of the epoch
// (membership changes apply from the next epoch; a sample whose owner died
// is read from wherever it is). Plans of epochs no local rank plans any
// more are dropped.
func (j *Job) balancedLocked(epoch int) *balancedEpoch {
	p := j.balanced[epoch]
	if p != nil && p.pinned {
		return p
	}
	var lay Layout
	if j.layout != nil {
		lay = j.layout(j)
	}
	if lay.RankNode == nil {
		lay.RankNode = make([]int, j.Spec.World) // one node, caching all
		lay.Owner = func(int) int { return 0 }
		lay.Cached = j.N()
	}
	if p == nil || p.id != lay.ID {
		p = j.makeBalanced(epoch, lay)
	}
	p.pinned = lay.complete() && j.current(epoch)
	p.stats.Pinned = p.pinned
	if j.balanced == nil {
		j.balanced = map[int]*balancedEpoch{}
	}
	for e := range j.balanced {
		if !j.plannedByAny(e) {
			delete(j.balanced, e)
		}
	}
	j.balanced[epoch] = p
	j.statsMu.Lock()
	j.planStats = map[int]PlanStats{}
	for e, p := range j.balanced {
		j.planStats[e] = p.stats
	}
	j.statsMu.Unlock()
	return p
}

// PlanStats returns the figures of the plans made so far under balance=,
// by epoch, without making any.
func (j *Job) PlanStats() map[int]PlanStats {
	j.statsMu.Lock()
	defer j.statsMu.Unlock()
	return maps.Clone(j.planStats)
}

// makeBalanced plans epoch under lay.
func (j *Job) makeBalanced(epoch int, lay Layout) *balancedEpoch {
	p := &balancedEpoch{id: lay.ID}
	p.stats.Layout = fmt.Sprintf("%016x", lay.ID)
	p.stats.MinBatch = math.MaxInt
	var imb []float64
	plan, _ := BalancedPlan(j.Spec, j.N(), j.permutationLocked(epoch, lay.Cached), lay.RankNode, lay.Owner, func(b balance.Batch, plan balance.Plan) error {
		if j.Spec.Balance == "solar" {
			imb = append(imb, balance.Imbalance(b))
		} else {
			imb = append(imb, float64(plan.Moved)/float64(len(b.Samples))) // balance.Imbalance, without a second pass
		}
		p.stats.Moved += int64(plan.Moved)
		for r, ss := range plan.Ranks {
			p.stats.MinBatch = min(p.stats.MinBatch, len(ss))
			p.stats.MaxBatch = max(p.stats.MaxBatch, len(ss))
			for _, s := range ss {
				p.stats.Reads++
				switch o := lay.Owner(s); {
				case o < 0:
					p.stats.PFS++
				case o == lay.RankNode[r]:
					p.stats.Local++
				}
			}
		}
		return nil
	})
	p.orders, p.batches = plan.Orders, plan.Batches
	if p.stats.MinBatch == math.MaxInt {
		p.stats.MinBatch = 0
	}
	sort.Float64s(imb)
	p.stats.ImbalanceMedian = 100 * quantile(imb, 0.5)
	p.stats.ImbalanceP90 = 100 * quantile(imb, 0.9)
	return p
}

// quantile of sorted xs (nearest rank); 0 for none.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return xs[min(int(q*float64(len(xs))), len(xs)-1)]
}

// Plan describes epoch's plan under balance= (made if it was not); ok is
// false for a job without balance=.
func (j *Job) Plan(epoch int) (st PlanStats, ok bool) {
	if j.Spec.Balance == "" {
		return PlanStats{}, false
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.balancedLocked(epoch).stats, true
}

// PlanID is the layout ID epoch's plan was made from (0 without
// balance=): a prefetch stream follows a plan while it stays the same.
func (j *Job) PlanID(epoch int) uint64 {
	if j.Spec.Balance == "" {
		return 0
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.balancedLocked(epoch).id
}

// keepPinned takes prev's pinned plans and epoch orders (an update of the
// job must not change an epoch's plan under a rank still in it).
func (j *Job) keepPinned(prev *Job) {
	prev.mu.Lock()
	defer prev.mu.Unlock()
	for e, p := range prev.balanced {
		if p.pinned && j.plannedByAny(e) {
			if j.balanced == nil {
				j.balanced = map[int]*balancedEpoch{}
			}
			j.balanced[e] = p
		}
	}
	j.blocks = prev.blocks
}
