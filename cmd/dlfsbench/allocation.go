package main

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/dlfs/dlfs/allocator"
	"github.com/dlfs/dlfs/test/datagen"
	"github.com/dlfs/dlfs/test/mountproc"
)

// The allocation suite (issue 15): several stand-in training jobs on one
// node, each a dlfs.DataLoader (standin_job.py) whose model sleeps per
// batch of 32 and whose workers spend a fixed CPU time per sample,
// reading new samples every epoch from pfssim through dlfs, so their
// workers wait on the PFS as well as decode. The same jobs run with
// --allocation even and need, side by side; then need again with a
// fourth job arriving and the first ending, for the timeline.
//
// The models' steps keep the ratios (5, 20 and 60 ms) at an
// eighth of the rate (40, 160 and 480 ms), over a PFS at 20 ms an open:
// at the rates the three jobs' Python processes alone ask for
// more than this VM's two cores (about 1 ms of CPU per sample between
// the main processes, the workers' pickling and the two FUSE daemons),
// so every job is CPU-bound under either mode, aggregate samples/s is
// fixed by the cores, and no allocation can move it. Scaled, the jobs
// ask for more workers than --loader-cpus gives (which is what makes the
// split matter) while the cores still have room, as on the 16-64 core
// nodes A-Dloader measured.

//go:embed standin_job.py
var standinJob []byte

// standin is one stand-in job.
type standin struct {
	name       string
	step       float64 // seconds per batch
	files      int     // its dataset
	epochFiles int
	start      float64 // seconds after the run starts
	seconds    float64 // how long it trains
	end        bool    // writes "end job=NAME" when done
}

// standinEpoch is one line of standin_job.py's output.
type standinEpoch struct {
	Epoch     int      `json:"epoch"`
	Start     float64  `json:"start"`
	First     float64  `json:"first"` // its first batch: the workers had started
	End       float64  `json:"end"`
	Batch     int      `json:"batch"`
	Samples   int      `json:"samples"`
	Workers   int      `json:"workers"`
	Predicted *float64 `json:"predicted"`
}

const (
	allocLoaderCPUs = 24                     // the worker budget: a node of 24 cores, squeezed onto this VM's 2
	allocDecode     = 200 * time.Microsecond // the stand-in decode's CPU per sample
	allocOpen       = 20 * time.Millisecond  // pfssim's latency per open
	allocWarm       = 8.0                    // seconds left out at the start of a run: the first reports and advice
)

