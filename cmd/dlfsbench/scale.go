package main

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/placement"
	"github.com/dlfs/dlfs/test/datagen"
	"github.com/dlfs/dlfs/test/mountproc"
)

// The scale suite (issue 13, `make bench-scale`, outside `make bench`): a
// tree of o.scaleFiles tiny files (1,000 classes, 256 B–2 KB), generated
// once under o.scaleDir and reused, measured natively and through dlfs
// side by side:
//   - the first scan (page cache dropped): native find -printf '%s %T@'
//     against dlfs mount;
//   - torchvision's ImageFolder(root), first and second;
//   - the plan of a job of world 8 for rank 0;
//   - an epoch over the files (4 threads, a shuffled order) from the page
//     cache, and through dlfs from its RAM tier;
//   - the daemon's RSS after each step, and per file.

func runScale(o options) error {
	place, err := placementScale(14_200_000, 64)
	if err != nil {
		return err
	}
	src := filepath.Join(o.scaleDir, "source")
	fmt.Fprintf(os.Stderr, "generating %d files under %s (kept for reuse) ...\n", o.scaleFiles, src)
	start := time.Now()
	gen, err := datagen.ImageFolder(src, datagen.Spec{Classes: 1000, Files: o.scaleFiles, MeanSize: 1152, Spread: 896, Seed: 13, Ext: ".JPEG"})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "generated in %v\n", time.Since(start).Round(time.Second))
	files := make([]string, len(gen))
	var total int64
	for i, f := range gen {
		files[i] = f.Path
		total += f.Size
	}
	gen = nil
	rng := rand.New(rand.NewPCG(13, 13))
	rng.Shuffle(len(files), func(i, j int) { files[i], files[j] = files[j], files[i] })

	type step struct {
		name         string
		native, dlfs float64 // seconds; 0: not applicable
		rate         bool    // native and dlfs are files/s, not seconds
		rss          float64 // the daemon's RSS in bytes after the step; NaN: not measured; −1: no daemon in the step
	}
	var steps []step
	note := func(s step) {
		steps = append(steps, s)
		fmt.Fprintf(os.Stderr, "%s: native %.2f, dlfs %.2f, RSS %s\n", s.name, s.native, s.dlfs, show("%.0f MB", s.rss/(1<<20)))
	}
	// rssOf is a daemon's RSS, or notMeasured (and why, on stderr).
	rssOf := func(p *mountproc.Proc) float64 {
		n, err := rss(p)
		if err != nil {
			fmt.Fprintf(os.Stderr, "the daemon's RSS: %v\n", err)
			return notMeasured
		}
		return float64(n)
	}

	// The first scan, cold.
	if err := dropAllCaches(); err != nil {
		return err
	}
	findSecs, err := timed(func() error { return exec.Command("sh", "-c", "find "+src+" -printf '%s %T@\\n' > /dev/null").Run() })
	if err != nil {
		return fmt.Errorf("find: %w", err)
	}
	if err := dropAllCaches(); err != nil {
		return err
	}
	mnt, err := freshDir(filepath.Join(o.scaleDir, "mnt"))
	if err != nil {
		return err
	}
	// The RAM tier holds the whole tree where the machine can spare it (a
	// third of its memory); at 10 M files it holds part, and the epoch
	// "from the RAM tier" reads the rest from SOURCE.
	ram := 2*total + 64<<20
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) == nil {
		ram = min(ram, int64(si.Totalram)*int64(si.Unit)/3)
	}
	var p *mountproc.Proc
	mountSecs, err := timed(func() (err error) {
		p, err = mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, 10*time.Minute,
			"mount", "--log-level", "warn", "--ram-cache", fmt.Sprint(ram), "--max-files", fmt.Sprint(2*o.scaleFiles+1<<20), src, mnt)
		return err
	})
	if err != nil {
		return err
	}
	defer p.Stop(time.Minute)
	note(step{name: "first scan (page cache dropped): native find -printf '%s %T@', dlfs mount", native: findSecs, dlfs: mountSecs, rss: rssOf(p)})

	// ImageFolder, first and second.
	if err := dropAllCaches(); err != nil {
		return err
	}
	nativeFirst, _, err := imageFolder(src)
	if err != nil {
		return err
	}
	dlfsFirst, n, err := imageFolder(p.Mnt)
	if err != nil {
		return err
	}
	if n != len(files) {
		return fmt.Errorf("ImageFolder through dlfs found %d samples, want %d", n, len(files))
	}
	note(step{name: "torchvision ImageFolder(root), first (native: cold)", native: nativeFirst, dlfs: dlfsFirst, rss: rssOf(p)})
	nativeSecond, _, err := imageFolder(src)
	if err != nil {
		return err
	}
	dlfsSecond, _, err := imageFolder(p.Mnt)
	if err != nil {
		return err
	}
	note(step{name: "torchvision ImageFolder(root), second", native: nativeSecond, dlfs: dlfsSecond, rss: rssOf(p)})

	// A plan: world 8, rank 0.
	planSecs, err := timed(func() error {
		line := "job=scale root=. seed=0 epoch=0 world=8 ranks=0 batch=256 workers=8\n"
		if err := os.WriteFile(filepath.Join(p.Mnt, ".dlfs/control"), []byte(line), 0); err != nil {
			return fmt.Errorf("announce: %w", err)
		}
		f, err := os.Open(filepath.Join(p.Mnt, ".dlfs/jobs/scale/rank-0/epoch-0"))
		if err != nil {
			return err
		}
		defer f.Close()
		lines := 0
		for sc := bufio.NewScanner(f); sc.Scan(); {
			lines++
		}
		if want := (len(files) + 7) / 8; lines != want {
			return fmt.Errorf("the plan has %d lines, want %d", lines, want)
		}
		return nil
	})
	if err != nil {
		return err
	}
	note(step{name: "announce a job (world 8) and read rank 0's plan", dlfs: planSecs, rss: rssOf(p)})
	if err := os.WriteFile(filepath.Join(p.Mnt, ".dlfs/control"), []byte("end job=scale\n"), 0); err != nil {
		return fmt.Errorf("end the job: %w", err)
	}

	// Epochs: from the page cache, natively and through dlfs, each timed
	// right after a pass at page-cache speed, so that every page is in the
	// page cache when it starts. This VM pages out memory untouched for
	// about a minute (a DAMON pageout scheme), so the pass that fills
	// dlfs's RAM tier, slower than a page-cache pass, is not enough: its
	// first pages are gone by the time it ends. The share of a sample of
	// the files cached at the start of each timed epoch is printed beside
	// it. Then through dlfs from its RAM tier: with the page cache dropped
	// (the dentries kept, so every read is one READ), and with the
	// dentry and inode caches dropped too (a LOOKUP and a READ per file).
	epoch := func(root string) (float64, error) {
		secs, err := timed(func() error { return readInOrder(root, files, 4) })
		return float64(len(files)) / secs, err
	}
	probe := files[:min(len(files), 5000)]
	if _, err := epoch(src); err != nil { // warm the page cache
		return err
	}
	nativeShare := cachedShare(src, probe)
	nativeCached, err := epoch(src)
	if err != nil {
		return err
	}
	if _, err := epoch(p.Mnt); err != nil { // fill the RAM tier
		return err
	}
	if _, err := epoch(p.Mnt); err != nil { // warm the page cache
		return err
	}
	dlfsShare := cachedShare(p.Mnt, probe)
	dlfsCached, err := epoch(p.Mnt)
	if err != nil {
		return err
	}
	note(step{name: fmt.Sprintf("an epoch from the page cache (files/s; cached at its start: native %.0f%%, dlfs %.0f%%)", 100*nativeShare, 100*dlfsShare),
		native: nativeCached, dlfs: dlfsCached, rate: true, rss: rssOf(p)})
	if err := dropCaches(1); err != nil {
		return err
	}
	dlfsRAM, err := epoch(p.Mnt)
	if err != nil {
		return err
	}
	st, err := readStats(p.Mnt)
	if err != nil {
		return err
	}
	after := rssOf(p)
	note(step{name: "an epoch through dlfs from its RAM tier, page cache dropped (files/s); native: from the page cache", native: nativeCached, dlfs: dlfsRAM, rate: true, rss: after})
	if err := dropAllCaches(); err != nil {
		return err
	}
	dlfsRAMCold, err := epoch(p.Mnt)
	if err != nil {
		return err
	}
	note(step{name: "the same with the dentry and inode caches dropped too (a LOOKUP and a READ per file)", native: nativeCached, dlfs: dlfsRAMCold, rate: true, rss: rssOf(p)})

	p.Stop(time.Minute)

	// The FUSE floor (floor.go): the same epoch, page cache dropped,
	// through a filesystem that answers each READ with zeros at once.
	floorMnt, err := freshDir(filepath.Join(o.scaleDir, "floor"))
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	fl, err := mountproc.Start(self, floorMnt, 5*time.Minute, "-serve-floor", floorMnt, "-floor-src", src)
	if err != nil {
		return err
	}
	if _, err := epoch(floorMnt); err != nil { // the lookups
		fl.Stop(time.Minute)
		return err
	}
	if err := dropCaches(1); err != nil {
		fl.Stop(time.Minute)
		return err
	}
	floorRate, err := epoch(floorMnt)
	fl.Stop(time.Minute)
	if err != nil {
		return err
	}
	note(step{name: "the FUSE floor: a filesystem answering each READ with zeros at once, page cache dropped (files/s)", native: nativeCached, dlfs: floorRate, rate: true, rss: -1})

	// A remount with the catalog saved beside the SSD tier.
	ssd := filepath.Join(o.scaleDir, "ssd")
	if err := os.RemoveAll(ssd); err != nil {
		return err
	}
	withSSD := func() (*mountproc.Proc, error) {
		return mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, 10*time.Minute,
			"mount", "--log-level", "info", "--ram-cache", "64MiB", "--ssd-cache", ssd, "--max-files", fmt.Sprint(2*o.scaleFiles+1<<20), src, mnt)
	}
	first, err := withSSD()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		if _, err := os.Stat(filepath.Join(ssd, "catalog.snap")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			first.Stop(time.Minute)
			return fmt.Errorf("the catalog was not saved under %s within 10 minutes", ssd)
		}
		time.Sleep(100 * time.Millisecond)
	}
	first.Stop(time.Minute)
	var again *mountproc.Proc
	if err := dropAllCaches(); err != nil {
		return err
	}
	remountStart := time.Now()
	remountSecs, err := timed(func() (err error) { again, err = withSSD(); return err })
	if err != nil {
		return err
	}
	firstByte, dirsSecs, checkSecs, err := remountTimes(again, remountStart, files[0])
	if err != nil {
		again.Stop(time.Minute)
		return err
	}
	remountRSS := rssOf(again)
	again.Stop(time.Minute)
	note(step{name: "remount with the catalog saved by --ssd-cache (native: nothing to do; the scan it replaces above)", native: mountSecs, dlfs: remountSecs, rss: remountRSS})

	fmt.Printf("\n## Scale: %d files in 1,000 classes, 256 B–2 KB each (%.2f GB)\n\n", len(files), float64(total)/1e9)
	fmt.Println("Native is the same tree read directly. Times in seconds unless marked files/s; RSS is the daemon's after the step.")
	fmt.Println()
	fmt.Println("| step | native | dlfs | dlfs ÷ native (time) or dlfs ÷ native (rate) | daemon RSS |")
	fmt.Println("|---|---:|---:|---:|---:|")
	for _, s := range steps {
		ratio, nat := "—", "—"
		if s.native > 0 {
			nat = fmt.Sprintf("%.2f", s.native)
			ratio = fmt.Sprintf("%.2f×", s.dlfs/s.native)
		}
		mb := show("%.0f MB", s.rss/(1<<20))
		if s.rss < 0 {
			mb = "—"
		}
		if s.rate {
			nat = fmt.Sprintf("%.0f", s.native)
			fmt.Printf("| %s | %s | %.0f | %s | %s |\n", s.name, nat, s.dlfs, ratio, mb)
			continue
		}
		fmt.Printf("| %s | %s | %.2f | %s | %s |\n", s.name, nat, s.dlfs, ratio, mb)
	}
	fmt.Println()
	fmt.Println(place)
	held := st.Cache.RAM.Bytes + st.Prefetch.StagedBytes
	per := (after - float64(held)) / float64(len(files))
	fmt.Println()
	fmt.Printf("- first scan: %.2f× native find (target ≤ 1.0): %s\n", mountSecs/findSecs, atMost(mountSecs/findSecs, 1))
	fmt.Printf("- remount with a saved catalog of %d files: usable in %.2f s (target ≤ 3 s at 10 M files); its first byte served (looked up and stat'ed against SOURCE) %.2f s after the remount began; "+
		"every directory revalidated %.2f s and every entry checked against SOURCE %.2f s after the mount, page cache dropped (the first scan took %.2f s)\n",
		len(files), remountSecs, firstByte, dirsSecs, checkSecs, mountSecs)
	ifFirst, ifSecond := dlfsFirst/nativeFirst, dlfsSecond/nativeSecond
	fmt.Printf("- ImageFolder: %.2f× native first, %.2f× second (target ≤ 1.0): %s\n", ifFirst, ifSecond, verdict(ifFirst <= 1 && ifSecond <= 1, ifFirst, ifSecond))
	fmt.Printf("- daemon RSS after every file was listed, looked up and read, less the RAM tier's %d MB and staging's %d MB: %s bytes per file (target ≤ 200): %s\n",
		st.Cache.RAM.Bytes>>20, st.Prefetch.StagedBytes>>20, show("%.0f", per), atMost(per, 200))
	fmt.Printf("- epoch of tiny files: %.2f× native from the page cache (target ≥ 0.8): %s; %.2f× from the RAM tier (target ≥ 0.3): %s, %.2f× with the dentries dropped too\n",
		dlfsCached/nativeCached, atLeast(dlfsCached/nativeCached, 0.8), dlfsRAM/nativeCached, atLeast(dlfsRAM/nativeCached, 0.3), dlfsRAMCold/nativeCached)
	fmt.Printf("- the FUSE floor (one READ round trip per file, nothing else) reads at %.2f× native page cache; dlfs's RAM tier reads at %.2f× the floor\n",
		floorRate/nativeCached, dlfsRAM/floorRate)
	return nil
}

