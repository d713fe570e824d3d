// Command dlfsbench measures dlfs against the alternatives in one run and
// prints a markdown table with ratios to native reads (make bench).
//
// It generates an ImageFolder-like dataset, mounts pfssim over it as a
// stand-in for a busy parallel filesystem, and reads every file with N
// threads in a fresh shuffled order per row, as a DataLoader with N workers
// does: open, read to EOF, close.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/daemon"
	"github.com/dlfs/dlfs/test/mountproc"
	"github.com/dlfs/dlfs/test/pfssim"
)

type options struct {
	dir         string
	bin         string
	files       int
	workers     int
	openLatency time.Duration
	readLatency time.Duration
	bandwidth   float64
	genOnly     bool
	suites      string
	examples    string
	busyOpen    time.Duration
	busyRead    time.Duration
	simOut      string
	scaleFiles  int
	scaleDir    string
	floorMnt    string
	floorSrc    string
	floorPT     bool
	zoo         string
	pfsTrace    string
}

func main() {
	var o options
	flag.StringVar(&o.dir, "dir", filepath.Join(os.TempDir(), "dlfsbench"), "work directory (the dataset is kept for reuse)")
	flag.StringVar(&o.bin, "bin", "bin", "directory holding the dlfs and pfssim binaries")
	flag.IntVar(&o.files, "files", 5000, "files in the dataset (sizes 110 KB ± 40 KB)")
	flag.IntVar(&o.workers, "workers", 4, "reader threads")
	flag.DurationVar(&o.openLatency, "pfs-open-latency", 2*time.Millisecond, "pfssim latency per open")
	flag.DurationVar(&o.readLatency, "pfs-read-latency", 200*time.Microsecond, "pfssim latency per read call")
	flag.Float64Var(&o.bandwidth, "pfs-bandwidth-mbps", 300, "pfssim aggregate bandwidth in MB/s")
	flag.BoolVar(&o.genOnly, "gen-only", false, "only generate the dataset under DIR/source")
	flag.StringVar(&o.suites, "suites", "all", "which tables to measure: a comma list of suite names (listed below), all: the default set")
	flag.StringVar(&o.examples, "examples", "examples", "directory of train_imagefolder.py")
	flag.DurationVar(&o.busyOpen, "busy-open-latency", 20*time.Millisecond, "clairvoyance suite: pfssim latency per open")
	flag.DurationVar(&o.busyRead, "busy-read-latency", time.Millisecond, "clairvoyance suite: pfssim latency per read call")
	flag.StringVar(&o.simOut, "simulate-out", "docs/simulate", "simulate suite: directory for the plots and CSV files")
	flag.IntVar(&o.scaleFiles, "scale-files", 1_000_000, "scale suite (make bench-scale; not in the default suites): files in its tree")
	flag.StringVar(&o.scaleDir, "scale-dir", "", "scale suite: work directory, the tree kept for reuse (default DIR/scale-N)")
	flag.StringVar(&o.floorMnt, "serve-floor", "", "serve the scale suite's FUSE floor over this mountpoint until SIGTERM (used by the scale suite)")
	flag.StringVar(&o.zoo, "zoo", "", "zoo suite: only the workloads whose dataset keys are listed (comma list: imagenet, npz, samples-32mib, shards, hdf5; the scan is samples-32mib too); empty: all")
	flag.StringVar(&o.pfsTrace, "pfs-trace", "", "directory where each pfssim started writes the reads it served (NAME-N.trace: path, offset, bytes), for finding bytes read twice")
	flag.StringVar(&o.floorSrc, "floor-src", "", "with -serve-floor: the tree whose names and sizes it shows")
	flag.BoolVar(&o.floorPT, "floor-passthrough", false, "with -serve-floor: answer OPEN by passthrough from a memory file per file, registered once (the per-open floor)")
	var reader readerFlags
	var readSeed uint64
	addReaderFlags(&reader, &readSeed)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage of %s:\n", os.Args[0])
		flag.PrintDefaults()
		printSuites(flag.CommandLine.Output())
	}
	flag.Parse()
	if reader.root != "" {
		if err := runReader(reader.root, reader.sums, readSeed); err != nil {
			fmt.Fprintln(os.Stderr, "dlfsbench:", err)
			os.Exit(1)
		}
		return
	}
	if o.floorMnt != "" {
		if err := serveFloor(o.floorSrc, o.floorMnt, o.floorPT); err != nil {
			fmt.Fprintln(os.Stderr, "dlfsbench:", err)
			os.Exit(1)
		}
		return
	}
	if err := runSuites(o); err != nil {
		fmt.Fprintln(os.Stderr, "dlfsbench:", err)
		os.Exit(1)
	}
}

