package simulator

import (
	"context"
	"math"
	"testing"
)

// TestPaperFigures: on 16 and 64 nodes the imbalance medians are Yang &
// Cong's (6.9%, 4.8%, 3.4% for local batches 32, 64, 128, within 0.7
// points), the stock order sends (p−1)/p of the reads over the network
// and the locality plan less than 8%, with at most p−1 transfers per
// global batch.
func TestPaperFigures(t *testing.T) {
	res, err := Simulate(context.Background(), Config{Nodes: []int{16, 64}, Batches: []int{32, 64, 128}, Samples: 300000, Epochs: 1})
	if err != nil {
		t.Fatal(err)
	}
	paper := map[int]float64{32: 6.9, 64: 4.8, 128: 3.4}
	for _, r := range res.Runs {
		t.Logf("p=%d B=%d: imbalance %+v, network %+v, %d transfers at most", r.Nodes, r.Batch, r.ImbalancePct, r.Network, r.MaxTrans)
		if math.Abs(r.ImbalancePct.Median-paper[r.Batch]) > 0.7 {
			t.Errorf("p=%d B=%d: median imbalance %.2f%%, paper %.1f%%", r.Nodes, r.Batch, r.ImbalancePct.Median, paper[r.Batch])
		}
		if want := float64(r.Nodes-1) / float64(r.Nodes); math.Abs(r.Network.Stock-want) > 0.01 {
			t.Errorf("p=%d: stock network fraction %.3f, want (p-1)/p = %.3f", r.Nodes, r.Network.Stock, want)
		}
		if r.Batch == 64 && r.Network.Locality > 0.08 {
			t.Errorf("p=%d B=64: locality network fraction %.3f, want at most 0.08", r.Nodes, r.Network.Locality)
		}
		if r.MaxTrans > r.Ranks-1 {
			t.Errorf("p=%d: %d transfers in one global batch, Algorithm 1 allows %d", r.Nodes, r.MaxTrans, r.Ranks-1)
		}
		if r.Time.Locality > r.Time.Distributed || r.Time.Training <= 0 {
			t.Errorf("p=%d: epoch times %+v: the locality plan is slower than distributed caching", r.Nodes, r.Time)
		}
	}
}

// TestPartialCache: with caches for half the dataset, a fixed subset
// leaves half the reads to the PFS, and SOLAR's epoch order reads the PFS
// no more than the sampler's order (the first epoch reads everything).
func TestPartialCache(t *testing.T) {
	res, err := Simulate(context.Background(), Config{Nodes: []int{4}, Batches: []int{32}, Samples: 20000, Epochs: 6, Alpha: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	var stock, solar int64
	for _, e := range res.PFS {
		t.Logf("%+v", e)
		stock += e.Stock
		solar += e.EpochOrder
		if e.Static < 9000 || e.Static > 11000 {
			t.Errorf("epoch %d: %d samples uncached of 20000 at alpha 0.5", e.Epoch, e.Static)
		}
	}
	if res.PFS[0].Stock != 20000 || res.PFS[0].EpochOrder != 20000 || res.PFS[0].Uses != 0 {
		t.Errorf("epoch 0: %+v, want every sample from the PFS, permutation 0", res.PFS[0])
	}
	if solar > stock {
		t.Errorf("epoch order reads %d samples from the PFS, the sampler's order %d", solar, stock)
	}
	// Uncached samples are read from the PFS in either order: neither
	// counts them as network reads.
	if r := res.Runs[0]; r.Network.Stock > 0.5*0.75+0.02 || r.Network.Stock < 0.5*0.75-0.02 {
		t.Errorf("stock network fraction %.3f at alpha 0.5 on 4 nodes, want about 0.375", r.Network.Stock)
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []Config{
		{Nodes: []int{0}}, {Nodes: []int{MaxNodes + 1}}, {Batches: []int{0}}, {Samples: -1},
		{Epochs: 65}, {Alpha: 1.5}, {Alpha: -0.1}, {RanksPerNode: 65}, {PFSRate: -1},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: accepted", c)
		}
	}
	if _, err := Simulate(context.Background(), Config{Nodes: []int{2}, Samples: 1, Batches: []int{1}}); err != nil {
		t.Errorf("one sample on two nodes: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Simulate(ctx, Config{Nodes: []int{4}, Samples: 1000}); err == nil {
		t.Error("a cancelled simulation succeeded")
	}
}

// TestRanksPerNode: the ranks of one node share its cache, so Algorithm 1
// balances nodes, not ranks. With r ranks per node and a local batch b,
// the imbalance is that of one rank per node with a local batch r·b (the
// paper's figures for 64 and 128), the stock order still sends (p−1)/p of
// the reads over the network, and a global batch is b·r·p samples.
func TestRanksPerNode(t *testing.T) {
	res, err := Simulate(context.Background(), Config{Nodes: []int{16}, RanksPerNode: 2, Batches: []int{32, 64}, Samples: 300000, Epochs: 1})
	if err != nil {
		t.Fatal(err)
	}
	paper := map[int]float64{32: 4.8, 64: 3.4} // the paper's medians for local batches 64 and 128
	for _, r := range res.Runs {
		t.Logf("p=%d ranks=%d B=%d: imbalance %+v, network %+v, %d transfers at most", r.Nodes, r.Ranks, r.Batch, r.ImbalancePct, r.Network, r.MaxTrans)
		if r.Ranks != 32 || r.GlobalBatch != 32*r.Batch {
			t.Errorf("B=%d: %d ranks, global batch %d; want 32 ranks, %d", r.Batch, r.Ranks, r.GlobalBatch, 32*r.Batch)
		}
		if want := (300000 + r.GlobalBatch - 1) / r.GlobalBatch; r.Steps < want-1 || r.Steps > want {
			t.Errorf("B=%d: %d global batches in an epoch of 300000 samples, want about %d", r.Batch, r.Steps, want)
		}
		if math.Abs(r.ImbalancePct.Median-paper[r.Batch]) > 0.7 {
			t.Errorf("B=%d on 2 ranks per node: median imbalance %.2f%%, want about the paper's %.1f%% for one rank with B=%d",
				r.Batch, r.ImbalancePct.Median, paper[r.Batch], 2*r.Batch)
		}
		if math.Abs(r.Network.Stock-15.0/16) > 0.01 {
			t.Errorf("B=%d: stock network fraction %.3f, want (p-1)/p = %.3f", r.Batch, r.Network.Stock, 15.0/16)
		}
		if r.Network.Locality > 0.08 || r.MaxTrans > r.Ranks-1 {
			t.Errorf("B=%d: locality network fraction %.3f (want at most 0.08), %d transfers in a batch", r.Batch, r.Network.Locality, r.MaxTrans)
		}
	}
	// Ranks of one node are contiguous (rank k on node k / r, as torchrun
	// numbers them): on 2 nodes of 3 ranks, a rank placed on a node that
	// does not exist would read nothing locally.
	res, err = Simulate(context.Background(), Config{Nodes: []int{2}, RanksPerNode: 3, Batches: []int{8}, Samples: 6000, Epochs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Runs[0]; math.Abs(r.Network.Stock-0.5) > 0.03 || r.Network.Locality > 0.2 {
		t.Errorf("2 nodes x 3 ranks: network %+v, want stock about 0.5 and locality below 0.2", r.Network)
	}
}
