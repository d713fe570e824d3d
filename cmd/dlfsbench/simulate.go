package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/dlfs/dlfs/simulator"
)

// The simulate suite (issue 11): dlfs simulate over 16 to 1,024 nodes
// with ImageNet's 1,281,167 samples against Yang & Cong's figures, the
// time of the largest configuration alone, and a run with caches for half
// the dataset for SOLAR's epoch order. The plots and CSV files go to
// -simulate-out (docs/simulate in the repository).

func runSimulate(o options) error {
	sim := func(out string, args ...string) (*simulator.Result, float64, error) {
		args = append([]string{"simulate", "--json", "--out", out}, args...)
		fmt.Fprintf(os.Stderr, "measuring: dlfs %v\n", args)
		start := time.Now()
		cmd := exec.Command(filepath.Join(o.bin, "dlfs"), args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		b, err := cmd.Output()
		if err != nil {
			return nil, 0, fmt.Errorf("dlfs simulate: %v\n%s", err, stderr.Bytes())
		}
		var res simulator.Result
		if err := json.Unmarshal(b, &res); err != nil {
			return nil, 0, fmt.Errorf("dlfs simulate --json: %w", err)
		}
		return &res, time.Since(start).Seconds(), nil
	}
	all, _, err := sim(o.simOut, "--nodes", "4,16,64,256,1024", "--batch", "32,64,128")
	if err != nil {
		return err
	}
	_, big, err := sim(filepath.Join(o.dir, "simulate-1024"), "--nodes", "1024", "--batch", "64", "--epochs", "2")
	if err != nil {
		return err
	}
	half, _, err := sim(filepath.Join(o.simOut, "cache-half"), "--nodes", "16", "--batch", "64", "--epochs", "8", "--cache-ratio", "0.5")
	if err != nil {
		return err
	}

	paper := map[int]float64{32: 6.9, 64: 4.8, 128: 3.4}
	fmt.Printf("\n## Simulator: dlfs simulate, 1,281,167 samples, 2 epochs, one rank per node\n\n")
	fmt.Printf("The real placement and balance code; imbalance is the share of a global batch that balancing must move. " +
		"Plots and CSV in docs/simulate/.\n\n")
	fmt.Println("| nodes | local batch | global batches | imbalance median % (paper) | p90 % | network, stock order | network, balance=locality | most transfers in a batch |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|")
	// −∞ until a run counts: with none, the targets are not measured.
	worst, worstLocal := math.Inf(-1), math.Inf(-1)
	for _, r := range all.Runs {
		fmt.Printf("| %d | %d | %d | %.2f (%.1f) | %.2f | %.3f | %.3f | %d |\n", r.Nodes, r.Batch, r.Steps, r.ImbalancePct.Median, paper[r.Batch],
			r.ImbalancePct.P90, r.Network.Stock, r.Network.Locality, r.MaxTrans)
		if r.Nodes >= 16 {
			worst = math.Max(worst, math.Abs(r.ImbalancePct.Median-paper[r.Batch]))
			if r.Batch == 64 {
				worstLocal = math.Max(worstLocal, r.Network.Locality)
			}
		}
	}
	fmt.Println()
	for _, e := range half.PFS {
		fmt.Printf("- caches for half the dataset on 16 nodes, epoch %d: PFS reads %.3f× the dataset in the sampler's order, %.3f× in SOLAR's epoch order (permutation %d); %.3f× with a fixed cached half\n",
			e.Epoch, float64(e.Stock)/float64(half.Samples), float64(e.EpochOrder)/float64(half.Samples), e.Uses, float64(e.Static)/float64(half.Samples))
	}
	fmt.Printf("- imbalance medians at 16 to 1,024 nodes: at most %s points from the paper's (target ≤ 0.7): %s\n", show("%.2f", worst), atMost(worst, 0.7))
	fmt.Printf("- network fraction at local batch 64, 16 to 1,024 nodes: at most %s with balance=locality (target ≤ 0.08): %s\n", show("%.3f", worstLocal), atMost(worstLocal, 0.08))
	fmt.Printf("- 1,024 nodes, 1,281,167 samples, 2 epochs: %.1f s (target < 60 s): %s\n", big, verdict(big < 60, big))
	return nil
}