// row is one measured configuration.
type row struct {
	name     string
	files    int
	bytes    int64
	elapsed  time.Duration
	pfsBytes int64 // per pass; -1: not applicable
	passes   int   // the row is the median of this many passes
}

func (r row) filesPerSec() float64 { return float64(r.files) / r.elapsed.Seconds() }
func (r row) mbPerSec() float64    { return float64(r.bytes) / 1e6 / r.elapsed.Seconds() }

// runMount measures the mount suite (issue 2): raw reads of every file.
func runMount(o options, src string, files []string, total int64) error {

	pfs, err := startSim(o, "pfs", src, "-open-latency", o.openLatency.String(), "-read-latency", o.readLatency.String(),
		"-bandwidth-mbps", fmt.Sprint(o.bandwidth))
	if err != nil {
		return err
	}
	defer pfs.Stop(30 * time.Second)
	pfsMnt, pfsBytes := pfs.Mnt, pfs.bytes

	var rows []row
	// measureN reads the dataset passes times (each pass after prepare, if
	// given) and keeps the median pass: a warm pass takes well under a
	// second, so a single one is at the mercy of the noisy machine.
	measureN := func(name, root string, seed uint64, counted bool, passes int, prepare func() error) error {
		fmt.Fprintf(os.Stderr, "measuring: %s\n", name)
		before := int64(0)
		if counted {
			var err error
			if before, err = pfsBytes(); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		var runs []row
		for i := 0; i < passes; i++ {
			if prepare != nil {
				if err := prepare(); err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
			}
			r, err := readAll(root, files, o.workers, seed+uint64(i)*1000)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			runs = append(runs, r)
		}
		sort.Slice(runs, func(i, j int) bool { return runs[i].elapsed < runs[j].elapsed })
		r := runs[len(runs)/2]
		r.name, r.pfsBytes, r.passes = name, -1, passes
		if counted {
			after, err := pfsBytes()
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			r.pfsBytes = (after - before) / int64(passes)
		}
		rows = append(rows, r)
		return nil
	}
	measure := func(name, root string, seed uint64, counted bool) error {
		return measureN(name, root, seed, counted, 1, nil)
	}

	// Native: SOURCE from a warm page cache, the ceiling.
	if _, err := readAll(src, files, o.workers, 99); err != nil {
		return err
	}
	if err := measureN("native read of SOURCE (page cache)", src, 1, false, 5, nil); err != nil {
		return err
	}
	if err := measure("direct read through pfssim", pfsMnt, 2, true); err != nil {
		return err
	}

	ssd := filepath.Join(o.dir, "ssd")
	os.RemoveAll(ssd)
	dlfsArgs := func(mnt string) []string {
		return []string{"mount", "--ram-cache", "2GiB", "--ssd-cache", ssd, "--ssd-cache-size", "4GiB",
			"--log-level", "warn", pfsMnt, mnt}
	}
	mnt, err := freshDir(filepath.Join(o.dir, "mnt"))
	if err != nil {
		return err
	}
	d, err := mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, time.Minute, dlfsArgs(mnt)...)
	if err != nil {
		return err
	}
	meta := []metaRow{walkStat("native SOURCE", src, 3)}
	meta = append(meta, walkStat("dlfs, first walk after mount", mnt, 1), walkStat("dlfs, later walks", mnt, 3))
	scan := notMeasured
	if st, err := readStats(mnt); err == nil {
		scan = st.Catalog.ScanSeconds
	}
	if err := measure("dlfs epoch 1 over pfssim (cold)", mnt, 3, true); err != nil {
		d.Stop(30 * time.Second)
		return err
	}
	if err := measureN("dlfs epoch 2 (page cache and RAM warm)", mnt, 4, true, 5, nil); err != nil {
		d.Stop(30 * time.Second)
		return err
	}
	drop := func() error { return dropPageCache(mnt, files) }
	if err := measureN("dlfs from the RAM tier (page cache dropped)", mnt, 5, true, 3, drop); err != nil {
		d.Stop(30 * time.Second)
		return err
	}
	if err := d.Stop(30 * time.Second); err != nil {
		return err
	}
	d, err = mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, time.Minute, dlfsArgs(mnt)...)
	if err != nil {
		return err
	}
	err = measure("dlfs after remount (SSD warm)", mnt, 6, true)
	if serr := d.Stop(30 * time.Second); err == nil {
		err = serr
	}
	if err != nil {
		return err
	}

	printTable(o, rows, total)
	fmt.Printf("\n### Metadata: walk the tree and lstat every entry (1 thread)\n\n")
	fmt.Println("| tree | entries/s | × native |")
	fmt.Println("|---|---:|---:|")
	for _, m := range meta {
		if m.err != nil {
			fmt.Printf("| %s | error: %v | |\n", m.name, m.err)
			continue
		}
		fmt.Printf("| %s | %.0f | %.2f |\n", m.name, m.perSec(), m.perSec()/meta[0].perSec())
	}
	fmt.Printf("\nCatalog scan of SOURCE through pfssim at mount: %s s for %d files.\n", show("%.3f", scan), o.files)
	return nil
}