func runAllocation(o options) error {
	jobs := []standin{
		{name: "a-40ms", step: 0.040, files: 40_000, epochFiles: 2400, seconds: 34},
		{name: "b-160ms", step: 0.160, files: 12_000, epochFiles: 800, seconds: 34},
		{name: "c-480ms", step: 0.480, files: 6_000, epochFiles: 320, seconds: 34},
	}
	fourth := standin{name: "d-80ms", step: 0.080, files: 20_000, epochFiles: 1600}
	base := filepath.Join(o.dir, "alloc")
	fmt.Fprintln(os.Stderr, "allocation: generating the stand-in jobs' datasets (kept for reuse) ...")
	for i, j := range append(slices.Clone(jobs), fourth) {
		if _, err := datagen.ImageFolder(filepath.Join(base, j.name), datagen.Spec{Classes: 10, Files: j.files, MeanSize: 1024, Spread: 512, Seed: uint64(150 + i)}); err != nil {
			return err
		}
	}
	script := filepath.Join(o.dir, "standin_job.py")
	if err := os.WriteFile(script, standinJob, 0o644); err != nil {
		return err
	}
	pyDir, err := filepath.Abs("python")
	if err != nil {
		return err
	}
	pfs, err := startSim(o, "alloc-pfs", base, "-open-latency", allocOpen.String(), "-bandwidth-mbps", "400", "-max-inflight", "256")
	if err != nil {
		return err
	}
	defer pfs.Stop(30 * time.Second)

	type result struct {
		mode   string
		epochs map[string][]standinEpoch
		stats  map[string]any
		t0     time.Time // when the jobs started
		busy   float64   // the share of the node's CPU time in use while they ran
	}
	// run records each job's epochs in DIR/alloc-TAG-JOB.jsonl.
	run := func(tag, mode string, jobs []standin) (result, error) {
		res := result{mode: mode, epochs: map[string][]standinEpoch{}}
		mnt, err := freshDir(filepath.Join(o.dir, "alloc-mnt"))
		if err != nil {
			return res, err
		}
		d, err := mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, time.Minute, "mount", "--log-level", "warn",
			"--allocation", mode, "--loader-cpus", fmt.Sprint(allocLoaderCPUs), "--infer=false", pfs.Mnt, mnt)
		if err != nil {
			return res, err
		}
		defer d.Stop(time.Minute)
		res.t0 = time.Now()
		busy0, total0, err := allocator.ProcStat()
		if err != nil {
			return res, err
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		errs := make([]error, len(jobs))
		for i, j := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(j.start * float64(time.Second)))
				out := filepath.Join(o.dir, "alloc-"+tag+"-"+j.name+".jsonl")
				args := []string{script, "--data", filepath.Join(mnt, j.name), "--job", j.name,
					"--step", fmt.Sprint(j.step), "--decode", fmt.Sprint(allocDecode.Seconds()), "--workers", fmt.Sprint(allocLoaderCPUs / 3),
					"--epoch-files", fmt.Sprint(j.epochFiles), "--seconds", fmt.Sprint(j.seconds),
					"--t0", fmt.Sprintf("%.6f", float64(res.t0.UnixNano())/1e9), "--out", out}
				if j.end {
					args = append(args, "--end")
				}
				cmd := exec.Command("/usr/bin/python3", args...)
				cmd.Env = append(os.Environ(), "DLFS_PYTHON="+pyDir)
				if b, err := cmd.CombinedOutput(); err != nil {
					errs[i] = fmt.Errorf("%s (%s): %v\n%s", j.name, mode, err, b)
					return
				}
				var eps []standinEpoch
				errs[i] = readLines(out, func(line []byte) error {
					var e standinEpoch
					if err := json.Unmarshal(line, &e); err != nil {
						return err
					}
					eps = append(eps, e)
					return nil
				})
				mu.Lock()
				res.epochs[j.name] = eps
				mu.Unlock()
			}()
		}
		wg.Wait()
		if err := firstErr(errs...); err != nil {
			return res, err
		}
		busy1, total1, err := allocator.ProcStat()
		if err != nil {
			return res, err
		}
		res.busy = (busy1 - busy0) / max(total1-total0, 1)
		b, err := os.ReadFile(filepath.Join(mnt, ".dlfs/stats"))
		if err == nil {
			err = json.Unmarshal(b, &res.stats)
		}
		return res, err
	}

	// Two rounds, even then need in each: on this machine one pair of runs
	// differs by as much as the allocation does.
	const rounds = 2
	fmt.Printf("\n## Allocation between jobs (issue 15)\n\n")
	fmt.Printf("Three stand-in jobs on one node, each a `dlfs.DataLoader` (batch 32) whose model sleeps per batch and whose workers spend %v of CPU per sample, each epoch reading new 1 KB samples from pfssim (%v per open) through dlfs; `--loader-cpus %d` on this 2-core machine; every job starts with %d workers and runs %.0f s; rates from its epochs starting after %.0f s. %d rounds, each running even, then need.\n",
		allocDecode, allocOpen, allocLoaderCPUs, allocLoaderCPUs/3, jobs[0].seconds, allocWarm, rounds)
	// A rate or prediction not measured in any job makes the round's
	// figures NaN, and its targets "not measured"; so does an aggregate
	// even rate of 0 (the gain would be infinite).
	var ratios []float64
	worstErr, slowest := 0.0, math.Inf(1)
	for round := 1; round <= rounds; round++ {
		var results []result
		for _, mode := range []string{"even", "need"} {
			fmt.Fprintf(os.Stderr, "allocation: round %d, three jobs, --allocation %s ...\n", round, mode)
			r, err := run(fmt.Sprintf("%s%d", mode, round), mode, jobs)
			if err != nil {
				return err
			}
			results = append(results, r)
		}
		fmt.Printf("\nRound %d (the node's CPU in use: %.0f%% under even, %.0f%% under need):\n\n", round, 100*results[0].busy, 100*results[1].busy)
		fmt.Println("| job (model step per batch: the samples/s it can eat) | even: workers | even: samples/s | need: workers | need: samples/s | need ÷ even | need: prediction error (median over epochs) | need: workers' start, share of an epoch |")
		fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|")
		var totEven, totNeed float64
		for _, j := range jobs {
			re, we := allocRate(results[0].epochs[j.name])
			rn, wn := allocRate(results[1].epochs[j.name])
			acc, start, n := allocAccuracy(results[1].epochs[j.name])
			totEven += re
			totNeed += rn
			ratio := perUnit(rn, re)
			slowest = min(slowest, ratio) // NaN stays NaN
			worstErr = max(worstErr, acc)
			fmt.Printf("| %s (%.0f ms: at most %.0f/s) | %d | %s | %d | %s | %s | %s (%d epochs) | %s |\n", j.name, j.step*1000, 32/j.step,
				we, show("%.0f", re), wn, show("%.0f", rn), show("%.2f×", ratio), show("%.0f%%", 100*acc), n, show("%.0f%%", 100*start))
		}
		gain := perUnit(totNeed, totEven)
		fmt.Printf("| all | %d | %s | | %s | **%s** | | |\n", allocLoaderCPUs, show("%.0f", totEven), show("%.0f", totNeed), show("%.2f×", gain))
		ratios = append(ratios, gain)
	}
	fmt.Println()
	fmt.Printf("- aggregate samples/s, need ÷ even, by round: %s (target ≥ 1.2 in each): %s\n", fmtRatios(ratios), atLeast(slices.Min(ratios), 1.2))
	fmt.Printf("- the job that gained least, over both rounds: %s its even rate (target: none below 0.9× unless its model allows no more)\n", show("%.2f×", slowest))
	fmt.Printf("- the model's prediction against the rate each epoch ran at: worst job's median error %s (target ≤ 15%%): %s\n", show("%.0f%%", 100*worstErr), atMost(worstErr, 0.15))

	// The timeline: need, a fourth job arriving, the first ending.
	dyn := slices.Clone(jobs)
	for i := range dyn {
		dyn[i].seconds = 50
	}
	dyn[0].seconds, dyn[0].end = 30, true
	fourth.start, fourth.seconds = 15, 35
	dyn = append(dyn, fourth)
	fmt.Fprintln(os.Stderr, "allocation: need, a fourth job at 15 s, the first ending at 30 s ...")
	r, err := run("timeline", "need", dyn)
	if err != nil {
		return err
	}
	changes, err := allocChanges(r.stats, float64(r.t0.UnixNano())/1e9)
	if err != nil {
		return err
	}
	fmt.Printf("\nTimeline (need): %s starts at %.0f s; %s writes `end` after %.0f s. Worker changes dlfs made (seconds since the jobs started):\n\n", fourth.name, fourth.start, dyn[0].name, dyn[0].seconds)
	fmt.Println("| seconds | job | workers | reason |")
	fmt.Println("|---:|---|---:|---|")
	for _, c := range changes {
		fmt.Printf("| %.1f | %s | %d | %s |\n", c.Seconds, c.Job, c.Workers, c.Reason)
	}
	fmt.Println()
	// When each event happened, from the jobs' own records: the fourth
	// job's first epoch, the first job's last.
	var firstD, lastA standinEpoch
	if eps := r.epochs[fourth.name]; len(eps) > 0 {
		firstD = eps[0]
	}
	if eps := r.epochs[dyn[0].name]; len(eps) > 0 {
		lastA = eps[len(eps)-1]
	}
	for _, ev := range []struct {
		what, job, reason string
	}{
		{fmt.Sprintf("%s's arrival (its process started at %.0f s, its first epoch ran from %.1f to %.1f s)", fourth.name, fourth.start, firstD.Start, firstD.End), fourth.name, "arrival"},
		{fmt.Sprintf("%s's end (its last epoch ended at %.1f s)", dyn[0].name, lastA.End), dyn[0].name, "end"},
	} {
		at := -1.0
		for _, c := range changes {
			if c.Job == ev.job && c.Reason == ev.reason {
				at = c.Seconds
				break
			}
		}
		// Each other job's first epoch that starts after the change, and
		// the workers it ran with.
		var took []string
		for _, j := range dyn {
			if j.name == ev.job {
				continue
			}
			for _, e := range r.epochs[j.name] {
				if at >= 0 && e.Start >= at {
					took = append(took, fmt.Sprintf("%s at %.1f s with %d workers", j.name, e.Start, e.Workers))
					break
				}
			}
		}
		fmt.Printf("- %s: the allocation changed at %.1f s; the others' next epochs: %s\n", ev.what, at, strings.Join(took, ", "))
	}
	plotPath := filepath.Join("docs", "allocation-timeline.png")
	if err := allocPlot(r.epochs, dyn, plotPath); err != nil {
		return err
	}
	fmt.Printf("- workers per job, epoch by epoch: %s\n", plotPath)
	return nil
}

