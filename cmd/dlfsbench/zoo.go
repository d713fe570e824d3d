package main

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/test/datagen"
	"github.com/dlfs/dlfs/test/mountproc"
)

// The zoo suite (issue 29): datasets of other shapes than ImageNet's, each
// read once the way its kind of job reads it, over pfssim as issue 29's
// PFS (10 ms per open, 1 ms per read call, 400 MB/s), by four readers side
// by side in one run:
//   - direct: from pfssim;
//   - dlfs with no control line: a fresh dlfs mount over pfssim;
//   - dlfs announced: the same, the job announced first by a control line
//     naming its sampler (random with a seed, or sequential), and the
//     reader then following the plan dlfs writes for it
//     (.dlfs/jobs/zoo/rank-0/epoch-0); its time includes the announcement.
//     A shape whose reads no job line can describe says so instead;
//   - the native page cache: the same read of the local files, already in
//     the page cache, the upper bound.
//
// The page cache (and the dentry cache) is dropped before every row but
// the last. dlfs's PFS bytes and opens are the epoch's, those its mount
// made (once per mount: the dataset identity's head reads, a packed
// listing) shown beside; its PFS bytes leave out what it holds fetched
// and unread at the end, for a later epoch (shown beside). A
// last table reads the 32 MiB samples a second and a third time through
// a dlfs whose RAM tier holds them all after a first pass, page cache
// dropped, against the FUSE floor (floor.go) over the same tree.

// issue 29's PFS.
const (
	zooOpenLatency = 10 * time.Millisecond
	zooReadLatency = time.Millisecond
	zooMBps        = 400.0
	zooSeed        = 29
)

// zooWorkload is one shape of dataset and the way its job reads it.
type zooWorkload struct {
	name     string
	key      string       // its dataset's directory under DIR/zoo
	spec     datagen.Spec // its files (an ImageFolder tree), unless rows > 0
	rows     int          // rows of rowBytes in one HDF5 file, read by h5py
	rowBytes int
	readers  int
	readSize int    // bytes per read call (HDF5: a row)
	inOrder  bool   // read in name order; otherwise in a shuffled order
	sampler  string // the control line's sampler; "" if none can announce it
	why      string // why it cannot
	target   float64
}

// An HDF5 file of rows is read by h5py directly, through dlfs with no
// control line (the file lies in a subdirectory, data/rows.h5, so that
// dlfs shows it as it is), and from the native page cache. No job line
// can order the rows of one file; announced, the file lies at the top of
// SOURCE instead, where dlfs shows each row as a .npy file (rows/00042.npy,
// docs/datasets.md), and the job reads those files in the plan's
// order, as a Dataset calling numpy.load does.

var (
	zooSamples = zooWorkload{name: "32 MiB samples", key: "samples-32mib",
		spec:    datagen.Spec{Classes: 1, Files: 24, MeanSize: 32 << 20, Seed: zooSeed, Ext: ".bin"},
		readers: 2, readSize: 1 << 20, sampler: "random", target: 1}
	zooWorkloads = []zooWorkload{
		{name: "ImageNet-like files of 110 KB", key: "imagenet",
			spec:    datagen.Spec{Classes: 100, Files: 2000, MeanSize: 110_000, Spread: 40_000, Seed: zooSeed},
			readers: 4, readSize: 256 << 10, sampler: "random", target: 1},
		{name: ".npz files of 1 MiB + 498 B", key: "npz",
			spec:    datagen.Spec{Classes: 1, Files: 200, MeanSize: 1<<20 + 498, Seed: zooSeed, Ext: ".npz"},
			readers: 2, readSize: 1 << 20, sampler: "random", target: 1},
		zooSamples,
		{name: "256 MiB shards, WebDataset", key: "shards",
			spec:    datagen.Spec{Classes: 1, Files: 8, MeanSize: 256 << 20, Seed: zooSeed, Ext: ".tar"},
			readers: 4, readSize: 1 << 20, sampler: "random", target: 1},
		{name: "one HDF5 file, random rows by h5py", key: "hdf5", rows: 4096, rowBytes: 128 << 10,
			readers: 1, readSize: 128 << 10, sampler: "random", target: 1},
		{name: "sequential scan of the 32 MiB samples", key: zooSamples.key, spec: zooSamples.spec,
			readers: 1, readSize: 128 << 10, inOrder: true, sampler: "sequential", target: 2},
	}
)

