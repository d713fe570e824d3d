package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/dlfs/dlfs/simulator"
)

type simulateOptions struct {
	nodes, batches []int
	cfg            simulator.Config
	sampleBytes    sizeValue
	out            string
	json           bool
}

func newSimulateCmd() *cobra.Command {
	o := simulateOptions{sampleBytes: simulator.DefaultSampleBytes}
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Simulate placement and locality-aware batches for a cluster of up to 1,024 nodes",
		Long: `simulate runs dlfs's placement and balance code over a cluster that does
not exist (no FUSE, no network): every node's share of the dataset, torch's
DistributedSampler permutations, and the locality plan of every global batch.
It prints, per (nodes, local batch): the imbalance of the global batches
(Yang & Cong, Fig. 6), the share of reads that cross the network in the stock
order and with balance=locality, and the epoch time of the paper's model
(eqs. 1–8) from --pfs-rate, --peer-rate and --train-rate (samples/s). With
--cache-ratio below 1 it also prints the PFS reads per epoch with and without
SOLAR's epoch order. --out DIR writes the figures as CSV, SVG and PNG.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.cfg.Nodes, o.cfg.Batches, o.cfg.SampleBytes = o.nodes, o.batches, int64(o.sampleBytes)
			// The library reads 0 as "the default"; here 0 is what was typed.
			for name, v := range map[string]float64{"--samples": float64(o.cfg.Samples), "--epochs": float64(o.cfg.Epochs),
				"--ranks-per-node": float64(o.cfg.RanksPerNode), "--cache-ratio": o.cfg.Alpha, "--sample-size": float64(o.sampleBytes),
				"--pfs-rate": o.cfg.PFSRate, "--peer-rate": o.cfg.PeerRate, "--train-rate": o.cfg.TrainRate} {
				if !(v > 0) {
					return fmt.Errorf("%s %g: want a positive value", name, v)
				}
			}
			if err := o.cfg.Validate(); err != nil {
				return err
			}
			if o.out != "" {
				if err := os.MkdirAll(o.out, 0o755); err != nil {
					return fmt.Errorf("--out: %w", err)
				}
			}
			if !o.json {
				o.cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			res, err := simulator.Simulate(ctx, o.cfg)
			if err != nil {
				return err
			}
			if o.out != "" {
				if err := writeFigures(o.out, res); err != nil {
					return err
				}
			}
			if o.json {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			printSimulation(cmd.OutOrStdout(), res)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntSliceVar(&o.nodes, "nodes", []int{4, 16, 64, 256, 1024}, "cluster sizes to simulate")
	f.IntVar(&o.cfg.RanksPerNode, "ranks-per-node", 1, "training processes per node")
	f.IntSliceVar(&o.batches, "batch", []int{32, 64, 128}, "local (per-rank) batch sizes")
	f.IntVar(&o.cfg.Samples, "samples", simulator.DefaultSamples, "samples in the dataset")
	f.IntVar(&o.cfg.Epochs, "epochs", 2, "epochs to simulate")
	f.Float64Var(&o.cfg.Alpha, "cache-ratio", 1, "share of the dataset the cluster's caches hold (α)")
	f.Var(&o.sampleBytes, "sample-size", "mean sample size, to count bytes")
	f.Uint64Var(&o.cfg.Seed, "seed", 0, "the sampler's seed")
	f.Float64Var(&o.cfg.PFSRate, "pfs-rate", simulator.DefaultPFSRate, "R: samples/s the PFS delivers to the whole cluster")
	f.Float64Var(&o.cfg.PeerRate, "peer-rate", simulator.DefaultPeerRate, "R_c: samples/s the interconnect moves between caches")
	f.Float64Var(&o.cfg.TrainRate, "train-rate", simulator.DefaultTrainRate, "V: samples/s one node trains on")
	f.StringVar(&o.out, "out", "", "directory for the CSV files and plots")
	f.BoolVar(&o.json, "json", false, "print one JSON object instead of the table")
	return cmd
}

func printSimulation(w io.Writer, res *simulator.Result) {
	fmt.Fprintf(w, "%6s %6s %7s  %27s  %17s  %s\n", "nodes", "batch", "steps", "imbalance % (p25/median/p90)",
		"network stock/loc", "epoch s: train / no cache / distributed / locality")
	for _, r := range res.Runs {
		fmt.Fprintf(w, "%6d %6d %7d  %8.2f / %6.2f / %6.2f      %7.3f / %6.3f  %7.1f / %7.1f / %7.1f / %7.1f\n",
			r.Nodes, r.Batch, r.Steps, r.ImbalancePct.P25, r.ImbalancePct.Median, r.ImbalancePct.P90,
			r.Network.Stock, r.Network.Locality, r.Time.Training, r.Time.NoCache, r.Time.Distributed, r.Time.Locality)
	}
	for _, e := range res.PFS {
		fmt.Fprintf(w, "epoch %d: PFS samples %d with a fixed cached subset, %d in the sampler's order, %d in SOLAR's (permutation %d)\n",
			e.Epoch, e.Static, e.Stock, e.EpochOrder, e.Uses)
	}
	fmt.Fprintf(w, "all: imbalance median %.2f%% (p25 %.2f, p75 %.2f, p90 %.2f); network fraction stock %.3f, locality %.3f; %.1f s\n",
		res.ImbalancePct.Median, res.ImbalancePct.P25, res.ImbalancePct.P75, res.ImbalancePct.P90,
		res.Network.Stock, res.Network.Locality, res.Seconds)
}

// writeFigures writes the CSV files and their plots into dir.
func writeFigures(dir string, res *simulator.Result) error {
	ftoa := func(x float64) string { return strconv.FormatFloat(x, 'g', 6, 64) }
	itoa := strconv.Itoa
	var imb, net, times [][]string
	imb = append(imb, []string{"nodes", "batch", "step", "imbalance_pct"})
	net = append(net, []string{"nodes", "batch", "stock_fraction", "locality_fraction", "stock_bytes_per_epoch", "locality_bytes_per_epoch", "moved", "transfers"})
	times = append(times, []string{"nodes", "batch", "training_s", "no_cache_s", "distributed_s", "locality_s", "plateau_nodes"})
	for _, r := range res.Runs {
		for i, v := range r.Imbalances {
			imb = append(imb, []string{itoa(r.Nodes), itoa(r.Batch), itoa(i), ftoa(v)})
		}
		net = append(net, []string{itoa(r.Nodes), itoa(r.Batch), ftoa(r.Network.Stock), ftoa(r.Network.Locality),
			strconv.FormatInt(r.NetworkBytes.Stock, 10), strconv.FormatInt(r.NetworkBytes.Locality, 10),
			strconv.FormatInt(r.Moved, 10), strconv.FormatInt(r.Transfers, 10)})
		times = append(times, []string{itoa(r.Nodes), itoa(r.Batch), ftoa(r.Time.Training), ftoa(r.Time.NoCache),
			ftoa(r.Time.Distributed), ftoa(r.Time.Locality), ftoa(r.Time.PlateauP)})
	}
	files := map[string][][]string{"imbalance.csv": imb, "network.csv": net, "epoch_time.csv": times}
	if len(res.PFS) > 0 {
		pfs := [][]string{{"epoch", "static", "stock_order", "epochorder", "uses_permutation"}}
		for _, e := range res.PFS {
			pfs = append(pfs, []string{itoa(e.Epoch), strconv.FormatInt(e.Static, 10), strconv.FormatInt(e.Stock, 10),
				strconv.FormatInt(e.EpochOrder, 10), itoa(e.Uses)})
		}
		files["pfs.csv"] = pfs
	}
	for name, rows := range files {
		if err := writeCSV(filepath.Join(dir, name), rows); err != nil {
			return err
		}
	}
	plots := map[string]func(*simulator.Result) (*plot.Plot, error){
		"imbalance": imbalancePlot, "network": networkPlot, "epoch_time": epochTimePlot,
	}
	if len(res.PFS) > 0 {
		plots["pfs"] = pfsPlot
	}
	for name, make := range plots {
		p, err := make(res)
		if err != nil {
			return fmt.Errorf("plotting %s: %w", name, err)
		}
		for _, ext := range []string{".svg", ".png"} {
			if err := p.Save(7*vg.Inch, 4*vg.Inch, filepath.Join(dir, name+ext)); err != nil {
				return fmt.Errorf("writing %s%s: %w", name, ext, err)
			}
		}
	}
	return nil
}

func writeCSV(path string, rows [][]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	if err := w.WriteAll(rows); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

// imbalancePlot is Fig. 6: a box per (nodes, local batch).
func imbalancePlot(res *simulator.Result) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Imbalance of global batches (samples balancing must move / batch)"
	p.Y.Label.Text = "imbalance %"
	p.X.Label.Text = "nodes / local batch"
	var names []string
	for i, r := range res.Runs {
		box, err := plotter.NewBoxPlot(vg.Points(12), float64(i), plotter.Values(r.Imbalances))
		if err != nil {
			return nil, err
		}
		box.FillColor = plotutil.Color(indexOf(res.Config.Batches, r.Batch))
		p.Add(box)
		names = append(names, fmt.Sprintf("%d/%d", r.Nodes, r.Batch))
	}
	p.NominalX(names...)
	return p, nil
}

// networkPlot is eq. 7 against eq. 8: the share of reads crossing the
// network, by cluster size.
func networkPlot(res *simulator.Result) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Reads that cross the network"
	p.X.Label.Text = "nodes"
	p.Y.Label.Text = "fraction of reads"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{}
	var args []any
	for _, b := range res.Config.Batches {
		var stock, local plotter.XYs
		for _, r := range res.Runs {
			if r.Batch == b {
				stock = append(stock, plotter.XY{X: float64(r.Nodes), Y: r.Network.Stock})
				local = append(local, plotter.XY{X: float64(r.Nodes), Y: r.Network.Locality})
			}
		}
		if b == res.Config.Batches[0] {
			args = append(args, "stock order", stock)
		}
		args = append(args, fmt.Sprintf("locality, batch %d", b), local)
	}
	return p, plotutil.AddLinePoints(p, args...)
}

// epochTimePlot is the model's epoch time by cluster size, for the first
// local batch: training alone, no cache (its plateau, eq. 6), distributed
// caching (eq. 7) and the locality plan (eq. 8).
func epochTimePlot(res *simulator.Result) (*plot.Plot, error) {
	p := plot.New()
	b := res.Config.Batches[0]
	p.Title.Text = fmt.Sprintf("Epoch time by the model (eqs. 1-8), local batch %d", b)
	p.X.Label.Text = "nodes"
	p.Y.Label.Text = "seconds"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{}
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{}
	var train, none, dist, local plotter.XYs
	for _, r := range res.Runs {
		if r.Batch != b {
			continue
		}
		x := float64(r.Nodes)
		train = append(train, plotter.XY{X: x, Y: r.Time.Training})
		none = append(none, plotter.XY{X: x, Y: r.Time.NoCache})
		dist = append(dist, plotter.XY{X: x, Y: r.Time.Distributed})
		local = append(local, plotter.XY{X: x, Y: r.Time.Locality})
	}
	p.Legend.Top = true
	return p, plotutil.AddLinePoints(p, "training only", train, "no cache", none, "distributed cache (stock order)", dist, "locality plan", local)
}

// pfsPlot is the PFS reads per epoch with caches for α of the dataset.
func pfsPlot(res *simulator.Result) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("PFS reads per epoch, caches for %.0f%% of the dataset", 100*res.Config.Alpha)
	p.X.Label.Text = "epoch"
	p.Y.Label.Text = "samples"
	var static, stock, solar plotter.XYs
	for _, e := range res.PFS {
		x := float64(e.Epoch)
		static = append(static, plotter.XY{X: x, Y: float64(e.Static)})
		stock = append(stock, plotter.XY{X: x, Y: float64(e.Stock)})
		solar = append(solar, plotter.XY{X: x, Y: float64(e.EpochOrder)})
	}
	return p, plotutil.AddLinePoints(p, "fixed cached subset", static, "last epoch's tail, sampler's order", stock, "last epoch's tail, SOLAR's order", solar)
}

func indexOf(xs []int, x int) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return 0
}