type metaRow struct {
	name    string
	entries int
	elapsed time.Duration
	err     error
}

func (m metaRow) perSec() float64 { return float64(m.entries) / m.elapsed.Seconds() }

// walkStat walks root and lstats every entry, as "ls -lR" or os.walk do,
// passes times, and returns the median pass.
func walkStat(name, root string, passes int) metaRow {
	var runs []metaRow
	for i := 0; i < passes; i++ {
		start := time.Now()
		n := 0
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if _, err := os.Lstat(p); err != nil {
				return err
			}
			n++
			return nil
		})
		runs = append(runs, metaRow{name: name, entries: n, elapsed: time.Since(start), err: err})
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].elapsed < runs[j].elapsed })
	return runs[len(runs)/2]
}

// readStats reads a mount's .dlfs/stats.
func readStats(mnt string) (daemon.Stats, error) {
	var st daemon.Stats
	b, err := os.ReadFile(filepath.Join(mnt, ".dlfs/stats"))
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	return st, err
}

func printTable(o options, rows []row, total int64) {
	host, _ := os.Hostname()
	fmt.Printf("## dlfs mount: %d files, %.0f MB, %d reader threads\n\n", o.files, float64(total)/1e6, o.workers)
	fmt.Printf("%s, %s, %d CPUs, kernel %s; pfssim: %v per open, %v per read, %.0f MB/s aggregate.\n\n",
		time.Now().Format("2006-01-02"), host, runtime.NumCPU(), kernel(), o.openLatency, o.readLatency, o.bandwidth)
	fmt.Println("| reader | passes | files/s | MB/s | × native | PFS bytes |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	native := rows[0].filesPerSec()
	for _, r := range rows {
		pb := "-"
		if r.pfsBytes >= 0 {
			pb = fmt.Sprintf("%d", r.pfsBytes)
		}
		fmt.Printf("| %s | %d | %.0f | %.0f | %.2f | %s |\n", r.name, r.passes, r.filesPerSec(), r.mbPerSec(), r.filesPerSec()/native, pb)
	}
	find := func(prefix string) row {
		for _, r := range rows {
			if strings.HasPrefix(r.name, prefix) {
				return r
			}
		}
		return row{}
	}
	fmt.Println()
	check := func(what string, got, want float64) {
		fmt.Printf("- %s: %s (target >= %.2f): %s\n", what, show("%.2f", got), want, atLeast(got, want))
	}
	check("second epoch files/s vs native", find("dlfs epoch 2").filesPerSec()/native, 0.8)
	check("first read from the RAM tier vs native", find("dlfs from the RAM tier").filesPerSec()/native, 0.5)
	check("epoch 1 through dlfs vs direct pfssim reads (not slower)", find("dlfs epoch 1").filesPerSec()/find("direct read").filesPerSec(), 1)
	pfs := func(prefix string) float64 {
		r := find(prefix)
		if r.passes == 0 || r.pfsBytes < 0 { // no such row, or not counted
			return notMeasured
		}
		return float64(r.pfsBytes)
	}
	e2, re := pfs("dlfs epoch 2"), pfs("dlfs after remount")
	fmt.Printf("- PFS bytes in epoch 2 and after the remount: %s and %s (target 0): %s\n",
		show("%.0f", e2), show("%.0f", re), verdict(e2 == 0 && re == 0, e2, re))
}

func kernel() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "?"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// readAll reads files under root with workers threads in an order shuffled
// by seed, each file opened, read to EOF in reads of 256 KiB and closed.
func readAll(root string, files []string, workers int, seed uint64) (row, error) {
	return readAllBy(root, files, workers, seed, 256<<10)
}

// readAllBy is readAll in reads of size bytes.
func readAllBy(root string, files []string, workers int, seed uint64, size int) (row, error) {
	order := append([]string(nil), files...)
	rand.New(rand.NewPCG(seed, 7)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	return readOrderedBy(root, order, workers, size)
}

// readOrdered reads the files in order with workers threads, each taking
// the next file not yet taken, in reads of 256 KiB.
func readOrdered(root string, order []string, workers int) (row, error) {
	return readOrderedBy(root, order, workers, 256<<10)
}

// readOrderedBy is readOrdered in reads of size bytes.
func readOrderedBy(root string, order []string, workers, size int) (row, error) {
	var (
		next  atomic.Int64
		bytes atomic.Int64
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, size)
			for {
				i := int(next.Add(1) - 1)
				if i >= len(order) {
					return
				}
				n, err := readFile(filepath.Join(root, order[i]), buf)
				if err != nil {
					errMu.Lock()
					first = errors.Join(first, err)
					errMu.Unlock()
					return
				}
				bytes.Add(n)
			}
		}()
	}
	wg.Wait()
	return row{files: len(order), bytes: bytes.Load(), elapsed: time.Since(start)}, first
}

