package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"time"
)

// The balance suite (issue 11): the cluster suite's three nodes and job
// (3 ranks, one per node, local batch 32, 3 epochs, busy pfssim), run with
// the stock DistributedSampler order and with dlfs.LocalityBatchSampler
// (balance=locality, then balance=solar), first with RAM tiers that hold
// the dataset together (40% each) and then half of it (1/6 each). It
// reports the bytes the nodes fetched from each other and from the PFS per
// epoch, and the epoch times; it fails if a locality epoch's global batches
// are not torch's or a rank fell back to the stock order.

type balanceRun struct {
	name  string
	share float64  // each node's RAM tier, as a share of the dataset
	extra []string // the script's arguments
	args  []string // dlfs's
}

func runBalance(o options, src string, files []string, total int64) error {
	pfs, keyFile, err := busyCluster(o, "balance-pfs", src)
	if err != nil {
		return err
	}
	defer pfs.Stop(30 * time.Second)
	const (
		stockHash = "stock order, placement by hash, caches hold all"
		stockAll  = "stock order, caches hold all"
		localAll  = "balance=locality, caches hold all"
		stockHalf = "stock order, caches hold half"
		localHalf = "balance=locality, caches hold half"
		solarHalf = "balance=solar, caches hold half"
	)
	locality := []string{"--balance", "locality", "--dist"}
	runs := []balanceRun{
		{localAll, 0.4, locality, nil}, {stockAll, 0.4, nil, nil}, {stockHash, 0.4, nil, []string{"--placement", "hash"}},
		{stockHalf, 1.0 / 6, nil, nil}, {localHalf, 1.0 / 6, locality, nil}, {solarHalf, 1.0 / 6, []string{"--balance", "solar", "--dist"}, nil},
	}
	var results []clusterEpoch
	for i, run := range runs {
		stop, mnts, err := startNodes(o, pfs.Mnt, keyFile, true, append([]string{"--ram-cache", fmt.Sprint(int64(run.share * float64(total)))}, run.args...))
		if err != nil {
			return err
		}
		job := fmt.Sprintf("balance-%d", i)
		r, recs, err := runEpochs(o, here(pfs), files, run.name, job, mnts, mnts, run.extra)
		stop()
		if err != nil {
			return err
		}
		if len(run.extra) > 0 {
			if err := checkGlobalBatches(run.name, mnts, recs); err != nil {
				return err
			}
		}
		results = append(results, r...)
	}

	fmt.Printf("\n## Balance: the cluster job with locality-aware batches (3 nodes, 3 ranks, local batch 32, 3 epochs)\n\n")
	fmt.Printf("Same busy pfssim and set-up as the cluster table, placement by demand unless said. \"Bytes between nodes\" is what the nodes fetched from each other, " +
		"prefetches and moved samples included. Every global batch of every balance= epoch was checked against torch's " +
		"(DistributedSampler's batches of all ranks together) and every rank followed dlfs's plan.\n\n")
	fmt.Println("| run | epoch | seconds | PFS bytes ÷ dataset | busiest node's PFS bytes ÷ mean | bytes between nodes ÷ dataset |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	for _, r := range results {
		fmt.Printf("| %s | %d | %.2f | %.2f | %.2f | %.3f |\n", r.mode, r.epoch, r.seconds, float64(r.pfsBytes)/float64(total), r.pfsSkew,
			float64(r.peerBytes)/float64(total))
	}
	// find averages a run's epochs from 1 on; every figure is notMeasured
	// where the run has none.
	find := func(mode string) (secs, pfsB, peer, skew float64) {
		n := 0.0
		for _, r := range results {
			if r.mode == mode && r.epoch >= 1 {
				secs, pfsB, peer = secs+r.seconds, pfsB+float64(r.pfsBytes)/float64(total), peer+float64(r.peerBytes)/float64(total)
				skew += r.pfsSkew
				n++
			}
		}
		return perUnit(secs, n), perUnit(pfsB, n), perUnit(peer, n), perUnit(skew, n)
	}
	sS, _, sPeer, _ := find(stockAll)
	_, _, hPeer, _ := find(stockHash)
	lS, _, lPeer, _ := find(localAll)
	_, shPFS, _, shSkew := find(stockHalf)
	_, lhPFS, _, lhSkew := find(localHalf)
	_, solPFS, _, solSkew := find(solarHalf)
	fmt.Println()
	fmt.Printf("- epochs 1-2, bytes between nodes: %.3f× the dataset with balance=locality (target ≤ 0.10×): %s; %.3f× in the stock order with placement by demand\n",
		lPeer, atMost(lPeer, 0.10), sPeer)
	fmt.Printf("  (%.3f× in the stock order with placement by hash, against (p−1)/p = 0.667)\n", hPeer)
	fmt.Printf("- epochs 1-2, epoch time: %.2f s with balance=locality against %.2f s in the stock order (%.2f×)\n", lS, sS, lS/sS)
	fmt.Printf("- caches for half the dataset, epochs 1-2, PFS bytes per epoch: %.2f× the dataset with balance=solar, %.2f× with balance=locality, %.2f× in the stock order\n",
		solPFS, lhPFS, shPFS)
	fmt.Printf("- caches for half the dataset, epochs 1-2, the busiest node's PFS bytes over the mean: %.2f with balance=solar, %.2f with balance=locality, %.2f in the stock order\n",
		solSkew, lhSkew, shSkew)
	return nil
}

// checkGlobalBatches checks that in every epoch the ranks followed dlfs's
// plan and their k-th batches together are torch's k-th global batch.
func checkGlobalBatches(run string, mnts []string, recs [][]epochRecord) error {
	for e, ranks := range recs {
		global := ranks[0].Global
		for r, rec := range ranks {
			if rec.Source != "dlfs" {
				return fmt.Errorf("%s, epoch %d: rank %d yielded the %s batches, not dlfs's plan", run, e, r, rec.Source)
			}
			if len(rec.Batches) != len(global) {
				return fmt.Errorf("%s, epoch %d: rank %d has %d batches, torch %d global batches", run, e, r, len(rec.Batches), len(global))
			}
		}
		for k := range global {
			var got, want []string
			for r, rec := range ranks {
				for _, p := range rec.Batches[k] {
					rel, _ := filepath.Rel(mnts[r], p)
					got = append(got, rel)
				}
			}
			for _, p := range global[k] {
				rel, _ := filepath.Rel(mnts[0], p)
				want = append(want, rel)
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				return fmt.Errorf("%s, epoch %d: global batch %d is not torch's", run, e, k)
			}
		}
	}
	return nil
}
