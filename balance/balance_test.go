package balance

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/dlfs/dlfs/sampler"
)

// TestBalance: Algorithm 1 evens any imbalance with at most p−1
// transfers, the largest surplus to the largest deficit first.
func TestBalance(t *testing.T) {
	for _, c := range []struct {
		imb  []int
		want []Transfer // nil: only the properties are checked
	}{
		{[]int{0, 0, 0}, []Transfer{}},
		{[]int{3, -3}, []Transfer{{0, 1, 3}}},
		{[]int{5, -2, -3}, []Transfer{{0, 2, 3}, {0, 1, 2}}},
		{[]int{4, 1, -2, -3}, []Transfer{{0, 3, 3}, {0, 2, 1}, {1, 2, 1}}},
		{[]int{2, 2, -2, -2}, []Transfer{{0, 2, 2}, {1, 3, 2}}},
		{[]int{-7, 1, 1, 1, 1, 1, 1, 1}, nil},
	} {
		got := Balance(c.imb)
		if c.want != nil && fmt.Sprint(got) != fmt.Sprint(c.want) && !(len(c.want) == 0 && len(got) == 0) {
			t.Errorf("Balance(%v) = %v, want %v", c.imb, got, c.want)
		}
		checkTransfers(t, c.imb, got)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 2000; trial++ {
		p := 2 + rng.IntN(64)
		imb := make([]int, p)
		for i := 0; i < 200; i++ {
			a, b := rng.IntN(p), rng.IntN(p)
			imb[a]++
			imb[b]--
		}
		checkTransfers(t, imb, Balance(imb))
	}
}

func checkTransfers(t *testing.T, imb []int, tr []Transfer) {
	t.Helper()
	left := slices.Clone(imb)
	for _, x := range tr {
		if x.Count <= 0 || imb[x.From] <= 0 || imb[x.To] >= 0 {
			t.Fatalf("%v: transfer %+v is not from a surplus to a deficit", imb, x)
		}
		left[x.From] -= x.Count
		left[x.To] += x.Count
	}
	for r, d := range left {
		if d != 0 {
			t.Fatalf("%v: rank %d left at %d after %v", imb, r, d, tr)
		}
	}
	if len(tr) > max(len(imb)-1, 0) {
		t.Fatalf("%v: %d transfers, more than p−1", imb, len(tr))
	}
}

// cluster is a test set-up: nodes nodes with ranksPer ranks each, and
// owner[s] the node caching sample s (or -1).
type cluster struct {
	rankNode []int
	owner    []int
}

func newCluster(nodes, ranksPer, samples int, cachedFrac float64, rng *rand.Rand) cluster {
	c := cluster{owner: make([]int, samples)}
	for n := 0; n < nodes; n++ {
		for k := 0; k < ranksPer; k++ {
			c.rankNode = append(c.rankNode, n)
		}
	}
	for s := range c.owner {
		c.owner[s] = -1
		if rng.Float64() < cachedFrac {
			c.owner[s] = rng.IntN(nodes)
		}
	}
	return c
}

func (c cluster) batch(gb []int) Batch {
	return Batch{Samples: gb, Owner: func(s int) int { return c.owner[s] }, RankNode: c.rankNode,
		Sizes: StockSizes(len(gb), len(c.rankNode))}
}

// checkPlan checks the invariant: the ranks' samples are the global batch
// as a multiset, each rank's in P's order, with the sizes wanted (nil:
// any).
func checkPlan(t *testing.T, b Batch, p Plan, sizes []int) {
	t.Helper()
	var all []int
	pos := positions(b.Samples)
	for r, got := range p.Ranks {
		if sizes != nil && len(got) != sizes[r] {
			t.Fatalf("rank %d has %d samples, want %d", r, len(got), sizes[r])
		}
		for i := 1; i < len(got); i++ {
			if pos[got[i-1]] > pos[got[i]] {
				t.Fatalf("rank %d's samples are not in P's order: %v", r, got)
			}
		}
		all = append(all, got...)
	}
	want := slices.Clone(b.Samples)
	sort.Ints(all)
	sort.Ints(want)
	if !slices.Equal(all, want) {
		t.Fatalf("the ranks' samples are not the global batch")
	}
}

// TestLocality: over torch's own permutations, every global batch is kept
// exactly, every rank's batch has its stock size, Algorithm 1 sends at
// most W−1 transfers, and more reads are local than in the stock order.
func TestLocality(t *testing.T) {
	for _, c := range []struct {
		nodes, ranksPer, batch int
		cached                 float64
		dropLast               bool
	}{
		{3, 1, 32, 1, false},
		{4, 2, 16, 1, false},
		{3, 1, 8, 0.5, false},
		{5, 3, 7, 0.8, true},
		{1, 4, 10, 1, false},
	} {
		t.Run(fmt.Sprintf("%d×%d b%d c%.1f", c.nodes, c.ranksPer, c.batch, c.cached), func(t *testing.T) {
			const n = 1003
			rng := rand.New(rand.NewPCG(uint64(c.nodes), uint64(c.batch)))
			cl := newCluster(c.nodes, c.ranksPer, n, c.cached, rng)
			world := c.nodes * c.ranksPer
			d := sampler.Distributed{N: n, World: world, Shuffle: true, Seed: 7, DropLast: c.dropLast}
			var local, stockLocal, total int
			for _, gb := range GlobalBatches(d.Global(3), c.batch, world) {
				b := cl.batch(gb)
				p := Locality(b)
				checkPlan(t, b, p, b.Sizes)
				if len(p.Transfers) > world-1 {
					t.Fatalf("%d transfers for %d ranks", len(p.Transfers), world)
				}
				if want := Imbalance(b) * float64(len(gb)); float64(p.Moved) != want {
					t.Fatalf("moved %d samples; the imbalance says %.0f", p.Moved, want)
				}
				for r, ss := range p.Ranks {
					for _, s := range ss {
						if b.cost(s, r) == CostLocal {
							local++
						}
					}
				}
				for i, s := range gb {
					if b.cost(s, i%world) == CostLocal {
						stockLocal++
					}
				}
				total += len(gb)
			}
			t.Logf("local reads: %.1f%% planned, %.1f%% stock", 100*float64(local)/float64(total), 100*float64(stockLocal)/float64(total))
			if c.nodes > 1 && local <= stockLocal {
				t.Errorf("the plan reads %d samples locally, no more than the stock order's %d", local, stockLocal)
			}
		})
	}
}

// TestLocalityMovesTheCheapest: a transfer moves the samples the receiver
// reads most cheaply: one its own node caches before one that must come
// from a peer.
func TestLocalityMovesTheCheapest(t *testing.T) {
	// Ranks 0 and 1 on node 0, rank 2 on node 1. Samples 0–4 are node 0's,
	// 5 is node 1's, so node 0's ranks hold 5 samples for 4 places and
	// rank 2 holds 1 for 2.
	owner := []int{0, 0, 0, 0, 0, 1}
	b := Batch{Samples: []int{0, 1, 2, 3, 4, 5}, Owner: func(s int) int { return owner[s] },
		RankNode: []int{0, 0, 1}, Sizes: []int{2, 2, 2}}
	p := Locality(b)
	checkPlan(t, b, p, b.Sizes)
	if p.Moved != 1 || len(p.Transfers) != 1 || p.Transfers[0] != (Transfer{0, 2, 1}) {
		t.Errorf("transfers %v, moved %d; want one sample from rank 0 to rank 2", p.Transfers, p.Moved)
	}
	// Rank 2's node also holds sample 4 on its SSD (it owned it before):
	// the transfer from rank 0 (holding 0, 2, 4) to rank 2 takes sample 4,
	// though sample 0 comes first in P.
	inner := b
	inner.Cost = nil
	b.Cost = func(s, r int) int {
		if s == 4 && r == 2 {
			return CostLocal
		}
		return inner.cost(s, r)
	}
	p = Locality(b)
	checkPlan(t, b, p, b.Sizes)
	if !slices.Equal(p.Ranks[2], []int{4, 5}) {
		t.Errorf("rank 2 got %v, want [4 5]: sample 4, which its own node holds", p.Ranks[2])
	}
}

// TestImbalanceAsThePaper: with the dataset spread evenly at random over
// p nodes of one rank each, the median imbalance per global batch is about
// Yang & Cong's 6.9% / 4.8% / 3.4% for local batches of 32 / 64 / 128.
func TestImbalanceAsThePaper(t *testing.T) {
	want := map[int]float64{32: 6.9, 64: 4.8, 128: 3.4}
	for _, p := range []int{16, 64} {
		for _, lb := range []int{32, 64, 128} {
			rng := rand.New(rand.NewPCG(uint64(p), uint64(lb)))
			const n = 200_000
			cl := newCluster(p, 1, n, 1, rng)
			perm := sampler.Randperm(n, sampler.NewMT19937(uint64(p*lb)), sampler.Torch1)
			var imb []float64
			for _, gb := range GlobalBatches(perm, lb, p) {
				if len(gb) == lb*p {
					imb = append(imb, 100*Imbalance(cl.batch(gb)))
				}
			}
			sort.Float64s(imb)
			med := imb[len(imb)/2]
			t.Logf("p=%d local batch %d: median imbalance %.2f%% over %d batches (paper: %.1f%%)", p, lb, med, len(imb), want[lb])
			if med < want[lb]-0.7 || med > want[lb]+0.7 {
				t.Errorf("p=%d local batch %d: median imbalance %.2f%%, want %.1f ± 0.7", p, lb, med, want[lb])
			}
		}
	}
}

// TestSolar: every cached sample stays with its node's ranks, the samples
// from outside are dealt evenly (counts within one), and the global batch
// is kept.
func TestSolar(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	cl := newCluster(4, 2, 2000, 0.5, rng)
	perm := sampler.Randperm(2000, sampler.NewMT19937(5), sampler.Torch1)
	for _, gb := range GlobalBatches(perm, 32, 8) {
		b := cl.batch(gb)
		p := Solar(b)
		checkPlan(t, b, p, nil)
		outside := make([]int, len(p.Ranks))
		for r, ss := range p.Ranks {
			for _, s := range ss {
				switch b.cost(s, r) {
				case CostPeer:
					t.Fatalf("rank %d reads sample %d from a peer: a cached sample left its node", r, s)
				case CostPFS:
					outside[r]++
				}
			}
		}
		if slices.Max(outside)-slices.Min(outside) > 1 {
			t.Fatalf("outside reads per rank %v: not balanced", outside)
		}
	}
	// Node 0 caches the whole batch: rank 1, on node 1, still gets a sample.
	b := Batch{Samples: []int{4, 5, 6, 7}, Owner: func(int) int { return 0 }, RankNode: []int{0, 1}, Sizes: []int{2, 2}}
	p := Solar(b)
	checkPlan(t, b, p, nil)
	if !slices.Equal(p.Ranks[0], []int{4, 5, 6}) || !slices.Equal(p.Ranks[1], []int{7}) {
		t.Errorf("solar with one node caching all: %v, want [[4 5 6] [7]]", p.Ranks)
	}
}

// TestEpochOrder: the order is a permutation of the epochs starting with
// the first, reuses at least as much as the identity, and finds the one
// order that chains three permutations built to follow each other.
func TestEpochOrder(t *testing.T) {
	const n = 1000
	var perms [][]int
	for e := 0; e < 6; e++ {
		perms = append(perms, sampler.Randperm(n, sampler.NewMT19937(uint64(e)), sampler.Torch1))
	}
	order := EpochOrder(perms, n/4)
	if order[0] != 0 || !slices.Equal(slices.Sorted(slices.Values(order)), []int{0, 1, 2, 3, 4, 5}) {
		t.Fatalf("order %v", order)
	}
	r := Reuse(perms, n/4)
	if TourReuse(r, order) < TourReuse(r, []int{0, 1, 2, 3, 4, 5}) {
		t.Errorf("order %v reuses %d, less than the identity's %d", order, TourReuse(r, order), TourReuse(r, []int{0, 1, 2, 3, 4, 5}))
	}
	seq := func(from int) []int {
		p := make([]int, 8)
		for i := range p {
			p[i] = (from + i) % 8
		}
		return p
	}
	// a ends with 6 7, which c starts with; c ends with 2 3, which b
	// starts with: 0, 2, 1 reuses 4, 0, 1, 2 reuses 0.
	a := seq(0)
	b := []int{2, 3, 4, 5, 6, 7, 0, 1}
	c := []int{6, 7, 0, 1, 4, 5, 2, 3}
	if got := EpochOrder([][]int{a, b, c}, 2); !slices.Equal(got, []int{0, 2, 1}) {
		t.Errorf("EpochOrder = %v, want [0 2 1]", got)
	}
	if got := EpochOrder(perms, n); !slices.Equal(got, []int{0, 1, 2, 3, 4, 5}) {
		t.Errorf("caches holding everything: %v, want the identity", got)
	}
}