// placementScale times placement of n keys (ImageNet-22k's paths, made on
// the fly) over members of unequal capacity, and the change when one
// leaves; it returns the lines to print.
func placementScale(n, members int) (string, error) {
	ms := make([]placement.Member, members)
	for i := range ms {
		ms[i] = placement.Member{Name: fmt.Sprintf("node-%04d", i), Capacity: int64(64+i%7) << 30}
	}
	fmt.Fprintf(os.Stderr, "placing %d keys over %d members ...\n", n, members)
	var t, t2 *placement.Table
	buildSecs, err := timed(func() (err error) { t, err = placement.New(ms); return err })
	if err != nil {
		return "", err
	}
	// The keys, made before the clock starts: one buffer and their ends.
	arena := make([]byte, 0, n*36)
	ends := make([]uint32, n)
	for i := range ends {
		arena = fmt.Appendf(arena, "train/n%08d/n%08d_%d.JPEG", i/650, i/650, i)
		ends[i] = uint32(len(arena))
	}
	owners := make([]uint16, n)
	ownSecs, _ := timed(func() error {
		start := uint32(0)
		for i, end := range ends {
			owners[i] = uint16(t.Owner(unsafe.String(&arena[start], int(end-start))))
			start = end
		}
		return nil
	})
	leaving := members / 2
	rest := append(append([]placement.Member(nil), ms[:leaving]...), ms[leaving+1:]...)
	rebuildSecs, err := timed(func() (err error) { t2, err = placement.New(rest); return err })
	if err != nil {
		return "", err
	}
	// Only the leaving member's buckets move: rendezvous hashing makes it
	// so (placement's TestMinimalMovement checks it), so it is no target
	// here; what is measured is how many they are.
	moved := 0
	for b := 0; b < placement.Buckets; b++ {
		after := t2.BucketOwner(b)
		if after >= leaving {
			after++ // t2's indices skip the member that left
		}
		if t.BucketOwner(b) != after {
			moved++
		}
	}
	return fmt.Sprintf("- placement of %.1f M keys over %d members of unequal capacity: table %.2f s, every key's owner %.2f s (target ≤ 3 s): %s. "+
		"One member leaves: the new table takes %.2f s and moves %.2f%% of the buckets (1/%d = %.2f%%); no key is hashed again.",
		float64(n)/1e6, members, buildSecs, ownSecs, atMost(buildSecs+ownSecs, 3), rebuildSecs, 100*float64(moved)/placement.Buckets, members, 100/float64(members)), nil
}