// runPrefetchShare measures how two announced jobs share the prefetcher:
// the example loop (dlfs.DistributedSampler, 4 workers, batch 32) over a
// busy pfssim, one job with a 2 ms model step and one with 50 ms, each on
// its own 1,500 samples of 110 KB, staging smaller than either epoch. With
// --allocation need the prefetcher serves the job that needs its next
// sample soonest; with even, it keeps both as many samples ahead.
func runPrefetchShare(o options) error {
	base := filepath.Join(o.dir, "alloc")
	type job struct {
		name string
		step float64 // ms per batch
	}
	jobs := []job{{"pf-fast", 2}, {"pf-slow", 50}}
	for i, j := range jobs {
		if _, err := datagen.ImageFolder(filepath.Join(base, j.name), datagen.Spec{Classes: 10, Files: 1500, MeanSize: 110_000, Spread: 40_000, Seed: uint64(170 + i)}); err != nil {
			return err
		}
	}
	pfs, err := startSim(o, "share-pfs", base, "-open-latency", "20ms", "-read-latency", "1ms", "-bandwidth-mbps", "300", "-max-inflight", "256")
	if err != nil {
		return err
	}
	defer pfs.Stop(30 * time.Second)
	type outcome struct{ seconds, stall float64 }
	run := func(mode string) (map[string]outcome, error) {
		mnt, err := freshDir(filepath.Join(o.dir, "share-mnt"))
		if err != nil {
			return nil, err
		}
		d, err := mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, time.Minute, "mount", "--log-level", "warn",
			"--allocation", mode, "--staging", "64MiB", "--prefetch-workers", "64", "--push=false", pfs.Mnt, mnt)
		if err != nil {
			return nil, err
		}
		defer d.Stop(time.Minute)
		out := map[string]outcome{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := make([]error, len(jobs))
		for i, j := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rec := filepath.Join(o.dir, "share-"+j.name+".json")
				cmd := exec.Command("/usr/bin/python3", filepath.Join(o.examples, "train_imagefolder.py"), "--data", filepath.Join(mnt, j.name),
					"--epochs", "1", "--workers", "4", "--batch", "32", "--raw", "--job", j.name, "--step-ms", fmt.Sprint(j.step), "--record", rec)
				cmd.Env = append(os.Environ(), "RANK=0", "WORLD_SIZE=1")
				if b, err := cmd.CombinedOutput(); err != nil {
					errs[i] = fmt.Errorf("%s (%s): %v\n%s", j.name, mode, err, b)
					return
				}
				var recs []epochRecord
				b, err := os.ReadFile(rec)
				if err == nil {
					err = json.Unmarshal(b, &recs)
				}
				if err != nil || len(recs) != 1 {
					errs[i] = fmt.Errorf("%s: bad record %s: %v", j.name, rec, err)
					return
				}
				mu.Lock()
				out[j.name] = outcome{seconds: recs[0].Seconds}
				mu.Unlock()
			}()
		}
		wg.Wait()
		if err := firstErr(errs...); err != nil {
			return nil, err
		}
		st, err := readStats(mnt)
		if err != nil {
			return nil, err
		}
		for _, j := range jobs {
			o := out[j.name]
			o.stall = st.Jobs[j.name]["rank-0"].StallSeconds
			out[j.name] = o
		}
		return out, nil
	}
	results := map[string]map[string]outcome{}
	for _, mode := range []string{"even", "need", "even", "need"} {
		fmt.Fprintf(os.Stderr, "allocation: prefetch shared by two announced jobs, --allocation %s ...\n", mode)
		r, err := run(mode)
		if err != nil {
			return err
		}
		if prev, ok := results[mode]; ok { // keep the faster of two runs per job
			for k, v := range r {
				if prev[k].seconds < v.seconds {
					r[k] = prev[k]
				}
			}
		}
		results[mode] = r
	}
	fmt.Printf("\nPrefetch shared by two announced jobs (the example loop, 4 workers, batch 32, 1,500 samples of 110 KB each, pfssim 20 ms per open and 300 MB/s, `--staging 64MiB`, pushing off); the better of two runs each:\n\n")
	fmt.Println("| job (model step per batch: the samples/s it can eat) | even: epoch s | even: stall s | need: epoch s | need: stall s | even ÷ need (time) |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	for _, j := range jobs {
		e, n := results["even"][j.name], results["need"][j.name]
		fmt.Printf("| %s (%.0f ms) | %.2f | %.2f | %.2f | %.2f | %.2f× |\n", j.name, j.step, e.seconds, e.stall, n.seconds, n.stall, e.seconds/n.seconds)
	}
	return nil
}

