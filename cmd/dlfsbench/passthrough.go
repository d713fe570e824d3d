package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/backing"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/test/datagen"
	"github.com/dlfs/dlfs/test/mountproc"
)

// The passthrough suite (issue 32): a later epoch of files dlfs holds in
// its RAM tier, read by a few threads: dlfs with passthrough (the kernel
// reads each file from its sealed backing file), dlfs without (FUSE
// no-open: a READ the daemon answers from RAM, unless the mount's page
// cache has the file), the FUSE floor (zeros, one READ per request: the
// most a FUSE daemon that answers reads itself can reach), the local
// files in the page cache, and a copy of them in tmpfs (shmem, the memory
// backing files are made of). dlfs is measured with the mount's own page
// cache dropped before every pass (fadvise DONTNEED on each file through
// the mount: dlfs's RAM tier serves the pass, as when memory is short and
// the kernel's second copy is gone) and with it warm. Backing files are
// memory files that fadvise does not drop, as it does not drop RAM.

// ptShape is one dataset of the suite.
type ptShape struct {
	name     string
	key      string
	spec     datagen.Spec
	readers  int
	readSize int
}

var ptShapes = []ptShape{
	{name: "24 × 32 MiB", key: "32mib", spec: datagen.Spec{Classes: 2, Files: 24, MeanSize: 32 << 20, Seed: 32, Ext: ".bin"},
		readers: 2, readSize: 1 << 20},
	{name: "3,000 × 110 KB", key: "110kb", spec: datagen.Spec{Classes: 30, Files: 3000, MeanSize: 110_000, Seed: 32},
		readers: 4, readSize: 256 << 10},
}

// ptPasses is how many timed passes each row takes the median of.
const ptPasses = 5

// ptTimed is a median pass and its ratio to native: the median, over the
// passes, of a native pass read just before each over the pass. A pass
// of 32 MiB files takes 0.05-0.07 s here, no longer than the machine's
// drift between runs, so a ratio to one native median taken minutes
// earlier moves with the drift.
type ptTimed struct{ secs, vs float64 }

func (t ptTimed) String() string { return fmt.Sprintf("%.2f (%.2f)", t.secs, t.vs) }

// ptRow is one way of reading a shape.
type ptRow struct {
	dropped  ptTimed // the mount's page cache dropped before each pass
	warm     ptTimed // with it warm
	cpuPerGB float64 // the daemon's CPU seconds per GB read; NaN: no daemon
	memory   int64   // the daemon's RSS plus the shmem it added; -1: no daemon
	opens    float64 // passthrough opens per pass
}

func runPassthrough(o options) error {
	fmt.Printf("\n## Passthrough: later epochs from RAM (issue 32)\n\n")
	fmt.Printf("Each dataset is read by N threads in a fresh shuffled order per pass (open, read to EOF, close), median of %d passes, "+
		"after two epochs through dlfs (the first fills the RAM tier, the second builds the backing files). "+
		"Seconds per pass (× native: the median over the passes of a native pass read just before each, over the pass): the local files with their page cache warm; the same files copied into tmpfs; "+
		"dlfs with `--passthrough on` (backing files in 4 KiB pages: shmem_enabled never; then in huge pages: advise), then `off`, each with the mount's page cache dropped before every pass (fadvise DONTNEED through the mount) and warm; "+
		"an announced epoch's first read with passthrough on (huge pages), on a fresh mount whose stage (`--staging` room for the epoch twice: the stage keeps a backing file beside each file's blocks) was filled and built ahead (median of %d mounts; its × native is the median over the mounts of the ratio to native passes in the same order read just before and after it); "+
		"the FUSE floor (a READ per request answered with zeros at once), dropped; the per-open floor (OPEN answered by passthrough from a memory file registered once per file, no READ), dropped. CPU is the daemon's per GB read (dropped passes); memory its RSS plus the shmem it added, against --ram-cache.\n\n", ptPasses, ptAnnouncedMounts)
	fmt.Println("| files | readers | native | tmpfs | dlfs passthrough, 4 KiB pages, dropped | dlfs passthrough, huge pages, dropped | warm | announced first read | dlfs no passthrough, dropped | warm | FUSE floor | per-open floor (passthrough) | CPU s/GB, dlfs (pt / announced / no pt) and the floors' (FUSE / per-open) | memory MiB (pt / no pt) of --ram-cache |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, s := range ptShapes {
		if err := measureShape(o, s); err != nil {
			return fmt.Errorf("passthrough %s: %w", s.name, err)
		}
	}
	return ptSSD(o, ptShapes[0])
}