// how says how w is read.
func (w zooWorkload) how(files int, bytes int64) string {
	order := "shuffled"
	if w.inOrder {
		order = "in name order"
	}
	what := fmt.Sprintf("%d files, %.0f MB, read whole", files, float64(bytes)/1e6)
	if w.rows > 0 {
		what = fmt.Sprintf("%d rows of %d KiB in one file (%.0f MB), each row once by h5py", w.rows, w.rowBytes>>10, float64(bytes)/1e6)
	}
	readers := fmt.Sprintf("%d readers", w.readers)
	if w.readers == 1 {
		readers = "1 reader"
	}
	announced := "cannot be announced (" + w.why + ")"
	switch {
	case w.sampler != "" && w.rows > 0:
		announced = "announced as sampler=" + w.sampler + " over dlfs's .npy file per row, read whole"
	case w.sampler != "":
		announced = "announced as sampler=" + w.sampler
	}
	return fmt.Sprintf("%s, %s, %s, reads of %d KiB; %s", what, order, readers, w.readSize>>10, announced)
}

// zooJob is the control line that announces w.
func zooJob(w zooWorkload) control.Job {
	j := control.DefaultJob()
	j.Name, j.Sampler, j.Seed, j.Epoch, j.Ranks = "zoo", w.sampler, zooSeed, 0, []int{0}
	j.Workers, j.Lookahead = w.readers, 1 // only the epoch measured
	switch {
	case w.rows > 0:
		j.Extensions = []string{".npy"}
	case w.spec.Ext != "":
		j.Extensions = []string{w.spec.Ext}
	}
	return j
}

// zooData is a workload's dataset on local disk.
type zooData struct {
	dir    string
	files  []string // relative to dir, sorted
	bytes  int64
	script string // the HDF5 helper
	rowDir string // the HDF5 file alone at the top (a hard link), for the announced job
}

//go:embed zoo_h5.py
var zooH5Script []byte

// zooDataset makes (once) w's dataset under DIR/zoo.
func zooDataset(o options, w zooWorkload) (zooData, error) {
	d := zooData{dir: filepath.Join(o.dir, "zoo", w.key), script: filepath.Join(o.dir, "zoo", "zoo_h5.py"),
		rowDir: filepath.Join(o.dir, "zoo", w.key+"-rows")}
	if w.rows == 0 {
		gen, err := datagen.ImageFolder(d.dir, w.spec)
		if err != nil {
			return d, fmt.Errorf("zoo: %s: %w", w.name, err)
		}
		for _, f := range gen {
			d.files = append(d.files, f.Path)
			d.bytes += f.Size
		}
		slices.Sort(d.files)
		return d, nil
	}
	for _, dir := range []string{filepath.Join(d.dir, "data"), d.rowDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return d, err
		}
	}
	if err := os.WriteFile(d.script, zooH5Script, 0o644); err != nil {
		return d, err
	}
	h5 := filepath.Join(d.dir, "data", "rows.h5")
	out, err := exec.Command("/usr/bin/python3", d.script, "make", h5, fmt.Sprint(w.rows), fmt.Sprint(w.rowBytes)).CombinedOutput()
	if err != nil {
		return d, fmt.Errorf("zoo: write %s with h5py (make deps installs python3-h5py): %w: %s", h5, err, strings.TrimSpace(string(out)))
	}
	fi, err := os.Stat(h5)
	if err != nil {
		return d, err
	}
	link := filepath.Join(d.rowDir, "rows.h5")
	if lfi, err := os.Stat(link); err != nil || !os.SameFile(fi, lfi) {
		os.Remove(link)
		if err := os.Link(h5, link); err != nil {
			return d, fmt.Errorf("zoo: %w", err)
		}
	}
	d.files, d.bytes = []string{"data/rows.h5"}, fi.Size()
	return d, nil
}