func readFile(path string, buf []byte) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var n int64
	for {
		m, err := f.Read(buf)
		n += int64(m)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// dropPageCache evicts the mount's files from the kernel page cache, so the
// next reads reach the daemon's RAM tier.
func dropPageCache(root string, files []string) error {
	for _, rel := range files {
		f, err := os.Open(filepath.Join(root, rel))
		if err != nil {
			return err
		}
		err = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		f.Close()
		if err != nil {
			return fmt.Errorf("fadvise %s: %w", rel, err)
		}
	}
	return nil
}

// sim is a running pfssim with its counters file.
type sim struct {
	*mountproc.Proc
	stats string
}

// startSim mounts pfssim over src at DIR/name with flags.
// simTraces numbers the simulators started with -pfs-trace.
var simTraces int

func startSim(o options, name, src string, flags ...string) (*sim, error) {
	mnt, err := freshDir(filepath.Join(o.dir, name))
	if err != nil {
		return nil, err
	}
	stats := filepath.Join(o.dir, name+".json")
	os.Remove(stats) // a previous run's counters would hide this one's first dumps
	args := append([]string{"-stats", stats}, flags...)
	if o.pfsTrace != "" {
		simTraces++
		args = append(args, "-trace", filepath.Join(o.pfsTrace, fmt.Sprintf("%s-%d.trace", name, simTraces)))
	}
	args = append(args, src, mnt)
	p, err := mountproc.Start(filepath.Join(o.bin, "pfssim"), mnt, time.Minute, args...)
	if err != nil {
		return nil, err
	}
	return &sim{p, stats}, nil
}

// bytes returns the bytes pfssim has served so far. A counter that fails
// to dump fails the measurement: a row must never show 0 PFS bytes it did
// not count.
func (s *sim) bytes() (int64, error) {
	c, err := s.PFSCounters(s.stats, 10*time.Second)
	if err != nil {
		return 0, fmt.Errorf("pfssim counters: %w", err)
	}
	return c.Bytes, nil
}

// watchRate samples the simulator's counters (as it flushes them, every
// 50 ms) until the returned function is called, which returns the rate in
// bytes/s from when the bytes past from first exceeded 1% of total to when
// they reached 99% of it; notMeasured if they never did. It measures how busy a
// reader kept the PFS once under way, leaving out its start and its end.
func (s *sim) watchRate(from, total int64) (stop func() float64) {
	done := make(chan struct{})
	out := make(chan float64, 1)
	go func() {
		var t1, t99 time.Time
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for t99.IsZero() {
			select {
			case <-done:
				out <- notMeasured
				return
			case <-tick.C:
			}
			c, err := pfssim.ReadCounters(s.stats)
			if err != nil {
				continue
			}
			switch n := c.Bytes - from; {
			case n >= total*99/100:
				t99 = time.Now()
			case n > total/100 && t1.IsZero():
				t1 = time.Now()
			}
		}
		<-done
		if t1.IsZero() || !t99.After(t1) {
			out <- notMeasured
			return
		}
		out <- float64(total*98/100) / t99.Sub(t1).Seconds()
	}()
	return func() float64 { close(done); return <-out }
}

// freshDir returns an empty directory at path, unmounting a leftover mount.
func freshDir(path string) (string, error) {
	if mountproc.Mounted(path) {
		exec.Command("umount", "-l", path).Run()
	}
	if err := os.MkdirAll(path, 0o755); err != nil {
		return "", err
	}
	return path, nil
}
