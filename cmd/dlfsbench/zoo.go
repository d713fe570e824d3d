package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/dlfs/dlfs/test/mountproc"
)

// The zoo suite (issue 29, started): samples of other shapes than
// ImageNet's, each read whole in a shuffled order by 2 readers with no
// control line, directly from pfssim and through a fresh dlfs mount, side
// by side, in reads of 1 MiB (as numpy.load or a tar reader asks for large
// files); dlfs's PFS bytes and opens include what its mount reads for
// the dataset's identity. pfssim here is issue 29's PFS: 10 ms per
// open, 1 ms per read call, 400 MB/s. So far two shapes: 32 MiB samples and numpy .npz files
// of 1 MiB + a 498-byte header. Issue 29 adds shards, HDF5 rows and a
// sequential scan.

// zooShape is one workload: files of a size.
type zooShape struct {
	name  string
	files int
	size  int64
}

var zooShapes = []zooShape{
	{"32 MiB samples", 24, 32 << 20},
	{".npz files of 1 MiB + 498 B", 200, 1<<20 + 498},
}

// zooRow is one reader over one shape.
type zooRow struct {
	shape, reader string
	seconds       float64
	pfsBytes      int64
	opens         int64
	cpu           float64 // dlfs's CPU-seconds; NaN for direct
}

func runZoo(o options) error {
	var rows []zooRow
	for _, sh := range zooShapes {
		src, files, err := zooDataset(o, sh)
		if err != nil {
			return err
		}
		for _, reader := range []string{"direct", "dlfs, no control line"} {
			fmt.Fprintf(os.Stderr, "measuring: zoo, %s, %s\n", sh.name, reader)
			r, err := zooRun(o, sh, src, files, reader == "direct")
			if err != nil {
				return err
			}
			r.shape, r.reader = sh.name, reader
			rows = append(rows, r)
		}
	}
	fmt.Printf("\n## Zoo: samples of other shapes, no control line (issue 29, started)\n\n")
	fmt.Printf("Each shape read whole in a shuffled order by 2 readers, page cache dropped first, over pfssim with 10 ms per open, " +
		"1 ms per read call and 400 MB/s; dlfs mounted afresh for each row (`--ram-cache 64MiB`).\n\n")
	fmt.Println("| shape | reader | seconds | ÷ direct | PFS bytes ÷ dataset | PFS opens per file | dlfs CPU-s per GB |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|")
	direct := map[string]float64{}
	for _, r := range rows {
		if r.reader == "direct" {
			direct[r.shape] = r.seconds
		}
	}
	for _, sh := range zooShapes {
		total := float64(sh.files) * float64(sh.size)
		for _, r := range rows {
			if r.shape != sh.name {
				continue
			}
			fmt.Printf("| %s | %s | %.2f | %s | %.3f | %.2f | %s |\n", r.shape, r.reader, r.seconds,
				show("%.2f", perUnit(direct[r.shape], r.seconds)), float64(r.pfsBytes)/total, float64(r.opens)/float64(sh.files),
				show("%.2f", perUnit(r.cpu, total/1e9)))
		}
	}
	fmt.Println()
	for _, r := range rows {
		if r.reader != "direct" {
			ratio := perUnit(direct[r.shape], r.seconds)
			fmt.Printf("- %s, epoch 0 with no control line: %s direct (target at least 1.0x): %s\n", r.shape, show("%.2fx", ratio), atLeast(ratio, 1.0))
		}
	}
	return nil
}

// zooDataset makes (once) DIR/zoo-N, sh.files files of sh.size random
// bytes.
func zooDataset(o options, sh zooShape) (string, []string, error) {
	dir := filepath.Join(o.dir, fmt.Sprintf("zoo-%d-%d", sh.files, sh.size))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	rng := rand.New(rand.NewChaCha8([32]byte{byte(sh.files), byte(sh.size)}))
	var files []string
	for i := range sh.files {
		name := fmt.Sprintf("s%04d.bin", i)
		files = append(files, name)
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Size() == sh.size {
			continue
		}
		b := make([]byte, sh.size)
		for j := 0; j+8 <= len(b); j += 8 {
			v := rng.Uint64()
			for k := range 8 {
				b[j+k] = byte(v >> (8 * k))
			}
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return "", nil, err
		}
	}
	return dir, files, nil
}

// zooRun reads sh once, directly or through a fresh dlfs.
func zooRun(o options, sh zooShape, src string, files []string, direct bool) (zooRow, error) {
	pfs, err := startSim(o, "zoo-pfs", src, "-open-latency", "10ms", "-read-latency", "1ms", "-bandwidth-mbps", "400")
	if err != nil {
		return zooRow{}, err
	}
	defer pfs.Stop(30 * time.Second)
	root, r := pfs.Mnt, zooRow{cpu: notMeasured}
	// Counted from before the mount: its reads of the dataset identity's
	// heads (and the files they leave open) are part of what dlfs costs.
	before, err := pfs.PFSCounters(pfs.stats, 10*time.Second)
	if err != nil {
		return r, err
	}
	var d *mountproc.Proc
	if !direct {
		mnt, err := freshDir(filepath.Join(o.dir, "zoo-mnt"))
		if err != nil {
			return r, err
		}
		d, err = mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, time.Minute, "mount", "--log-level", "warn", "--ram-cache", "64MiB", pfs.Mnt, mnt)
		if err != nil {
			return r, err
		}
		defer d.Stop(30 * time.Second)
		root = mnt
	}
	syscall.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200); err != nil {
		return r, fmt.Errorf("zoo: drop the page cache (needs root): %w", err)
	}
	var cpu0 cpuTime
	if d != nil {
		if cpu0, err = cpuOf(d.Cmd.Process.Pid); err != nil {
			return r, err
		}
	}
	got, err := readAllBy(root, files, 2, 29, 1<<20) // reads of 1 MiB, as numpy.load or a tar reader asks
	if err != nil {
		return r, err
	}
	if want := int64(len(files)) * sh.size; got.bytes != want {
		return r, fmt.Errorf("zoo: read %d bytes of %s, want %d", got.bytes, sh.name, want)
	}
	after, err := pfs.PFSCounters(pfs.stats, 10*time.Second)
	if err != nil {
		return r, err
	}
	if d != nil {
		c, err := cpuOf(d.Cmd.Process.Pid)
		if err != nil {
			return r, err
		}
		d := c.minus(cpu0)
		r.cpu = d.user + d.sys
	}
	r.seconds = got.elapsed.Seconds()
	r.pfsBytes, r.opens = after.Bytes-before.Bytes, after.Opens-before.Opens
	return r, nil
}