// zooReader is one way of reading a workload.
type zooReader string

const (
	zooDirect    zooReader = "direct"
	zooUntold    zooReader = "dlfs, no control line"
	zooAnnounced zooReader = "dlfs, announced"
	zooPageCache zooReader = "native page cache"
)

var zooReaders = []zooReader{zooDirect, zooUntold, zooAnnounced, zooPageCache}

// zooRow is one reader over one workload. Figures that do not apply are
// NaN: PFS figures for the page cache, CPU for rows without dlfs.
type zooRow struct {
	w        zooWorkload
	reader   zooReader
	files    int
	dataset  int64
	seconds  float64
	pfsBytes float64
	opens    float64 // in the epoch
	atMount  float64 // opens while dlfs mounted (the dataset identity's head reads, a packed listing): once per mount
	mountB   float64 // PFS bytes read while dlfs mounted, once per mount (left out of pfsBytes)
	calls    float64 // PFS read calls
	cpu      float64 // dlfs's CPU-seconds
	held     float64 // bytes dlfs held fetched and unread at the end (left out of pfsBytes)
	note     string  // why the row has no figures
}

func (r zooRow) dlfs() bool { return r.reader == zooUntold || r.reader == zooAnnounced }

// zooLater is the later-epochs table: the 32 MiB samples from dlfs's RAM
// tier against the FUSE floor.
type zooLater struct {
	second              float64 // seconds: dlfs's second pass, the first later epoch
	dlfs, floor, native float64 // seconds: dlfs's third pass
	pfsBytes            float64 // dlfs's in the measured epoch
	dataset             int64
}

func runZoo(o options) error {
	var rows []zooRow
	var later zooLater
	for _, w := range zooWorkloads {
		if o.zoo != "" && !slices.Contains(strings.Split(o.zoo, ","), w.key) {
			continue
		}
		d, err := zooDataset(o, w)
		if err != nil {
			return err
		}
		for _, reader := range zooReaders {
			fmt.Fprintf(os.Stderr, "measuring: zoo, %s, %s\n", w.name, reader)
			r, err := zooMeasure(o, w, d, reader)
			if err != nil {
				return fmt.Errorf("zoo, %s, %s: %w", w.name, reader, err)
			}
			rows = append(rows, r)
		}
		if w.key == zooSamples.key && !w.inOrder {
			fmt.Fprintf(os.Stderr, "measuring: zoo, %s, later epochs from RAM and the FUSE floor\n", w.name)
			if later, err = zooLaterEpochs(o, w, d); err != nil {
				return fmt.Errorf("zoo, later epochs: %w", err)
			}
			for _, r := range rows {
				if r.w.name == w.name && r.reader == zooPageCache {
					later.native = r.seconds
				}
			}
		}
	}
	printZoo(rows, later)
	return nil
}