// allocRate is a job's samples/s over its epochs that start after the warm
// window, from the first one's start to the last one's end, and the
// workers of the last; the rate is notMeasured when no epoch started in
// the window.
func allocRate(eps []standinEpoch) (float64, int) {
	var n, workers int
	first, last := -1.0, 0.0
	for _, e := range eps {
		if e.Start < allocWarm {
			continue
		}
		if first < 0 {
			first = e.Start
		}
		n += e.Samples
		last = e.End
		workers = e.Workers
	}
	if first < 0 || last <= first {
		return notMeasured, workers
	}
	return float64(n) / (last - first), workers
}

// allocAccuracy is the median relative error of the advice's prediction,
// made before the epoch for the workers it ran with, against the rate the
// epoch ran at, start to end, after the warm window; and the median share
// of the epoch its workers took to start. Both are notMeasured when no
// such epoch had a prediction.
func allocAccuracy(eps []standinEpoch) (errMedian, startShare float64, n int) {
	var errs, starts []float64
	for _, e := range eps {
		if e.Start < allocWarm || e.Predicted == nil || e.End <= e.Start || e.Samples <= 0 {
			continue
		}
		got := float64(e.Samples) / (e.End - e.Start)
		errs = append(errs, math.Abs(*e.Predicted-got)/got)
		starts = append(starts, (e.First-e.Start)/(e.End-e.Start))
	}
	if len(errs) == 0 {
		return notMeasured, notMeasured, 0
	}
	sort.Float64s(errs)
	sort.Float64s(starts)
	return errs[len(errs)/2], starts[len(starts)/2], len(errs)
}

