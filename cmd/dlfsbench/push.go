package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/dlfs/dlfs/daemon"
	"github.com/dlfs/dlfs/test/mountproc"
)

// The push suite (issue 14): a reader that reads an announced job's order
// with the page cache dropped, so every sample comes from dlfs's RAM
// tier, with pushing into the page cache on and off, against the same
// reader on SOURCE's page-cached files in the same order.

type pushRun struct {
	label   string
	rate    float64 // files/s, the median epoch
	cpu     cpuTime // the daemon's, over that epoch
	pushed  int64   // samples pushed ahead of the reads in it
	reached int64   // reads of planned samples that reached dlfs in it
}

func runPush(o options, src string, files []string, total int64) error {
	const epochs = 3
	var runs []pushRun
	var order []string // epoch 1's order, for the native reader
	for _, c := range []struct {
		label   string
		staging string
		flags   []string
	}{
		{"dlfs, pushing off (--push=false)", "256MiB", []string{"--push=false"}},
		{"dlfs, pushing on (default)", "256MiB", nil},
		{"dlfs, pushing on, --staging 1GiB (an epoch ahead)", "1GiB", nil},
	} {
		mnt, err := freshDir(filepath.Join(o.dir, "mnt-push"))
		if err != nil {
			return err
		}
		args := append([]string{"mount", "--ram-cache", "2GiB", "--staging", c.staging, "--log-level", "warn"}, c.flags...)
		d, err := mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, time.Minute, append(args, src, mnt)...)
		if err != nil {
			return err
		}
		var per []pushRun
		err = func() error {
			fmt.Fprintf(os.Stderr, "measuring: %s\n", c.label)
			if _, err := readAll(mnt, files, o.workers, 11); err != nil { // fills the RAM tier
				return err
			}
			for epoch := 1; epoch <= epochs; epoch++ {
				// The page cache is dropped before the announcement: the
				// prefetcher pushes as soon as it knows the order.
				if err := dropPageCache(mnt, files); err != nil {
					return err
				}
				start, err := readStats(mnt)
				if err != nil {
					return err
				}
				line := fmt.Sprintf("job=push root=. seed=5 epoch=%d world=1 ranks=0 batch=32 workers=1\n", epoch)
				if err := os.WriteFile(filepath.Join(mnt, ".dlfs/control"), []byte(line), 0); err != nil {
					return fmt.Errorf("announce: %w", err)
				}
				ord, err := planOrder(mnt, "push", epoch)
				if err != nil {
					return err
				}
				if len(ord) != len(files) {
					return fmt.Errorf("epoch %d: the plan has %d files, want %d", epoch, len(ord), len(files))
				}
				if order == nil {
					order = ord
				}
				before, err := settle(mnt)
				pushedBefore := start.Jobs["push"]["rank-0"].Pushed // pushes count from the announcement
				if err != nil {
					return err
				}
				cpu0, err := cpuOf(d.Cmd.Process.Pid)
				if err != nil {
					return err
				}
				r, err := readOrdered(mnt, ord, o.workers)
				if err != nil {
					return err
				}
				cpu1, err := cpuOf(d.Cmd.Process.Pid)
				if err != nil {
					return err
				}
				after, err := readStats(mnt)
				if err != nil {
					return err
				}
				job := after.Jobs["push"]["rank-0"]
				per = append(per, pushRun{label: c.label, rate: r.filesPerSec(),
					cpu:     cpu1.minus(cpu0),
					pushed:  job.Pushed - pushedBefore,
					reached: servedReads(after) - servedReads(before)})
			}
			return nil
		}()
		if serr := d.Stop(30 * time.Second); err == nil {
			err = serr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", c.label, err)
		}
		sort.Slice(per, func(i, j int) bool { return per[i].rate < per[j].rate })
		runs = append(runs, per[len(per)/2])
	}

	// Native: the same reader, in the same order, on page-cached SOURCE.
	var native []float64
	if _, err := readOrdered(src, order, o.workers); err != nil {
		return err
	}
	for i := 0; i < 5; i++ {
		r, err := readOrdered(src, order, o.workers)
		if err != nil {
			return err
		}
		native = append(native, r.filesPerSec())
	}
	sort.Float64s(native)
	nat := native[len(native)/2]

	fmt.Printf("\n## Announced samples pushed into the page cache (%d files, %.0f MB, %d reader threads)\n\n", len(files), float64(total)/1e6, o.workers)
	fmt.Printf("Each dlfs epoch: the job announces it, the page cache is dropped, the prefetcher settles, and the reader reads the epoch's order; "+
		"every sample is in dlfs's RAM tier. The median of %d epochs. Native: the same reader and order on SOURCE, page cache warm (median of 5).\n\n", epochs)
	fmt.Println("| reader | files/s | × native page cache | pushed ahead | reads reaching dlfs | dlfs CPU s per GB |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	fmt.Printf("| native, page cache | %.0f | 1.00 | - | - | - |\n", nat)
	gb := float64(total) / 1e9
	for _, r := range runs {
		fmt.Printf("| %s | %.0f | %.2f | %d | %d | %.2f |\n", r.label, r.rate, r.rate/nat, r.pushed, r.reached, (r.cpu.user+r.cpu.sys)/gb)
	}
	on := runs[1].rate / nat
	fmt.Printf("\n- announced samples, page cache otherwise cold, pushing on: %.2f× native page-cache files/s (target ≥ 0.8×): %s; "+
		"pushing off %.2f×; an epoch of staging ahead %.2f×\n", on, atLeast(on, 0.8), runs[0].rate/nat, runs[2].rate/nat)
	return nil
}

// planOrder reads the predicted read order of rank 0 of job in epoch.
func planOrder(mnt, job string, epoch int) ([]string, error) {
	f, err := os.Open(filepath.Join(mnt, ".dlfs/jobs", job, "rank-0", fmt.Sprintf("epoch-%d", epoch)))
	if err != nil {
		return nil, fmt.Errorf("the plan: %w", err)
	}
	defer f.Close()
	var out []string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		out = append(out, strings.TrimPrefix(sc.Text(), "/"))
	}
	return out, nil
}

// settle waits until the prefetcher has nothing in flight and its pushes
// stopped moving (it holds what staging allows), and returns the stats
// then.
func settle(mnt string) (daemon.Stats, error) {
	deadline := time.Now().Add(60 * time.Second)
	var last daemon.Stats
	stable := 0
	for time.Now().Before(deadline) {
		st, err := readStats(mnt)
		if err != nil {
			return st, err
		}
		if st.Prefetch.InFlight == 0 && st.Prefetch.Pushed == last.Prefetch.Pushed &&
			st.Prefetch.Fetched == last.Prefetch.Fetched && st.Prefetch.PushCached == last.Prefetch.PushCached {
			if stable++; stable >= 5 {
				return st, nil
			}
		} else {
			stable = 0
		}
		last = st
		time.Sleep(20 * time.Millisecond)
	}
	return last, fmt.Errorf("the prefetcher did not settle in 60 s")
}

// servedReads is the number of reads dlfs answered, over every tier.
func servedReads(st daemon.Stats) int64 {
	var n int64
	for _, s := range st.Served {
		n += s.Reads
	}
	return n
}