// timed runs fn and returns how long it took.
func timed(fn func() error) (float64, error) {
	start := time.Now()
	err := fn()
	return time.Since(start).Seconds(), err
}

// dropAllCaches drops the kernel's page, dentry and inode caches (root).
func dropAllCaches() error { return dropCaches(3) }

// dropCaches writes what to drop_caches: 1 drops the page cache, 2 the
// dentry and inode caches, 3 both (root).
func dropCaches(what int) error {
	exec.Command("sync").Run()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte(fmt.Sprintf("%d\n", what)), 0); err != nil {
		return fmt.Errorf("drop the kernel's caches (the scale suite runs as root): %w", err)
	}
	return nil
}

// cachedShare returns the share of the bytes of files under root that the
// page cache holds (cachestat, which counts no access; pages of 4 KiB),
// or -1 when it
// cannot tell.
func cachedShare(root string, files []string) float64 {
	var cached, total uint64
	for _, name := range files {
		f, err := os.Open(filepath.Join(root, name))
		if err != nil {
			return -1
		}
		var cs unix.Cachestat_t
		err = unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &cs, 0)
		fi, serr := f.Stat()
		f.Close()
		if err != nil || serr != nil {
			return -1
		}
		cached += cs.Cache
		total += (uint64(fi.Size()) + 4095) / 4096
	}
	if total == 0 {
		return -1
	}
	return float64(cached) / float64(total)
}

