// Package balance plans which rank trains on which sample of a global
// mini-batch, so that reads go to the data instead of the data to the
// reads (Yang & Cong, "Accelerating data loading in deep neural network
// training", §V; SOLAR §4).
//
// # The invariant
//
// A DistributedSampler job with world W and per-rank batch B splits an
// epoch's permutation P into global batches of B·W samples. Stock rank r
// trains on P[r::W], so its batch k holds B samples of global batch k. A
// plan may give a global batch's samples to other ranks, as long as, for
// every k, the union over ranks of their batch k is exactly global batch k
// (as a multiset): the same global batch gives the same gradients
// (Theorem 1), so training is unchanged. Locality keeps every rank's batch
// size as stock; Solar does not, and says so.
//
// # Locality
//
// Each sample goes first to a rank on the node that caches it (the
// placement owner), the ranks of a node taking that node's samples in
// turn. The local batches are then uneven; Algorithm 1 (Balance) moves the
// surplus to the deficits with at most p−1 transfers for p ranks, a
// 2-approximation of the fewest. The samples a transfer moves are those
// cheapest for the receiver (its own node's caches before a peer's, a
// peer's before the PFS). Samples no node caches fill deficits first.
//
// # Solar
//
// SOLAR balances loads rather than batch sizes: every sample a node caches
// stays with that node's ranks, and the samples that must come from
// outside every rank's node (the PFS) are dealt so that each rank fetches
// about as many. Batch sizes then differ.
//
// # Epoch order
//
// When the caches hold less than the dataset, consecutive epochs reuse
// what the caches hold at an epoch's end. EpochOrder chooses which of a
// job's planned permutations each epoch uses to maximise that reuse
// (a greedy tour improved by 2-opt; SOLAR §4.2 uses PSO).
//
// Everything here is pure and deterministic: every node computes the same
// plan from the same inputs.
package balance

import (
	"container/heap"
	"sort"
)

// Transfer is one move of Algorithm 1: Count samples from rank From to
// rank To.
type Transfer struct{ From, To, Count int }

// Balance is Algorithm 1: given each rank's imbalance (its samples less
// its batch size; the imbalances sum to 0), it returns the transfers that
// even them out, the largest surplus to the largest deficit first. There
// are at most p−1 of them for p ranks. Ties go to the lower rank.
func Balance(imbalance []int) []Transfer {
	var surplus, deficit rankHeap
	for r, d := range imbalance {
		switch {
		case d > 0:
			surplus = append(surplus, rankImb{r, d})
		case d < 0:
			deficit = append(deficit, rankImb{r, -d})
		}
	}
	heap.Init(&surplus)
	heap.Init(&deficit)
	var out []Transfer
	for surplus.Len() > 0 && deficit.Len() > 0 {
		s, d := &surplus[0], &deficit[0]
		m := min(s.imb, d.imb)
		out = append(out, Transfer{From: s.rank, To: d.rank, Count: m})
		s.imb -= m
		d.imb -= m
		if s.imb == 0 {
			heap.Pop(&surplus)
		} else {
			heap.Fix(&surplus, 0)
		}
		if d.imb == 0 {
			heap.Pop(&deficit)
		} else {
			heap.Fix(&deficit, 0)
		}
	}
	return out
}

type rankImb struct{ rank, imb int }

// rankHeap is a max-heap by imbalance, ties to the lower rank.
type rankHeap []rankImb

