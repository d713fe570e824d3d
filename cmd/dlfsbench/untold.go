package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlfs/dlfs/test/mountproc"
)

// The untold suite (issue 12): loaders that announce nothing, over the
// busy pfssim of the clairvoyance suite.
//   - The example loop with the DataLoader's own SequentialSampler
//     (shuffle=False, 4 workers, batch 32): directly on pfssim, through
//     dlfs with inference off (what an untold reader got before), and
//     through dlfs as it is; against the bandwidth bound.
//   - The shuffled loop with no line (torch's DistributedSampler), with
//     the line, and a decoy; the same on a busy machine; dlfs warmup.
//   - A reader that loops over the dataset in index order (4 threads, one
//     process), 4 passes, with a RAM tier of half the dataset, a small
//     staging, and the page cache dropped before each pass: the PFS bytes
//     the caches spared from the second pass, with Belady by the inferred
//     plan and with LRU.

func runUntold(o options, src string, files []string, total int64) error {
	pfs, err := startSim(o, "untold-pfs", src, "-open-latency", o.busyOpen.String(), "-read-latency", o.busyRead.String(),
		"-bandwidth-mbps", fmt.Sprint(o.bandwidth), "-max-inflight", "256")
	if err != nil {
		return err
	}
	defer pfs.Stop(30 * time.Second)
	mount := func(args ...string) (*mountproc.Proc, error) {
		mnt, err := freshDir(filepath.Join(o.dir, "untold-mnt"))
		if err != nil {
			return nil, err
		}
		return mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, time.Minute,
			append(append([]string{"mount", "--log-level", "warn"}, args...), pfs.Mnt, mnt)...)
	}
	// loaderRun is one epoch of the example loop with a sampler, directly
	// on pfssim (no args) or through a fresh dlfs mount with args.
	type loaderRun struct {
		name          string
		seconds       float64
		pfs           int64
		hits, planned int64   // reads of the inferred or announced job's plan
		busy          float64 // the share of the machine's CPU time busy during the epoch; NaN: unknown
		rate          float64 // PFS bytes/s from the epoch's first 1% of the dataset read to its 99%; NaN: never reached
	}
	measure := func(what, name, samplerArg string, args []string) (loaderRun, error) {
		data := pfs.Mnt
		var p *mountproc.Proc
		if args != nil {
			var err error
			if p, err = mount(args...); err != nil {
				return loaderRun{}, err
			}
			defer p.Stop(30 * time.Second)
			data = p.Mnt
		}
		fmt.Fprintf(os.Stderr, "measuring: %s DataLoader, %s\n", what, name)
		before, err := pfs.bytes()
		if err != nil {
			return loaderRun{}, err
		}
		watch := pfs.watchRate(before, total)
		rec, err := trainEpoch(o, data, 0, "--sampler", samplerArg)
		rate := watch()
		if err != nil {
			return loaderRun{}, err
		}
		after, err := pfs.bytes()
		if err != nil {
			return loaderRun{}, err
		}
		run := loaderRun{name: name, seconds: rec.Seconds, pfs: after - before, busy: notMeasured, rate: rate}
		if rec.CPUBusy != nil {
			run.busy = *rec.CPUBusy
		}
		if p != nil {
			if run.hits, run.planned, err = allJobReads(p.Mnt); err != nil {
				return loaderRun{}, err
			}
		}
		return run, nil
	}
	ram := []string{"--ram-cache", fmt.Sprint(2 * total)}
	var seqs []loaderRun
	for _, r := range []struct {
		name string
		args []string // nil: pfssim directly
	}{
		{"DataLoader on pfssim directly", nil},
		{"through dlfs, inference off", append(ram, "--infer=false")},
		{"through dlfs", ram},
	} {
		run, err := measure("sequential", r.name, "none", r.args)
		if err != nil {
			return err
		}
		seqs = append(seqs, run)
	}

	// A shuffled DataLoader: torch's DistributedSampler, the default seed,
	// no control line; with the line for reference; and a decoy that
	// starts as that order and then leaves it.
	var shufs []loaderRun
	for _, r := range []struct {
		name, sampler string
		args          []string
	}{
		{"DataLoader on pfssim directly", "torch", nil},
		{"through dlfs, inference off", "torch", append(ram, "--infer=false")},
		{"through dlfs, inferred", "torch", ram},
		{"through dlfs, announced (dlfs.DistributedSampler)", "dlfs", ram},
		{"through dlfs, a decoy order", "decoy", ram},
	} {
		run, err := measure("shuffled", r.name, r.sampler, r.args)
		if err != nil {
			return err
		}
		shufs = append(shufs, run)
	}

	// The same on a busy machine: two threads burn the CPU throughout.
	var busy []loaderRun
	{
		stop := burnCPU(2)
		for _, r := range []struct {
			name string
			args []string
		}{
			{"DataLoader on pfssim directly", nil},
			{"through dlfs, inference off", append(ram, "--infer=false")},
			{"through dlfs, inferred", ram},
		} {
			run, err := measure("shuffled, busy machine,", r.name, "torch", r.args)
			if err != nil {
				stop()
				return err
			}
			busy = append(busy, run)
		}
		stop()
	}

	// dlfs warmup of the whole dataset on a fresh mount, then an epoch of
	// the stock shuffled loop with no line.
	var warmSecs, warmPFS, afterSecs float64
	var afterPFS int64
	{
		p, err := mount(ram...)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "measuring: dlfs warmup, then an epoch\n")
		w, err := warmThenEpoch(pfs.bytes, func() error {
			if out, err := exec.Command(filepath.Join(o.bin, "dlfs"), "warmup", p.Mnt).CombinedOutput(); err != nil {
				return fmt.Errorf("dlfs warmup: %v\n%s", err, out)
			}
			return nil
		}, func() (float64, error) {
			secs, _, err := trainOnce(o, p.Mnt, 0, "--sampler", "torch")
			return secs, err
		})
		p.Stop(30 * time.Second)
		if err != nil {
			return err
		}
		warmSecs, warmPFS, afterSecs, afterPFS = w.warmSecs, float64(w.warmPFS), w.epochSecs, w.epochPFS
	}

	// The looping reader.
	ordered := append([]string(nil), files...)
	sort.Strings(ordered) // ImageFolder order for datagen's class_NNN/img_NNNNNN.jpg
	type loopRun struct {
		eviction string
		hits     []float64 // per pass, the share of reads RAM served
		pfs      []float64 // per pass, PFS bytes over the dataset
	}
	var loops []loopRun
	for _, eviction := range []string{"belady", "lru"} {
		// Staging holds what is prefetched and not yet read, on top of the
		// RAM tier: at its default (256 MiB) the two would hold nearly the
		// whole dataset, and the rows would measure more memory than the
		// RAM tier's half.
		p, err := mount("--ram-cache", fmt.Sprint(total/2), "--staging", loopStaging, "--ram-eviction", eviction)
		if err != nil {
			return err
		}
		run := loopRun{eviction: eviction}
		for pass := 0; pass < loopPasses; pass++ {
			fmt.Fprintf(os.Stderr, "measuring: looping reader, RAM half the dataset, %s, pass %d\n", eviction, pass)
			if err = dropPageCache(p.Mnt, files); err != nil {
				break
			}
			st0, err0 := readStats(p.Mnt)
			b0, err2 := pfs.bytes()
			err = readInOrder(p.Mnt, ordered, 4)
			st1, err1 := readStats(p.Mnt)
			b1, err3 := pfs.bytes()
			if err == nil {
				err = firstErr(err0, err1, err2, err3)
			}
			if err != nil {
				break
			}
			reads := float64(0)
			for _, v := range st1.Served {
				reads += float64(v.Reads)
			}
			for _, v := range st0.Served {
				reads -= float64(v.Reads)
			}
			var hits float64
			for _, t := range []string{"ram", "stage"} {
				hits += float64(st1.Served[t].Reads - st0.Served[t].Reads)
			}
			run.hits = append(run.hits, perUnit(hits, reads))
			run.pfs = append(run.pfs, float64(b1-b0)/float64(total))
		}
		p.Stop(30 * time.Second)
		if err != nil {
			return err
		}
		loops = append(loops, run)
	}

	bound := float64(total) / (o.bandwidth * 1e6)
	fmt.Printf("\n## Untold loaders: no control line (%d files, %.0f MB)\n\n", len(files), float64(total)/1e6)
	fmt.Printf("The busy pfssim of the clairvoyance table (%v per open, %v per read call, %.0f MB/s). "+
		"The example loop with the DataLoader's own SequentialSampler (shuffle=False), 4 workers, batch 32, raw bytes, epoch 0 from a fresh mount.\n\n",
		o.busyOpen, o.busyRead, o.bandwidth)
	fmt.Println("| sequential DataLoader | seconds | × direct | share of the bandwidth bound | PFS rate while it read (share of its bandwidth) | PFS bytes ÷ dataset | machine's CPU busy |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	for _, r := range seqs {
		fmt.Printf("| %s | %.2f | %.2f | %.0f%% | %s MB/s (%s) | %.2f | %s |\n", r.name, r.seconds, seqs[0].seconds/r.seconds, 100*bound/r.seconds,
			show("%.0f", r.rate/1e6), show("%.0f%%", 100*r.rate/(o.bandwidth*1e6)), float64(r.pfs)/float64(total), show("%.0f%%", 100*r.busy))
	}
	fmt.Printf("\nThe same loop with torch's DistributedSampler (the default seed, shuffle=True) and no control line; with the line (dlfs.DistributedSampler) for reference; " +
		"and a decoy sampler that reads as that DistributedSampler for two batches, then in another order. Hits are the reads of the job's plan that did not wait on the PFS.\n\n")
	fmt.Println("| shuffled DataLoader | seconds | × direct | hits of the plan | PFS bytes ÷ dataset |")
	fmt.Println("|---|---:|---:|---:|---:|")
	for _, r := range shufs {
		hits := "—"
		if r.planned > 0 {
			hits = fmt.Sprintf("%.1f%% of %d", 100*float64(r.hits)/float64(r.planned), r.planned)
		}
		fmt.Printf("| %s | %.2f | %.2f | %s | %.3f |\n", r.name, r.seconds, shufs[0].seconds/r.seconds, hits, float64(r.pfs)/float64(total))
	}
	fmt.Printf("\nThe shuffled loop with no line again, on a busy machine (two threads of dlfsbench burn the CPU throughout):\n\n")
	fmt.Println("| shuffled DataLoader, busy machine | seconds | × direct |")
	fmt.Println("|---|---:|---:|")
	for _, r := range busy {
		fmt.Printf("| %s | %.2f | %.2f |\n", r.name, r.seconds, busy[0].seconds/r.seconds)
	}
	fmt.Printf("\n`dlfs warmup` of the whole dataset on a fresh mount: %.2f s (%.0f%% of the bandwidth bound), %.2f× the dataset from the PFS; "+
		"then the stock shuffled loop with no line: %.2f s, %d PFS bytes.\n", warmSecs, 100*bound/warmSecs, warmPFS/float64(total), afterSecs, afterPFS)
	fmt.Printf("\nA reader looping over the dataset in index order (4 threads, one process), RAM tier half the dataset, staging %s, page cache dropped before each pass. "+
		"A pass's PFS bytes include what the prefetcher fetched during it for the next pass:\n\n", loopStaging)
	fmt.Println("| RAM eviction | RAM-served reads, passes 0 … 3 | PFS bytes ÷ dataset, passes 0 … 3 |")
	fmt.Println("|---|---:|---:|")
	for _, l := range loops {
		fmt.Printf("| %s | %s | %s |\n", l.eviction, joinf(l.hits), joinf(l.pfs))
	}
	dlfs := seqs[2]
	fmt.Println()
	fmt.Printf("- sequential DataLoader, no line: %.0f%% of the bandwidth bound (%.2f s; target ≥ 90%%): %s; %.2f× direct; the machine's CPU %s busy; "+
		"from its first 1%% to its last, the PFS ran at %s of its bandwidth\n",
		100*bound/dlfs.seconds, bound, atLeast(bound/dlfs.seconds, 0.9), seqs[0].seconds/dlfs.seconds, show("%.0f%%", 100*dlfs.busy), show("%.0f%%", 100*dlfs.rate/(o.bandwidth*1e6)))
	inf, ann, off, decoy := shufs[2], shufs[3], shufs[1], shufs[4]
	bOff, bInf := busy[0].seconds/busy[1].seconds, busy[0].seconds/busy[2].seconds
	fmt.Printf("- busy machine, no line: %.2f× direct with inference off, %.2f× inferred (target ≥ 1.0): %s\n",
		bOff, bInf, verdict(bOff >= 1 && bInf >= 1, bOff, bInf))
	// With no plan read at all, inference did not happen: the hit target
	// is not met (the reads were counted; there were none of a plan).
	hitShare := "no planned reads"
	if inf.planned > 0 {
		hitShare = fmt.Sprintf("%.1f%% hits", 100*float64(inf.hits)/float64(inf.planned))
	}
	fmt.Printf("- shuffled DataLoader, no line: %.2f× direct with inference off (target ≥ 1.0): %s; inferred %.2f× direct, %.2f× the announced epoch (target ≥ 0.8): %s; %s (target ≥ 95%%): %s\n",
		shufs[0].seconds/off.seconds, atLeast(shufs[0].seconds/off.seconds, 1), shufs[0].seconds/inf.seconds, ann.seconds/inf.seconds,
		atLeast(ann.seconds/inf.seconds, 0.8), hitShare, verdict(inf.planned > 0 && float64(inf.hits) >= 0.95*float64(inf.planned), float64(inf.hits), float64(inf.planned)))
	fmt.Printf("- dlfs warmup: %.0f%% of the bandwidth bound (target ≥ 90%%): %s; the epoch after it read %d PFS bytes (target 0): %s\n",
		100*bound/warmSecs, atLeast(bound/warmSecs, 0.9), afterPFS, verdict(afterPFS == 0, float64(afterPFS)))
	fmt.Printf("- a wrong guess (the decoy): %.1f%% of the dataset read from the PFS beyond once (target ≤ 5%%): %s\n",
		100*(float64(decoy.pfs)/float64(total)-1), atMost(float64(decoy.pfs)/float64(total), 1.05))
	spared := func(pfs []float64) float64 { // over passes 1 on
		if len(pfs) < 2 {
			return notMeasured
		}
		sum := 0.0
		for _, x := range pfs[1:] {
			sum += 1 - x
		}
		return sum / float64(len(pfs)-1)
	}
	fmt.Printf("- looping reader over twice the RAM tier, passes 1-%d: the caches spared the PFS %.2f of the dataset per pass with Belady by the inferred plan "+
		"(target ≥ 0.4; RAM ÷ dataset is 0.5): %s; LRU %.2f\n",
		loopPasses-1, spared(loops[0].pfs), atLeast(spared(loops[0].pfs), 0.4), spared(loops[1].pfs))
	return nil
}