// zooMeasure reads w's dataset d once with reader.
func zooMeasure(o options, w zooWorkload, d zooData, reader zooReader) (zooRow, error) {
	r := zooRow{w: w, reader: reader, files: len(d.files), dataset: d.bytes,
		seconds: notMeasured, pfsBytes: notMeasured, opens: notMeasured, calls: notMeasured, cpu: notMeasured}
	if reader == zooAnnounced && w.sampler == "" {
		r.note = "cannot be announced: " + w.why
		return r, nil
	}
	if reader == zooPageCache {
		if _, err := readOrderedBy(d.dir, d.files, 2, 1<<20); err != nil { // into the page cache
			return r, err
		}
		var err error
		r.seconds, err = zooRead(w, d, d.dir, nil)
		return r, err
	}
	src := d.dir
	if w.rows > 0 && reader == zooAnnounced {
		src = d.rowDir
	}
	pfs, err := startSim(o, "zoo-pfs", src, "-open-latency", zooOpenLatency.String(),
		"-read-latency", zooReadLatency.String(), "-bandwidth-mbps", fmt.Sprint(zooMBps))
	if err != nil {
		return r, err
	}
	defer pfs.Stop(30 * time.Second)
	root := pfs.Mnt
	// Counted from before the mount: its reads of the dataset identity's
	// heads (and the files they leave open) are part of what dlfs costs.
	before, err := pfs.PFSCounters(pfs.stats, 10*time.Second)
	if err != nil {
		return r, err
	}
	var dl *mountproc.Proc
	if r.dlfs() {
		mnt, err := freshDir(filepath.Join(o.dir, "zoo-mnt"))
		if err != nil {
			return r, err
		}
		dl, err = mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, time.Minute, "mount", "--log-level", "warn", "--ram-cache", "64MiB", pfs.Mnt, mnt)
		if err != nil {
			return r, err
		}
		defer dl.Stop(30 * time.Second)
		root = mnt
	}
	mounted, err := pfs.PFSCounters(pfs.stats, 10*time.Second)
	if err != nil {
		return r, err
	}
	r.atMount, r.mountB = float64(mounted.Opens-before.Opens), float64(mounted.Bytes-before.Bytes)
	if err := dropAllCaches(); err != nil {
		return r, err
	}
	var cpu0 cpuTime
	if dl != nil {
		if cpu0, err = cpuOf(dl.Cmd.Process.Pid); err != nil {
			return r, err
		}
	}
	var order []string
	announce := 0.0
	if reader == zooAnnounced {
		start := time.Now()
		if err := os.WriteFile(filepath.Join(root, ".dlfs/control"), []byte(zooJob(w).Line()+"\n"), 0); err != nil {
			return r, fmt.Errorf("announce: %w", err)
		}
		if order, err = planOrder(root, "zoo", 0); err != nil {
			return r, err
		}
		if want := max(len(d.files), w.rows); len(order) != want {
			return r, fmt.Errorf("the plan has %d files, want %d", len(order), want)
		}
		announce = time.Since(start).Seconds()
	}
	if r.seconds, err = zooRead(w, d, root, order); err != nil {
		return r, err
	}
	r.seconds += announce
	after, err := pfs.PFSCounters(pfs.stats, 10*time.Second)
	if err != nil {
		return r, err
	}
	r.pfsBytes, r.opens = float64(after.Bytes-mounted.Bytes), float64(after.Opens-mounted.Opens)
	r.calls = float64(after.ReadOps - before.ReadOps)
	if dl != nil {
		// What dlfs holds fetched and unread at the end was fetched for a
		// later epoch (an inferred job prefetches the next pass): not a
		// cost of this one.
		st, err := readStats(root)
		if err != nil {
			return r, err
		}
		r.held = float64(st.Prefetch.StagedBytes + st.ReadAhead.Held)
		r.pfsBytes -= r.held
	}
	if dl != nil {
		c, err := cpuOf(dl.Cmd.Process.Pid)
		if err != nil {
			return r, err
		}
		c = c.minus(cpu0)
		r.cpu = c.user + c.sys
	}
	return r, nil
}

// zooRead reads w's dataset under root once as w's job does (in order,
// when given one: an announced plan) and returns the seconds it took.
func zooRead(w zooWorkload, d zooData, root string, order []string) (float64, error) {
	if w.rows > 0 && order == nil {
		return zooReadRows(w, d, root)
	}
	var got row
	var err error
	switch {
	case order != nil:
		got, err = readOrderedBy(root, order, w.readers, w.readSize)
	case w.inOrder:
		got, err = readOrderedBy(root, d.files, w.readers, w.readSize)
	default:
		got, err = readAllBy(root, d.files, w.readers, zooSeed, w.readSize)
	}
	if err != nil {
		return notMeasured, err
	}
	want := d.bytes
	if w.rows > 0 { // the rows' .npy files, stat'ed after the read
		want = 0
		for _, f := range order {
			fi, err := os.Stat(filepath.Join(root, f))
			if err != nil {
				return notMeasured, err
			}
			want += fi.Size()
		}
	}
	if got.bytes != want {
		return notMeasured, fmt.Errorf("read %d bytes of %s, want %d", got.bytes, root, want)
	}
	return got.elapsed.Seconds(), nil
}