// ptSSDFills bounds the passes that fill the SSD tier.
const ptSSDFills = 8

// ssdSettled waits until the SSD tier's bytes stop changing for half a
// second (its queue drained) and returns them.
func ssdSettled(mnt string) (int64, error) {
	last, since := int64(-1), time.Now()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		st, err := readStats(mnt)
		if err != nil {
			return 0, err
		}
		if b := st.Cache.SSD.Bytes; b != last {
			last, since = b, time.Now()
		} else if time.Since(since) > 500*time.Millisecond {
			return last, nil
		}
	}
	return 0, fmt.Errorf("the SSD tier's bytes still change after a minute")
}

// ptSSDRAM is the RAM tier of the SSD rows: its quarter lets two opens of
// 32 MiB hold backing files at once, and it holds a third of the files.
const ptSSDRAM = 256 << 20

// ptSSD measures large files served from the SSD tier (issue 32, point
// 5): the SSD tier filled by a first mount, then a remount over the same
// --ssd-cache (RAM empty) read with passthrough on and --passthrough-ssd
// (each open copies the SSD tier's blocks into a backing file, which the RAM tier does not
// keep) and off (READs answered by the daemon from the SSD tier, which
// the RAM tier caches as it goes), the mount's page cache dropped before
// every pass. The SSD tier's own files stay in the page cache: the
// figures are what dlfs adds over a fast SSD. Backing files in huge pages.
func ptSSD(o options, s ptShape) error {
	src, files, total, err := ptDataset(o, s)
	if err != nil {
		return err
	}
	ssd, err := freshDir(filepath.Join(o.dir, "pt-ssd"))
	if err != nil {
		return err
	}
	restore, err := setShmemTHP("advise") // backing files in huge pages, as the best rows above
	if err != nil {
		return err
	}
	defer restore()
	mount := func(passthrough string) (*mountproc.Proc, string, error) {
		mnt, err := freshDir(filepath.Join(o.dir, "pt-mnt"))
		if err != nil {
			return nil, "", err
		}
		d, err := mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, time.Minute, "mount", "--log-level", "warn",
			"--ram-cache", strconv.Itoa(ptSSDRAM), "--ssd-cache", ssd, "--ssd-cache-size", strconv.FormatInt(2*total, 10),
			"--push=false", "--infer=false", "--passthrough", passthrough, "--passthrough-ssd", src, mnt)
		return d, mnt, err
	}
	fmt.Fprintf(os.Stderr, "measuring: %s, filling the SSD tier\n", s.name)
	d, mnt, err := mount("off")
	if err != nil {
		return err
	}
	// The SSD tier drops writes its queue has no room for: read until it
	// holds every byte (what it lacks is read from SOURCE again, and
	// queued again), at most ptSSDFills passes.
	for pass := 0; ; pass++ {
		if _, err := readAllBy(mnt, files, s.readers, uint64(1+pass), s.readSize); err != nil {
			d.Stop(30 * time.Second)
			return err
		}
		held, err := ssdSettled(mnt)
		if err != nil {
			d.Stop(30 * time.Second)
			return err
		}
		if held >= total {
			break
		}
		if pass == ptSSDFills-1 {
			d.Stop(30 * time.Second)
			return fmt.Errorf("the SSD tier holds %d of %d bytes after %d passes", held, total, ptSSDFills)
		}
	}
	if err := d.Stop(30 * time.Second); err != nil {
		return err
	}
	type ssdRow struct {
		seconds, cpuPerGB float64
		fromSSD           int64
	}
	measure := func(passthrough string) (ssdRow, error) {
		fmt.Fprintf(os.Stderr, "measuring: %s, SSD tier, passthrough %s\n", s.name, passthrough)
		var r ssdRow
		d, mnt, err := mount(passthrough)
		if err != nil {
			return r, err
		}
		defer d.Stop(30 * time.Second)
		var secs []float64
		var used cpuTime // over the passes alone: a drop's opens copy too, with passthrough
		for i := 0; i < ptPasses; i++ {
			if err := dropPageCache(mnt, files); err != nil {
				return r, err
			}
			c0, err := cpuOf(d.Cmd.Process.Pid)
			if err != nil {
				return r, err
			}
			p, err := readAllBy(mnt, files, s.readers, uint64(200+i), s.readSize)
			if err != nil {
				return r, err
			}
			c1, err := cpuOf(d.Cmd.Process.Pid)
			if err != nil {
				return r, err
			}
			if p.bytes != total {
				return r, fmt.Errorf("read %d bytes of %d", p.bytes, total)
			}
			secs = append(secs, p.elapsed.Seconds())
			c := c1.minus(c0)
			used.user, used.sys = used.user+c.user, used.sys+c.sys
		}
		st, err := readStats(mnt)
		if err != nil {
			return r, err
		}
		if st.Served["pfs"].Reads != 0 {
			return r, fmt.Errorf("%d reads reached the PFS; the SSD tier should hold every file", st.Served["pfs"].Reads)
		}
		sort.Float64s(secs)
		r.seconds, r.cpuPerGB, r.fromSSD = secs[len(secs)/2], (used.user+used.sys)/(float64(total)*ptPasses/1e9), st.Passthrough.BuiltFromSSD
		return r, nil
	}
	on, err := measure("on")
	if err != nil {
		return err
	}
	off, err := measure("off")
	if err != nil {
		return err
	}
	fmt.Printf("\nThe SSD tier (point 5): %s, %d readers, read %d times in a shuffled order from a remount over the SSD tier a first mount filled "+
		"(`--ram-cache %d MiB`, RAM empty at the start), the mount's page cache dropped before every pass; median pass:\n\n", s.name, s.readers, ptPasses, ptSSDRAM>>20)
	fmt.Println("| dlfs | seconds | × passthrough off | backing files copied from the SSD tier (opens of the passes, and of the drops) | dlfs CPU s/GB (the passes) |")
	fmt.Println("|---|---:|---:|---:|---:|")
	fmt.Printf("| passthrough on, --passthrough-ssd: each open copies the SSD tier's blocks into a backing file | %.2f | %.2f | %d of %d opens | %.3f |\n", on.seconds, off.seconds/on.seconds, on.fromSSD, 2*ptPasses*len(files), on.cpuPerGB)
	fmt.Printf("| passthrough off: READs answered from the SSD tier (and RAM, which caches them) | %.2f | 1.00 | - | %.3f |\n", off.seconds, off.cpuPerGB)
	fmt.Printf("\n- SSD tier through passthrough: %.2fx passthrough off (its default would need 1.5x or more): %s\n", off.seconds/on.seconds, verdict(off.seconds/on.seconds >= 1.5, off.seconds/on.seconds))
	return nil
}