// fmtRatios prints ratios as "1.05×, 1.10×".
func fmtRatios(rs []float64) string {
	var out []string
	for _, r := range rs {
		out = append(out, show("%.2f×", r))
	}
	return strings.Join(out, ", ")
}

// allocChange is one entry of stats.allocation.changes.
type allocChange struct {
	Seconds float64 `json:"seconds"`
	Job     string  `json:"job"`
	Rank    int     `json:"rank"`
	Workers int     `json:"workers"`
	Reason  string  `json:"reason"`
}

// allocChanges returns the stats' timeline, in seconds since t0 (Unix
// seconds), when the jobs started.
func allocChanges(stats map[string]any, t0 float64) ([]allocChange, error) {
	alloc, _ := stats["allocation"].(map[string]any)
	started, _ := alloc["started_unix_seconds"].(float64)
	offset := t0 - started
	b, err := json.Marshal(alloc["changes"])
	if err != nil {
		return nil, err
	}
	var cs []allocChange
	if err := json.Unmarshal(b, &cs); err != nil {
		return nil, err
	}
	for i := range cs {
		cs[i].Seconds -= offset
	}
	return cs, nil
}

// allocPlot draws each job's workers, epoch by epoch, against time.
func allocPlot(epochs map[string][]standinEpoch, jobs []standin, path string) error {
	p := plot.New()
	p.Title.Text = "DataLoader workers per job (--allocation need)"
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "workers"
	var args []any
	for _, j := range jobs {
		var xy plotter.XYs
		for _, e := range epochs[j.name] {
			xy = append(xy, plotter.XY{X: e.Start, Y: float64(e.Workers)}, plotter.XY{X: e.End, Y: float64(e.Workers)})
		}
		if len(xy) > 0 {
			args = append(args, fmt.Sprintf("%s (%.0f ms/batch)", j.name, j.step*1000), xy)
		}
	}
	if err := plotutil.AddLines(p, args...); err != nil {
		return err
	}
	p.Y.Min = 0
	p.Legend.Top = false // bottom right, below the curves: the workers never go under one
	return p.Save(7*vg.Inch, 4*vg.Inch, path)
}

// readLines calls fn with each line of the file at path.
func readLines(path string, fn func([]byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if err := fn(sc.Bytes()); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	return sc.Err()
}