// warmEpoch is what warmThenEpoch measured.
type warmEpoch struct {
	warmSecs  float64
	warmPFS   int64 // PFS bytes during the warm-up
	epochSecs float64
	epochPFS  int64 // PFS bytes during the epoch after it
}

// warmThenEpoch runs warm, then epoch, reading the PFS's byte counter
// before, between and after. Any failure, a counter read's included, is
// its error: no figure is made from a reading that failed.
func warmThenEpoch(pfsBytes func() (int64, error), warm func() error, epoch func() (float64, error)) (warmEpoch, error) {
	var w warmEpoch
	b0, err := pfsBytes()
	if err != nil {
		return w, fmt.Errorf("before the warm-up: %w", err)
	}
	start := time.Now()
	if err := warm(); err != nil {
		return w, err
	}
	w.warmSecs = time.Since(start).Seconds()
	b1, err := pfsBytes()
	if err != nil {
		return w, fmt.Errorf("after the warm-up: %w", err)
	}
	if w.epochSecs, err = epoch(); err != nil {
		return w, err
	}
	b2, err := pfsBytes()
	if err != nil {
		return w, fmt.Errorf("after the epoch: %w", err)
	}
	w.warmPFS, w.epochPFS = b1-b0, b2-b1
	return w, nil
}