// ptDataset generates shape s's files under DIR/pt-KEY (kept for reuse)
// and returns where, their paths under it, and their bytes.
func ptDataset(o options, s ptShape) (src string, files []string, total int64, err error) {
	src = filepath.Join(o.dir, "pt-"+s.key)
	fmt.Fprintf(os.Stderr, "passthrough: generating %s under %s ...\n", s.name, src)
	gen, err := datagen.ImageFolder(src, s.spec)
	if err != nil {
		return "", nil, 0, err
	}
	files = make([]string, len(gen))
	for i, f := range gen {
		files[i], total = f.Path, total+f.Size
	}
	return src, files, total, nil
}

func measureShape(o options, s ptShape) error {
	src, files, total, err := ptDataset(o, s)
	if err != nil {
		return err
	}
	// pass reads root once, in the order seed shuffles.
	pass := func(root string, seed uint64) (float64, error) {
		r, err := readAllBy(root, files, s.readers, seed, s.readSize)
		if err == nil && r.bytes != total {
			err = fmt.Errorf("read %d bytes of %d under %s", r.bytes, total, root)
		}
		return r.elapsed.Seconds(), err
	}
	// passes reads root ptPasses times, each after a native pass and then
	// drop, and returns the median pass and ratio (ptTimed).
	passes := func(root string, drop func() error) (ptTimed, error) {
		var secs, vs []float64
		for i := 0; i < ptPasses; i++ {
			nat, err := pass(src, uint64(100+i))
			if err != nil {
				return ptTimed{}, err
			}
			if drop != nil {
				if err := drop(); err != nil {
					return ptTimed{}, err
				}
			}
			sec, err := pass(root, uint64(100+i))
			if err != nil {
				return ptTimed{}, err
			}
			secs, vs = append(secs, sec), append(vs, nat/sec)
		}
		return ptTimed{median(secs), median(vs)}, nil
	}

	fmt.Fprintf(os.Stderr, "measuring: %s, native\n", s.name)
	if _, err := readAllBy(src, files, s.readers, 1, s.readSize); err != nil { // warm
		return err
	}
	native, err := passes(src, nil)
	if err != nil {
		return err
	}
	ram := total + total/4 + 64<<20
	dlfs := func(flags ...string) (ptRow, error) {
		fmt.Fprintf(os.Stderr, "measuring: %s, dlfs %v\n", s.name, flags)
		row := ptRow{memory: -1}
		mnt, err := freshDir(filepath.Join(o.dir, "pt-mnt"))
		if err != nil {
			return row, err
		}
		shmem0 := meminfo("Shmem")
		args := append([]string{"mount", "--log-level", "warn", "--ram-cache", strconv.FormatInt(ram, 10), "--push=false", "--infer=false"}, flags...)
		d, err := mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, time.Minute, append(args, src, mnt)...)
		if err != nil {
			return row, err
		}
		defer d.Stop(30 * time.Second)
		for epoch := 0; epoch < 2; epoch++ {
			if _, err := readAllBy(mnt, files, s.readers, uint64(10+epoch), s.readSize); err != nil {
				return row, err
			}
		}
		st0, err := readStats(mnt)
		if err != nil {
			return row, err
		}
		cpu0, err := cpuOf(d.Cmd.Process.Pid)
		if err != nil {
			return row, err
		}
		if row.dropped, err = passes(mnt, func() error { return dropPageCache(mnt, files) }); err != nil {
			return row, err
		}
		cpu1, err := cpuOf(d.Cmd.Process.Pid)
		if err != nil {
			return row, err
		}
		if row.warm, err = passes(mnt, nil); err != nil {
			return row, err
		}
		st1, err := readStats(mnt)
		if err != nil {
			return row, err
		}
		used := cpu1.minus(cpu0)
		row.cpuPerGB = (used.user + used.sys) / (float64(total) * ptPasses / 1e9)
		row.opens = float64(st1.Passthrough.Opens-st0.Passthrough.Opens) / ptPasses
		row.memory = procStatus(d.Cmd.Process.Pid, "VmRSS") + max(meminfo("Shmem")-shmem0, 0)
		fmt.Fprintf(os.Stderr, "  passthrough: %+v\n", st1.Passthrough)
		return row, nil
	}
	// Passthrough with backing files in 4 KiB pages, then in 2 MiB pages
	// (shmem_enabled advise: backing.Build advises its mapping huge), the
	// machine's setting restored after.
	var pt4k, pt ptRow
	restore, err := setShmemTHP("never")
	if err != nil {
		return err
	}
	defer restore()
	if pt4k, err = dlfs("--passthrough", "on"); err != nil {
		return err
	}
	if _, err := setShmemTHP("advise"); err != nil {
		return err
	}
	if pt, err = dlfs("--passthrough", "on"); err != nil {
		return err
	}
	first, err := ptAnnounced(o, s, src, files, total, ram)
	if err != nil {
		return err
	}
	restore()
	plain, err := dlfs("--passthrough", "off")
	if err != nil {
		return err
	}
	tmpfs, err := ptTmpfs(src, files, func(root string) (ptTimed, error) { return passes(root, nil) })
	if err != nil {
		return err
	}

	// The FUSE floor (READ by READ), then its passthrough kind (the
	// per-open floor: OPEN and RELEASE, no READ).
	measureFloor := func(passthrough bool) (secs ptTimed, cpuPerGB float64, err error) {
		fmt.Fprintf(os.Stderr, "measuring: %s, FUSE floor (passthrough %v)\n", s.name, passthrough)
		floorMnt, err := freshDir(filepath.Join(o.dir, "pt-floor"))
		if err != nil {
			return ptTimed{}, 0, err
		}
		self, err := os.Executable()
		if err != nil {
			return ptTimed{}, 0, err
		}
		args := []string{"-serve-floor", floorMnt, "-floor-src", src}
		if passthrough {
			args = append(args, "-floor-passthrough")
		}
		fl, err := mountproc.Start(self, floorMnt, time.Minute, args...)
		if err != nil {
			return ptTimed{}, 0, err
		}
		defer fl.Stop(30 * time.Second)
		if _, err := readAllBy(floorMnt, files, s.readers, 1, s.readSize); err != nil { // its lookups (and backing files)
			return ptTimed{}, 0, err
		}
		c0, err := cpuOf(fl.Cmd.Process.Pid)
		if err != nil {
			return ptTimed{}, 0, err
		}
		secs, err = passes(floorMnt, func() error { return dropPageCache(floorMnt, files) })
		if err != nil {
			return ptTimed{}, 0, err
		}
		c1, err := cpuOf(fl.Cmd.Process.Pid)
		if err != nil {
			return ptTimed{}, 0, err
		}
		used := c1.minus(c0)
		return secs, (used.user + used.sys) / (float64(total) * ptPasses / 1e9), nil
	}
	floor, floorCPU, err := measureFloor(false)
	if err != nil {
		return err
	}
	ptFloor, ptFloorCPU, err := measureFloor(true)
	if err != nil {
		return err
	}
	note := ""
	if pt.opens < float64(len(files)) {
		note = fmt.Sprintf(" [%.0f of %d opens by passthrough]", pt.opens, len(files))
	}
	firstNote := ""
	if first.opens < float64(len(files)) {
		firstNote = fmt.Sprintf(" [%.0f of %d opens by passthrough]", first.opens, len(files))
	}
	fmt.Printf("| %s | %d | %.2f | %s | %s | %s%s | %s | %s%s | %s | %s | %s | %s | %.3f / %.3f / %.3f (floors %.3f / %.3f) | %d / %d of %d |\n", s.name, s.readers, native.secs,
		tmpfs, pt4k.dropped, pt.dropped, note, pt.warm, first.dropped, firstNote, plain.dropped, plain.warm, floor, ptFloor,
		pt.cpuPerGB, first.cpuPerGB, plain.cpuPerGB, floorCPU, ptFloorCPU, pt.memory>>20, plain.memory>>20, ram>>20)
	return nil
}

