package readers

import (
	"context"
	"testing"

	"github.com/dlfs/dlfs/sampler"
)

// loaderReads is the order in which a DataLoader with workers and batch
// size batch asks for a rank's first k samples: batch b goes to worker
// b mod workers, and a round of workers batches is read side by side.
func loaderReads(order []int, workers, batch, k int) []int {
	var out []int
	round := workers * batch
	for start := 0; start < len(order) && len(out) < k; start += round {
		for i := 0; i < batch; i++ {
			for w := 0; w < workers && len(out) < k; w++ {
				if j := start + w*batch + i; j < len(order) && j < start+round {
					out = append(out, order[j])
				}
			}
		}
	}
	return out
}

func TestSearchDistributed(t *testing.T) {
	for _, c := range []struct {
		n, world, rank    int
		seed, epoch       uint64
		workers, batch, k int
	}{
		{5000, 1, 0, 0, 0, 4, 32, 16},       // the default seed, one rank
		{5000, 4, 3, 0, 2, 4, 32, 16},       // epoch 2
		{3000, 8, 5, 17, 1, 2, 64, 16},      // a small seed
		{200000, 16, 9, 0, 0, 4, 32, 16},    // a large index
		{200000, 1024, 700, 3, 0, 2, 8, 16}, // the largest world
	} {
		d := sampler.Distributed{N: c.n, World: c.world, Rank: c.rank, Shuffle: true, Seed: c.seed}
		xs := loaderReads(d.Epoch(int(c.epoch)), c.workers, c.batch, c.k)
		g, ok := searchDistributed(context.Background(), xs, c.n, 2, 64)
		if want := (Guess{Seed: c.seed + c.epoch, World: c.world, Rank: c.rank}); !ok || g != want {
			t.Errorf("%+v: %+v %v, want %+v", c, g, ok, want)
		}
	}
}

// TestSearchNoFit: reads no seeded sampler makes find nothing, and a
// cancelled search stops.
func TestSearchNoFit(t *testing.T) {
	xs := make([]int, SearchReads)
	for i := range xs {
		xs[i] = (i*7919 + 13) % 3000
	}
	if g, ok := searchDistributed(context.Background(), xs, 3000, 2, 512); ok {
		t.Errorf("a guess %+v for reads no sampler made", g)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok := searchDistributed(ctx, xs, 3000, 2, MaxSeed); ok {
		t.Error("a cancelled search found something")
	}
}
