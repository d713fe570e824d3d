package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/dlfs/dlfs/test/mountproc"
)

// The observe suite (issue 16): what the latency histograms and the
// access log cost the read path. The same mount, with
// --latency-histograms on and off, in alternating order over three
// rounds: a clairvoyant epoch 0 of the example loop over the busy pfssim
// (cold caches), and a warm epoch of raw reads from the RAM tier with the
// page cache dropped; then the warm epoch once more with a reader attached
// to .dlfs/accesslog. Pushing is off, so that every read of both epochs
// reaches dlfs and is timed: the worst case for the histograms.

// observeRounds is how many times each mode is measured; the median is
// kept.
const observeRounds = 5

func runObserve(o options, src string, files []string, total int64) error {
	pfs, err := startSim(o, "observe-pfs", src, "-open-latency", o.busyOpen.String(), "-read-latency", o.busyRead.String(),
		"-bandwidth-mbps", fmt.Sprint(o.bandwidth), "-max-inflight", "256")
	if err != nil {
		return err
	}
	defer pfs.Stop(30 * time.Second)

	type figures struct{ epoch0, warm []float64 } // seconds, files/s
	by := map[string]*figures{"on": {}, "off": {}, "on, access log read": {}}
	// measure mounts dlfs with flags, runs both epochs and records them
	// under mode; with log, a reader drains .dlfs/accesslog during the
	// warm epoch.
	measure := func(mode string, log bool, flags ...string) error {
		fmt.Fprintf(os.Stderr, "observe: histograms %s ...\n", mode)
		mnt, err := freshDir(filepath.Join(o.dir, "observe-mnt"))
		if err != nil {
			return err
		}
		args := append([]string{"mount", "--ram-cache", "2GiB", "--push=false", "--log-level", "warn"}, flags...)
		d, err := mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, time.Minute, append(args, pfs.Mnt, mnt)...)
		if err != nil {
			return err
		}
		defer d.Stop(time.Minute)
		secs, _, err := trainOnce(o, mnt, 0, "--job", "observe")
		if err != nil {
			return err
		}
		by[mode].epoch0 = append(by[mode].epoch0, secs)
		var cat *exec.Cmd
		if log {
			cat = exec.Command("cat", filepath.Join(mnt, ".dlfs", "accesslog"))
			if err := cat.Start(); err != nil { // its output goes to /dev/null
				return err
			}
			defer func() { _ = cat.Process.Kill(); _ = cat.Wait() }()
			if err := waitLogged(mnt, files[0]); err != nil {
				return err
			}
		}
		if err := dropPageCache(mnt, files); err != nil {
			return err
		}
		r, err := readAll(mnt, files, o.workers, 7)
		if err != nil {
			return err
		}
		by[mode].warm = append(by[mode].warm, r.filesPerSec())
		return nil
	}
	for round := range observeRounds {
		modes := []string{"on", "off"}
		if round%2 == 1 {
			modes = []string{"off", "on"}
		}
		for _, m := range modes {
			if err := measure(m, false, "--latency-histograms="+fmt.Sprint(m == "on")); err != nil {
				return err
			}
		}
	}
	if err := measure("on, access log read", true); err != nil {
		return err
	}

	median := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[len(s)/2]
	}
	on, off, logged := by["on"], by["off"], by["on, access log read"]
	fmt.Printf("\n## Observability's cost to the read path (issue 16)\n\n")
	fmt.Printf("%d files (%.0f MB) over pfssim at %v an open; `--push=false`, so every read reaches dlfs; the median of %d mounts each, alternating on and off. Epoch 0: the example loop (4 workers, batch 32, clairvoyant), cold caches. Warm epoch: %d threads reading every file from the RAM tier, page cache dropped.\n\n",
		len(files), float64(total)/1e6, o.busyOpen, observeRounds, o.workers)
	fmt.Println("| histograms | epoch 0, seconds | warm epoch, files/s |")
	fmt.Println("|---|---:|---:|")
	fmt.Printf("| off | %.2f | %.0f |\n", median(off.epoch0), median(off.warm))
	fmt.Printf("| on | %.2f | %.0f |\n", median(on.epoch0), median(on.warm))
	fmt.Printf("| on, and a reader on `.dlfs/accesslog` (one run) | %.2f | %.0f |\n", logged.epoch0[0], logged.warm[0])
	fmt.Println()
	fmt.Printf("- on ÷ off: epoch 0 takes %.2f× the time, the warm epoch runs at %.2f× the rate (target: no cost beyond the runs' noise; rounds: epoch 0 %s s on, %s s off; warm %s on, %s off)\n",
		median(on.epoch0)/median(off.epoch0), median(on.warm)/median(off.warm),
		fmtList(on.epoch0, "%.2f"), fmtList(off.epoch0, "%.2f"), fmtList(on.warm, "%.0f"), fmtList(off.warm, "%.0f"))
	fmt.Printf("- with the access log read, the warm epoch runs at %.2f× the rate with histograms alone\n", logged.warm[0]/median(on.warm))
	return nil
}

// waitLogged waits until stats show the access log's reader attached (the
// daemon looks for one every 200 ms), reading file meanwhile.
func waitLogged(mnt, file string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := readStats(mnt)
		if err != nil {
			return err
		}
		if st.AccessLog.Attached {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the access log's reader did not attach to %s", mnt)
		}
		if _, err := os.ReadFile(filepath.Join(mnt, file)); err != nil {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fmtList prints xs with format f, comma-separated.
func fmtList(xs []float64, f string) string {
	out := ""
	for i, x := range xs {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf(f, x)
	}
	return out
}