// ptAnnouncedMounts is how many fresh mounts the announced first read
// takes the median of.
const ptAnnouncedMounts = 5

// ptAnnouncedStaging is the announced rows' --staging: room for the whole
// epoch's blocks and their backing files (the stage keeps both until the
// read), with read-ahead's quarter on top.
func ptAnnouncedStaging(total int64) int64 { return (2*total + 64<<20) * 4 / 3 }

// ptAnnounced measures an announced epoch's first read (issue 14's
// target): on a fresh mount with passthrough on, a job is announced and
// its stage filled ahead (every file's backing file built: the prefetcher
// stages it and the builder builds it), then the readers read each file
// once in the plan's order. The median of ptAnnouncedMounts mounts; CPU is
// the daemon's per GB during the read. A native pass of 32 MiB files takes
// 0.05-0.07 s here, no longer than the machine's drift between runs, so each
// mount's read is measured against native passes in the same order just
// before and just after it, and the row's ratio is the median of those.
func ptAnnounced(o options, s ptShape, src string, files []string, total, ram int64) (ptRow, error) {
	row := ptRow{memory: -1}
	var secs, cpus, opens, ratios []float64
	for k := 0; k < ptAnnouncedMounts; k++ {
		fmt.Fprintf(os.Stderr, "measuring: %s, dlfs announced, first read (mount %d)\n", s.name, k+1)
		mnt, err := freshDir(filepath.Join(o.dir, "pt-mnt"))
		if err != nil {
			return row, err
		}
		d, err := mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, time.Minute, "mount", "--log-level", "warn",
			"--ram-cache", strconv.FormatInt(ram, 10), "--staging", strconv.FormatInt(ptAnnouncedStaging(total), 10),
			"--push=false", "--infer=false", "--passthrough", "on", src, mnt)
		if err != nil {
			return row, err
		}
		secs1, cpu1, opens1, err := func() (float64, float64, float64, error) {
			defer d.Stop(30 * time.Second)
			j := control.DefaultJob()
			j.Name, j.Sampler, j.Seed, j.Epoch, j.Ranks = "pt", "random", uint64(77+k), 0, []int{0}
			j.Workers, j.Lookahead, j.Extensions = s.readers, 1, []string{filepath.Ext(files[0])}
			if err := os.WriteFile(filepath.Join(mnt, ".dlfs/control"), []byte(j.Line()+"\n"), 0); err != nil {
				return 0, 0, 0, fmt.Errorf("announce: %w", err)
			}
			order, err := planOrder(mnt, "pt", 0)
			if err != nil {
				return 0, 0, 0, err
			}
			if len(order) != len(files) {
				return 0, 0, 0, fmt.Errorf("the plan has %d files, want %d", len(order), len(files))
			}
			// Filled ahead: every file built, or the prefetcher and the
			// builder idle for a second (the stage full; the row notes
			// opens not by passthrough).
			deadline := time.Now().Add(3 * time.Minute)
			built, fetched, since := int64(-1), int64(-1), time.Now()
			for {
				st, err := readStats(mnt)
				if err != nil {
					return 0, 0, 0, err
				}
				if b, f := st.Passthrough.BuiltAhead, st.Prefetch.Fetched; b != built || f != fetched || st.Prefetch.InFlight > 0 {
					built, fetched, since = b, f, time.Now()
				}
				if built >= int64(len(files)) || time.Since(since) > time.Second {
					break
				}
				if time.Now().After(deadline) {
					return 0, 0, 0, fmt.Errorf("the stage was not filled in 3 minutes: %d of %d files fetched, %d built", fetched, len(files), built)
				}
				time.Sleep(50 * time.Millisecond)
			}
			st0, err := readStats(mnt)
			if err != nil {
				return 0, 0, 0, err
			}
			native := func() (float64, error) {
				r, err := readOrderedBy(src, order, s.readers, s.readSize)
				if err == nil && r.bytes != total {
					err = fmt.Errorf("native: read %d bytes of %d", r.bytes, total)
				}
				return r.elapsed.Seconds(), err
			}
			if _, err := native(); err != nil { // the page cache warm, as for the shape's native passes
				return 0, 0, 0, err
			}
			before, err := native()
			if err != nil {
				return 0, 0, 0, err
			}
			c0, err := cpuOf(d.Cmd.Process.Pid)
			if err != nil {
				return 0, 0, 0, err
			}
			r, err := readOrderedBy(mnt, order, s.readers, s.readSize)
			if err != nil {
				return 0, 0, 0, err
			}
			if r.bytes != total {
				return 0, 0, 0, fmt.Errorf("read %d bytes of %d", r.bytes, total)
			}
			c1, err := cpuOf(d.Cmd.Process.Pid)
			if err != nil {
				return 0, 0, 0, err
			}
			after, err := native()
			if err != nil {
				return 0, 0, 0, err
			}
			ratios = append(ratios, (before+after)/2/r.elapsed.Seconds())
			st1, err := readStats(mnt)
			if err != nil {
				return 0, 0, 0, err
			}
			used := c1.minus(c0)
			return r.elapsed.Seconds(), (used.user + used.sys) / (float64(total) / 1e9), float64(st1.Passthrough.Opens - st0.Passthrough.Opens), nil
		}()
		if err != nil {
			return row, err
		}
		secs, cpus, opens = append(secs, secs1), append(cpus, cpu1), append(opens, opens1)
	}
	row.dropped, row.cpuPerGB, row.opens = ptTimed{median(secs), median(ratios)}, median(cpus), slices.Min(opens)
	fmt.Fprintf(os.Stderr, "  announced first read of %s, × native beside it, per mount: %.2f\n", s.name, ratios)
	return row, nil
}