// zooReadRows reads every row of the HDF5 file under root once, in a
// random order, through h5py.
func zooReadRows(w zooWorkload, d zooData, root string) (float64, error) {
	path := filepath.Join(root, d.files[0])
	out, err := exec.Command("/usr/bin/python3", d.script, "read", path, fmt.Sprint(zooSeed)).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return notMeasured, fmt.Errorf("h5py reader of %s: %w", path, err)
	}
	var got struct {
		Seconds float64 `json:"seconds"`
		Rows    int     `json:"rows"`
		Bytes   int64   `json:"bytes"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		return notMeasured, fmt.Errorf("h5py reader of %s: %w (it printed %q)", path, err, out)
	}
	if got.Rows != w.rows || got.Bytes != int64(w.rows)*int64(w.rowBytes) {
		return notMeasured, fmt.Errorf("h5py reader of %s: read %d rows, %d bytes, want %d rows of %d", path, got.Rows, got.Bytes, w.rows, w.rowBytes)
	}
	return got.Seconds, nil
}

// zooLaterEpochs reads w's dataset d a second time through a dlfs whose
// RAM tier holds it all, the page cache dropped, and then through the FUSE
// floor the same way.
func zooLaterEpochs(o options, w zooWorkload, d zooData) (zooLater, error) {
	l := zooLater{second: notMeasured, dlfs: notMeasured, floor: notMeasured, native: notMeasured, pfsBytes: notMeasured, dataset: d.bytes}
	pfs, err := startSim(o, "zoo-pfs", d.dir, "-open-latency", zooOpenLatency.String(),
		"-read-latency", zooReadLatency.String(), "-bandwidth-mbps", fmt.Sprint(zooMBps))
	if err != nil {
		return l, err
	}
	defer pfs.Stop(30 * time.Second)
	mnt, err := freshDir(filepath.Join(o.dir, "zoo-mnt"))
	if err != nil {
		return l, err
	}
	ram := fmt.Sprint(d.bytes + d.bytes/4)
	dl, err := mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, time.Minute, "mount", "--log-level", "warn", "--ram-cache", ram, pfs.Mnt, mnt)
	if err != nil {
		return l, err
	}
	defer dl.Stop(30 * time.Second)
	// fill makes a first pass over root, which fills dlfs's RAM tier (or
	// makes the floor's lookups), and drops the page cache after it.
	fill := func(root string) error {
		if _, err := readAllBy(root, d.files, w.readers, zooSeed+1, w.readSize); err != nil {
			return err
		}
		return dropCaches(1)
	}
	// The first pass fills the RAM tier (and, --passthrough auto for
	// files this large, has the backing files passthrough serves later
	// epochs from built as each file is read to its end). The second, the
	// first later epoch, and the third are measured.
	if err := fill(mnt); err != nil {
		return l, err
	}
	before, err := pfs.bytes()
	if err != nil {
		return l, err
	}
	if l.second, err = zooRead(w, d, mnt, nil); err != nil {
		return l, err
	}
	if err := dropCaches(1); err != nil {
		return l, err
	}
	if l.dlfs, err = zooRead(w, d, mnt, nil); err != nil {
		return l, err
	}
	after, err := pfs.bytes()
	if err != nil {
		return l, err
	}
	l.pfsBytes = float64(after - before)
	if err := dl.Stop(30 * time.Second); err != nil {
		return l, err
	}

	floorMnt, err := freshDir(filepath.Join(o.dir, "zoo-floor"))
	if err != nil {
		return l, err
	}
	self, err := os.Executable()
	if err != nil {
		return l, err
	}
	fl, err := mountproc.Start(self, floorMnt, time.Minute, "-serve-floor", floorMnt, "-floor-src", d.dir)
	if err != nil {
		return l, err
	}
	defer fl.Stop(30 * time.Second)
	for range 2 {
		if err := fill(floorMnt); err != nil {
			return l, err
		}
	}
	l.floor, err = zooRead(w, d, floorMnt, nil)
	return l, err
}

func printZoo(rows []zooRow, later zooLater) {
	fmt.Printf("\n## Zoo: datasets of other shapes (issue 29)\n\n")
	fmt.Printf("Each workload is read once the way its kind of job reads it, over pfssim as issue 29's PFS (%v per open, %v per read call, "+
		"%.0f MB/s), page cache and dentries dropped first, by: direct from pfssim; a fresh dlfs mount with no control line (`--ram-cache 64MiB`); "+
		"the same announced by a control line, the reader then following dlfs's plan (the time includes the announcement); "+
		"and the same reader on the local files already in the page cache (the upper bound). "+
		"dlfs's PFS bytes and opens are the epoch's, with those its mount made in brackets (once per mount: the dataset identity's head reads, whose files stay open for the epoch, or a packed file's listing); its PFS bytes leave out what it holds fetched and unread at the end (prefetched for a next epoch), shown per row.\n\n",
		zooOpenLatency, zooReadLatency, zooMBps)
	fmt.Println("| workload | how it is read |")
	fmt.Println("|---|---|")
	seen := map[string]bool{}
	for _, r := range rows {
		if !seen[r.w.name] {
			seen[r.w.name] = true
			fmt.Printf("| %s | %s |\n", r.w.name, r.w.how(r.files, r.dataset))
		}
	}
	fmt.Println()
	fmt.Println("| workload | reader | seconds | ÷ direct | PFS bytes ÷ dataset | held for later ÷ dataset | PFS opens per file | dlfs CPU-s per GB |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|---:|")
	direct := zooDirectSeconds(rows)
	for _, r := range rows {
		if r.note != "" {
			fmt.Printf("| %s | %s | %s | - | - | - | - | - |\n", r.w.name, r.reader, r.note)
			continue
		}
		pfs, held, opens, cpu := "-", "-", "-", "-"
		if r.reader != zooPageCache {
			pfs, opens = show("%.3f", r.pfsBytes/float64(r.dataset)), show("%.2f", r.opens/float64(r.files))
			if r.dlfs() {
				pfs += show(" (%.3f at mount)", r.mountB/float64(r.dataset))
				opens += show(" (%.2f at mount)", r.atMount/float64(r.files))
			}
		}
		if r.dlfs() {
			cpu = show("%.2f", perUnit(r.cpu, float64(r.dataset)/1e9))
			held = show("%.3f", r.held/float64(r.dataset))
		}
		fmt.Printf("| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.w.name, r.reader, show("%.2f", r.seconds),
			show("%.2f", perUnit(direct[r.w.name], r.seconds)), pfs, held, opens, cpu)
	}
	fmt.Printf("\n### Later epochs of large samples from RAM\n\n")
	fmt.Printf("The 32 MiB samples read a second and a third time (2 readers, shuffled, reads of 1 MiB) after a first pass, the page cache dropped between: "+
		"through dlfs with `--ram-cache` %.0f MB holding them all, and through the FUSE floor (a filesystem answering each READ with zeros at once, "+
		"mounted as dlfs is); the native page cache for reference.\n\n", float64(later.dataset+later.dataset/4)/1e6)
	fmt.Println("| reader | seconds | ÷ FUSE floor | PFS bytes ÷ dataset (both passes) |")
	fmt.Println("|---|---:|---:|---:|")
	fmt.Printf("| FUSE floor | %s | 1.00 | - |\n", show("%.2f", later.floor))
	fmt.Printf("| dlfs, RAM tier, second pass | %s | %s | %s |\n", show("%.2f", later.second), show("%.2f", perUnit(later.floor, later.second)),
		show("%.3f", later.pfsBytes/float64(later.dataset)))
	fmt.Printf("| dlfs, RAM tier, third pass | %s | %s | - |\n", show("%.2f", later.dlfs), show("%.2f", perUnit(later.floor, later.dlfs)))
	fmt.Printf("| native page cache | %s | %s | - |\n", show("%.2f", later.native), show("%.2f", perUnit(later.floor, later.native)))
	fmt.Println()
	for _, line := range zooVerdicts(rows, later) {
		fmt.Println("- " + line)
	}
}

// zooDirectSeconds is each workload's direct time, by name.
func zooDirectSeconds(rows []zooRow) map[string]float64 {
	direct := map[string]float64{}
	for _, r := range rows {
		if r.reader == zooDirect {
			direct[r.w.name] = r.seconds
		}
	}
	return direct
}

// zooSerialModel is the time one reader takes to read files files of
// bytes in all straight from issue 29's PFS, in reads of readSize: an open
// each, then a read call per readSize, each paying the call's latency and
// its bytes at the PFS's bandwidth.
func zooSerialModel(files int, bytes int64, readSize int) float64 {
	calls := float64(files) * math.Ceil(float64(bytes)/float64(files)/float64(readSize))
	return float64(files)*zooOpenLatency.Seconds() + calls*zooReadLatency.Seconds() + float64(bytes)/(zooMBps*1e6)
}

// zooVerdicts are the suite's target lines: every workload with no
// control line at least its target × direct; PFS bytes at most 1.01x the
// dataset and one open per file for every dlfs row; later epochs from RAM
// at least 0.8x the FUSE floor.
func zooVerdicts(rows []zooRow, later zooLater) []string {
	var out []string
	direct := map[string]zooRow{}
	for _, r := range rows {
		if r.reader == zooDirect {
			direct[r.w.name] = r
		}
	}
	for _, r := range rows {
		if r.reader != zooUntold {
			continue
		}
		d := direct[r.w.name]
		ratio := perUnit(d.seconds, r.seconds)
		line := fmt.Sprintf("%s, epoch 0 with no control line: %s direct (target at least %.1fx): %s",
			r.w.name, show("%.2fx", ratio), r.w.target, atLeast(ratio, r.w.target))
		if r.w.inOrder && r.w.readers == 1 {
			bound := float64(r.dataset) / (zooMBps * 1e6)
			line += fmt.Sprintf("; the bandwidth bound is %.2f s, %s direct, whose one reader made %s read calls of %d KiB, "+
				"%s ms each (the model's %v per call and the bytes at %.0f MB/s: %.2f s)",
				bound, show("%.2fx", perUnit(d.seconds, bound)), show("%.0f", d.calls), r.w.readSize>>10,
				show("%.2f", 1e3*perUnit(d.seconds, d.calls)), zooReadLatency, zooMBps, zooSerialModel(r.files, r.dataset, r.w.readSize))
		}
		out = append(out, line)
	}
	for _, r := range rows {
		if !r.dlfs() || r.note != "" {
			continue
		}
		b, op := r.pfsBytes/float64(r.dataset), r.opens/float64(r.files)
		out = append(out, fmt.Sprintf("%s, %s: PFS bytes %s the dataset, %s opens per file (target at most 1.01x and 1): %s",
			r.w.name, r.reader, show("%.3fx", b), show("%.2f", op), verdict(b <= 1.01 && op <= 1, b, op)))
	}
	for _, p := range []struct {
		name    string
		seconds float64
	}{{"second", later.second}, {"third", later.dlfs}} {
		ratio := perUnit(later.floor, p.seconds)
		out = append(out, fmt.Sprintf("later epochs of the 32 MiB samples from dlfs's RAM tier, the %s pass: %s the FUSE floor (target at least 0.8x): %s",
			p.name, show("%.2fx", ratio), atLeast(ratio, 0.8)))
	}
	return out
}
