package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/dlfs/dlfs/test/mountproc"
	"golang.org/x/sys/unix"
)

// The packed suite (issue 5): dlfs pack against tar over the benchmark
// tree, then one shuffled epoch of the example script over a packed copy
// behind pfssim, through dlfs with clairvoyance, with and without chunk
// coalescing. pfssim adds a latency to every read call, so the PFS read
// calls per sample decide the epoch time.

type packedRun struct {
	label   string
	seconds float64
	samples int
	calls   int64 // pfssim read calls
	bytes   int64
}

func runPacked(o options, src string, files []string, total int64) error {
	// Pack and tar the same tree, each from a cold page cache.
	packDir := filepath.Join(o.dir, "packed")
	tarFile := filepath.Join(o.dir, "source.tar")
	os.RemoveAll(packDir)
	os.Remove(tarFile)
	timed := func(name string, args ...string) (float64, error) {
		// Earlier suites leave dirty pages (SSD tiers, packs); dlfs pack
		// fsyncs its shards and would wait for them too.
		unix.Sync()
		if err := dropPageCache(src, files); err != nil {
			return 0, err
		}
		fmt.Fprintf(os.Stderr, "measuring: %s\n", name)
		start := time.Now()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			return 0, fmt.Errorf("%s: %v\n%s", name, err, out)
		}
		return time.Since(start).Seconds(), nil
	}
	packSec, err := timed("dlfs pack", filepath.Join(o.bin, "dlfs"), "pack", src, packDir, "--shards", "16", "--workers", "8")
	if err != nil {
		return err
	}
	tarSec, err := timed("tar", "tar", "cf", tarFile, "-C", filepath.Dir(src), filepath.Base(src))
	if err != nil {
		return err
	}
	os.Remove(tarFile)

	pfs, err := startSim(o, "packed-pfs", packDir, "-open-latency", o.busyOpen.String(), "-read-latency", o.busyRead.String(),
		"-bandwidth-mbps", fmt.Sprint(o.bandwidth), "-max-inflight", "256")
	if err != nil {
		return err
	}
	defer pfs.Stop(30 * time.Second)
	var runs []packedRun
	for _, c := range []struct {
		label string
		flags []string
	}{
		{"dlfs over the pack, one request per sample", []string{"--coalesce=false"}},
		{"dlfs over the pack, coalescing neighbours", nil},
	} {
		mnt, err := freshDir(filepath.Join(o.dir, "mnt-packed"))
		if err != nil {
			return err
		}
		args := append([]string{"mount", "--ram-cache", "2GiB", "--staging", "256MiB", "--log-level", "warn"}, c.flags...)
		d, err := mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, time.Minute, append(args, pfs.Mnt, mnt)...)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "measuring: %s\n", c.label)
		before, err := pfs.PFSCounters(pfs.stats, 10*time.Second)
		if err == nil {
			r := packedRun{}
			r.seconds, r.samples, err = trainOnce(o, mnt, 0)
			after, cerr := pfs.PFSCounters(pfs.stats, 10*time.Second)
			if err == nil {
				err = cerr
			}
			r.label, r.calls, r.bytes = c.label, after.ReadOps-before.ReadOps, after.Bytes-before.Bytes
			runs = append(runs, r)
		}
		if serr := d.Stop(30 * time.Second); err == nil {
			err = serr
		}
		if err != nil {
			return err
		}
	}

	fmt.Printf("\n## Packed datasets: dlfs pack, and a shuffled epoch over a pack with chunk coalescing\n\n")
	fmt.Printf("`dlfs pack` (16 shards, 8 workers) and `tar cf` of the same %.0f MB tree, each from a cold page cache:\n\n", float64(total)/1e6)
	fmt.Println("| tool | seconds | MB/s |")
	fmt.Println("|---|---:|---:|")
	fmt.Printf("| dlfs pack | %.2f | %.0f |\n", packSec, float64(total)/1e6/packSec)
	fmt.Printf("| tar cf | %.2f | %.0f |\n", tarSec, float64(total)/1e6/tarSec)
	fmt.Printf("\nOne epoch of the example script (ImageFolder, DistributedSampler, 4 workers, batch 32) over the pack through dlfs "+
		"with the control line; pfssim serves the shards with %v per open, %v per read call (a call reads up to 1 MiB), %.0f MB/s.\n\n",
		o.busyOpen, o.busyRead, o.bandwidth)
	fmt.Println("| reader | seconds | samples/s | PFS read calls | calls per sample | PFS MB |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	for _, r := range runs {
		fmt.Printf("| %s | %.2f | %.0f | %d | %.2f | %.0f |\n", r.label, r.seconds, float64(r.samples)/r.seconds, r.calls,
			float64(r.calls)/float64(max(r.samples, 1)), float64(r.bytes)/1e6)
	}
	if len(runs) == 2 {
		off, on := runs[0], runs[1]
		per := perUnit(float64(on.calls), float64(on.samples)) // an epoch of no samples measured nothing
		fmt.Printf("\n- PFS read calls per sample: %s with coalescing, %s without (target ≤ 0.5 against 1): %s\n",
			show("%.2f", per), show("%.2f", perUnit(float64(off.calls), float64(off.samples))), atMost(per, 0.5))
		fmt.Printf("- epoch time: %.2f s with coalescing, %.2f s without (%.1f×)\n", on.seconds, off.seconds, off.seconds/on.seconds)
		fmt.Printf("- dlfs pack: %.0f MB/s, tar: %.0f MB/s (%.2f×)\n", float64(total)/1e6/packSec, float64(total)/1e6/tarSec, tarSec/packSec)
	}
	return nil
}

// trainOnce runs one epoch (epoch) of the example script, rank 0 of 1,
// over data with 4 workers and batches of 32, and returns the seconds and
// samples it recorded.
func trainOnce(o options, data string, epoch int, extra ...string) (seconds float64, samples int, err error) {
	r, err := trainEpoch(o, data, epoch, extra...)
	return r.Seconds, r.Samples, err
}

// trainEpoch runs one epoch of the example loop over data and returns its
// record.
func trainEpoch(o options, data string, epoch int, extra ...string) (epochRecord, error) {
	rec := filepath.Join(o.dir, "record.json")
	cmd := exec.Command("/usr/bin/python3", filepath.Join(o.examples, "train_imagefolder.py"), "--data", data,
		"--epochs", "1", "--start-epoch", fmt.Sprint(epoch), "--workers", "4", "--batch", "32", "--raw", "--record", rec)
	cmd.Args = append(cmd.Args, extra...)
	cmd.Env = append(os.Environ(), "RANK=0", "WORLD_SIZE=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return epochRecord{}, fmt.Errorf("train over %s, epoch %d: %v\n%s", data, epoch, err, out)
	}
	var r []epochRecord
	b, err := os.ReadFile(rec)
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	if err != nil || len(r) != 1 {
		return epochRecord{}, fmt.Errorf("bad record %s: %v", rec, err)
	}
	return r[0], nil
}