// imageFolder times torchvision's ImageFolder(root) (the listing only:
// the loader is never called) and returns the samples it found.
func imageFolder(root string) (float64, int, error) {
	script := `import sys, time, torchvision
t = time.time()
ds = torchvision.datasets.ImageFolder(sys.argv[1], loader=lambda p: p)
print(time.time() - t, len(ds))
`
	out, err := exec.Command("/usr/bin/python3", "-c", script, root).Output()
	if err != nil {
		return 0, 0, fmt.Errorf("ImageFolder(%s): %w", root, err)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("ImageFolder(%s): unexpected output %q", root, out)
	}
	secs, err1 := strconv.ParseFloat(f[0], 64)
	n, err2 := strconv.Atoi(f[1])
	return secs, n, firstErr(err1, err2)
}

// rss returns a process's resident set in bytes.
func rss(p *mountproc.Proc) (int64, error) {
	path := fmt.Sprintf("/proc/%d/status", p.Cmd.Process.Pid)
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return vmRSS(path, b)
}

// vmRSS reads the VmRSS line of a /proc/PID/status file's contents b.
func vmRSS(path string, b []byte) (int64, error) {
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			num, unit, _ := strings.Cut(strings.TrimSpace(rest), " ")
			kb, err := strconv.ParseInt(num, 10, 64)
			if err != nil || unit != "kB" || kb <= 0 {
				return 0, fmt.Errorf("%s: VmRSS %q is not a positive number of kB", path, strings.TrimSpace(rest))
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("%s has no VmRSS line (a kernel thread, or a process that has exited)", path)
}