// ptTmpfs copies files under src into a fresh tmpfs mount, measures them
// there with measure, and removes the copy.
func ptTmpfs(src string, files []string, measure func(root string) (ptTimed, error)) (ptTimed, error) {
	dir, err := os.MkdirTemp("", "dlfsbench-tmpfs")
	if err != nil {
		return ptTimed{}, err
	}
	defer os.Remove(dir)
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "mode=0700"); err != nil {
		return ptTimed{}, fmt.Errorf("mount tmpfs (the suite runs as root): %w", err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	for _, rel := range files {
		b, err := os.ReadFile(filepath.Join(src, rel))
		if err != nil {
			return ptTimed{}, err
		}
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return ptTimed{}, err
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return ptTimed{}, err
		}
	}
	return measure(dir)
}

// setShmemTHP sets shmem's huge page mode and returns what restores the
// one before (which may be called more than once).
func setShmemTHP(mode string) (restore func(), err error) {
	old := backing.ShmemTHP()
	if err := os.WriteFile(backing.ShmemTHPFile, []byte(mode), 0); err != nil {
		return nil, fmt.Errorf("set %s to %s (the suite runs as root): %w", backing.ShmemTHPFile, mode, err)
	}
	return func() { _ = os.WriteFile(backing.ShmemTHPFile, []byte(old), 0) }, nil
}

// meminfo returns a /proc/meminfo field in bytes, or 0.
func meminfo(field string) int64 { return kbField("/proc/meminfo", field) }

// procStatus returns a /proc/PID/status field in bytes, or 0.
func procStatus(pid int, field string) int64 {
	return kbField(fmt.Sprintf("/proc/%d/status", pid), field)
}

// kbField reads "FIELD: N kB" from file, in bytes.
func kbField(file, field string) int64 {
	f, err := os.Open(file)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		return kb << 10
	}
	return 0
}

// median is the middle of x (the upper of the two middles), x unchanged.
func median(x []float64) float64 {
	x = append([]float64(nil), x...)
	sort.Float64s(x)
	return x[len(x)/2]
}