func (h rankHeap) Len() int { return len(h) }
func (h rankHeap) Less(i, j int) bool {
	if h[i].imb != h[j].imb {
		return h[i].imb > h[j].imb
	}
	return h[i].rank < h[j].rank
}
func (h rankHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *rankHeap) Push(x any)   { *h = append(*h, x.(rankImb)) }
func (h *rankHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Cost of reading a sample, for a rank: where it lies seen from the
// rank's node.
const (
	CostLocal = 0 // the rank's own node caches it
	CostPeer  = 1 // another node caches it
	CostPFS   = 2 // no node caches it
)

// Batch is one global mini-batch to plan.
type Batch struct {
	// Samples are the global batch's sample indices, in P's order.
	Samples []int
	// Owner gives the node that caches a sample, or -1 for none.
	Owner func(sample int) int
	// RankNode is the node each rank runs on.
	RankNode []int
	// Sizes is each rank's stock batch size in this global batch; they
	// sum to len(Samples).
	Sizes []int
	// Cost, if set, says how dear sample s is for rank r to read (lower
	// is cheaper; a node's SSD may hold a sample it does not own). nil:
	// CostLocal, CostPeer or CostPFS by Owner.
	Cost func(s, r int) int
}

// Plan is a global batch's assignment: Ranks[r] are rank r's samples, in
// P's order.
type Plan struct {
	Ranks [][]int
	// Transfers are Algorithm 1's moves (Locality only).
	Transfers []Transfer
	// Moved counts the samples the transfers moved: Imbalance times the
	// batch's size.
	Moved int
}

// cost is how dear sample s is for rank r.
func (b Batch) cost(s, r int) int {
	if b.Cost != nil {
		return b.Cost(s, r)
	}
	switch o := b.Owner(s); {
	case o < 0:
		return CostPFS
	case o == b.RankNode[r]:
		return CostLocal
	default:
		return CostPeer
	}
}

// firstPass gives each owned sample to a rank of its owner's node, the
// node's ranks in turn, and returns the unowned samples (and those whose
// owner runs no rank), in P's order.
func (b Batch) firstPass() (ranks [][]int, free []int) {
	byNode := map[int][]int{} // node -> its ranks, ascending
	for r, n := range b.RankNode {
		byNode[n] = append(byNode[n], r)
	}
	turn := map[int]int{}
	ranks = make([][]int, len(b.RankNode))
	for _, s := range b.Samples {
		n := b.Owner(s)
		rs := byNode[n]
		if n < 0 || len(rs) == 0 { // cached nowhere, or where no rank runs
			free = append(free, s)
			continue
		}
		r := rs[turn[n]%len(rs)]
		turn[n]++
		ranks[r] = append(ranks[r], s)
	}
	return ranks, free
}

// Locality plans b: each sample to a rank on its node, then the local
// batches evened to their stock sizes by Algorithm 1.
func Locality(b Batch) Plan {
	pos := positions(b.Samples)
	ranks, free := b.firstPass()
	// Samples no rank's node caches fill the deficits first, in rank
	// order: whoever reads them reads the PFS.
	for r := range ranks {
		for len(ranks[r]) < b.Sizes[r] && len(free) > 0 {
			ranks[r], free = append(ranks[r], free[0]), free[1:]
		}
	}
	imb := make([]int, len(ranks))
	for r := range ranks {
		imb[r] = len(ranks[r]) - b.Sizes[r]
	}
	p := Plan{Ranks: ranks, Transfers: Balance(imb)}
	for _, t := range p.Transfers {
		// Move the samples cheapest for the receiver, the earliest in P
		// first among equals.
		from := ranks[t.From]
		idx := make([]int, len(from))
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(i, j int) bool {
			ci, cj := b.cost(from[idx[i]], t.To), b.cost(from[idx[j]], t.To)
			if ci != cj {
				return ci < cj
			}
			return pos[from[idx[i]]] < pos[from[idx[j]]]
		})
		take := map[int]bool{}
		for _, i := range idx[:t.Count] {
			take[i] = true
		}
		keep := from[:0:0]
		for i, s := range from {
			if take[i] {
				ranks[t.To] = append(ranks[t.To], s)
			} else {
				keep = append(keep, s)
			}
		}
		ranks[t.From] = keep
		p.Moved += t.Count
	}
	for r := range ranks {
		sortByPos(ranks[r], pos)
	}
	return p
}

// Solar plans b to balance loads: each sample a node caches goes to a rank
// of that node, and the samples no rank's node caches are dealt so that
// every rank reads about as many from outside its node; each goes to the
// rank with the fewest so far, then the fewest samples, then the lowest.
// Batch sizes differ from stock, but none is empty while the batch has a
// sample for every rank.
func Solar(b Batch) Plan {
	pos := positions(b.Samples)
	ranks, free := b.firstPass()
	outside := make([]int, len(ranks))
	for _, s := range free {
		best := 0
		for r := 1; r < len(ranks); r++ {
			if outside[r] < outside[best] || outside[r] == outside[best] && len(ranks[r]) < len(ranks[best]) {
				best = r
			}
		}
		ranks[best] = append(ranks[best], s)
		outside[best]++
	}
	for r := range ranks {
		sortByPos(ranks[r], pos)
	}
	// No rank trains on an empty batch (a DataLoader cannot collate one):
	// one left empty takes the last sample of the largest.
	for r := range ranks {
		if len(ranks[r]) > 0 {
			continue
		}
		big := 0
		for q := range ranks {
			if len(ranks[q]) > len(ranks[big]) {
				big = q
			}
		}
		if len(ranks[big]) < 2 {
			break // fewer samples than ranks
		}
		last := len(ranks[big]) - 1
		ranks[r], ranks[big] = []int{ranks[big][last]}, ranks[big][:last]
	}
	return Plan{Ranks: ranks}
}

func positions(samples []int) map[int]int {
	pos := make(map[int]int, len(samples))
	for i, s := range samples {
		if _, ok := pos[s]; !ok {
			pos[s] = i // a padded repeat sorts with its first
		}
	}
	return pos
}

func sortByPos(s []int, pos map[int]int) {
	sort.SliceStable(s, func(i, j int) bool { return pos[s[i]] < pos[s[j]] })
}

// Imbalance is the share of a global batch that balancing must move:
// the sum of the ranks' surpluses after each sample went to a rank of its
// owner's node, over the batch's size (Yang & Cong's measure, Fig. 6: with
// every sample cached it equals the sum of the deficits). Samples no
// rank's node caches fill deficits without a move: they are read from the
// PFS whoever reads them.
func Imbalance(b Batch) float64 {
	if len(b.Samples) == 0 {
		return 0
	}
	ranks, _ := b.firstPass()
	surplus := 0
	for r := range ranks {
		surplus += max(len(ranks[r])-b.Sizes[r], 0)
	}
	return float64(surplus) / float64(len(b.Samples))
}

// GlobalBatches splits an epoch's permutation (padded as torch pads it)
// into global batches of batch·world samples, the last one shorter.
func GlobalBatches(perm []int, batch, world int) [][]int {
	size := batch * world
	var out [][]int
	for i := 0; i < len(perm); i += size {
		out = append(out, perm[i:min(i+size, len(perm))])
	}
	return out
}

// StockSizes is how many of a global batch of n samples each of world
// ranks trains on in the stock order: rank r takes positions r, r+world, …
func StockSizes(n, world int) []int {
	s := make([]int, world)
	for r := range s {
		if r < n {
			s[r] = (n - r + world - 1) / world
		}
	}
	return s
}