// The looping reader's passes, and its staging.
const (
	loopPasses  = 4
	loopStaging = "32MiB"
)

// joinf prints figures as "a / b / c".
func joinf(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = show("%.2f", x)
	}
	return strings.Join(parts, " / ")
}

// burnCPU keeps threads goroutines spinning on their own OS threads until
// the returned function is called.
func burnCPU(threads int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < threads; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			x := uint64(1)
			for {
				select {
				case <-done:
					sink.Store(x)
					return
				default:
				}
				for j := 0; j < 1<<16; j++ {
					x = x*6364136223846793005 + 1442695040888963407
				}
			}
		}()
	}
	return func() { close(done); wg.Wait() }
}

// sink keeps burnCPU's arithmetic from being optimised away.
var sink atomic.Uint64

// allJobReads sums the planned reads of every job on a mount, announced
// or inferred: those that did not wait on the PFS, and all.
func allJobReads(mnt string) (hits, planned int64, err error) {
	st, err := readStats(mnt)
	if err != nil {
		return 0, 0, fmt.Errorf("the jobs' reads: %w", err)
	}
	for _, ranks := range st.Jobs {
		for _, r := range ranks {
			hits += r.Hits
			planned += r.Hits + r.Late + r.Misses
		}
	}
	return hits, planned, nil
}

// readInOrder reads files under root in the given order with workers
// threads of this one process, each taking the next file.
func readInOrder(root string, files []string, workers int) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		next int
		fail error
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1<<20)
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= len(files) {
					return
				}
				if _, err := readFile(filepath.Join(root, files[i]), buf); err != nil {
					mu.Lock()
					fail = err
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return fail
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
