package integration

// Issue 32: files held whole in RAM are opened with FUSE passthrough, and
// the kernel reads them from sealed backing files without asking dlfs.

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/fusecap"
)

// needPassthrough skips the test only where the kernel, asked directly
// by a mount of this process's own (fusecap; the daemon runs as the same
// user), gives no passthrough, and fails it where the kernel does and
// the mount turned passthrough off. Only the first open decides, so it
// opens the mount's stats.
func needPassthrough(t *testing.T, mnt string) {
	t.Helper()
	if ok, why := fusecap.Passthrough(); !ok {
		t.Skipf("no FUSE passthrough here: %s", why)
	}
	st := dlfsStats(t, mnt)
	pt, _ := st["passthrough"].(map[string]any)
	if on, _ := pt["on"].(bool); !on {
		t.Fatalf("the kernel offers passthrough here, but the mount turned it off: %v", pt["why"])
	}
}

// noCachedOpen waits until the mount has had the RELEASE of every open it
// answered in caching mode (close returns before the kernel sends it):
// until then the inode's next open is cached too, the kernel allowing an
// inode open in caching mode no passthrough open.
func noCachedOpen(t *testing.T, mnt string) {
	t.Helper()
	waitFor(t, "the cached opens' RELEASE", 10*time.Second, func() bool { return passthroughNum(t, mnt, "cached_open_now") == 0 })
}

func passthroughNum(t *testing.T, mnt, key string) float64 {
	t.Helper()
	return num(dlfsStats(t, mnt), "passthrough", key)
}

// TestPassthroughReadsAndVersions: a file read once is held in RAM, and
// its next open is served by passthrough: right bytes, counted in stats,
// its backing file counted in the RAM tier. Rewritten at SOURCE and
// refreshed, it loses its backing file; an open of the old version keeps
// reading the old bytes whole (its backing file counted as evicted while
// open until it closes), and the first open after it reads the new ones.
func TestPassthroughReadsAndVersions(t *testing.T) {
	src := t.TempDir()
	path := filepath.Join(src, "f.bin")
	old, next := randomBytes(3<<20+12345, 1), randomBytes(2<<20+777, 2)
	if err := os.WriteFile(path, old, 0o644); err != nil {
		t.Fatal(err)
	}
	// No read-ahead: the file must stay held in part until it is read.
	d := startDlfs(t, src, "--ram-cache", "256MiB", "--read-ahead", "0", "--infer=false", "--push=false")
	needPassthrough(t, d.Mnt)
	f := filepath.Join(d.Mnt, "f.bin")

	// Its first block only: a file missing blocks gets no backing file
	// (a hole would read as zeros), and is read through dlfs.
	fh, err := os.Open(f)
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 1<<20)
	if _, err := io.ReadFull(fh, head); err != nil || !bytes.Equal(head, old[:1<<20]) {
		t.Fatalf("the first MiB: %v", err)
	}
	fh.Close()
	readFile(t, f, old) // through dlfs: it is not held whole yet
	st := dlfsStats(t, d.Mnt)
	// Both opens cached: the file was not held whole at either (the second
	// may also find the first's RELEASE not yet handled, close does not
	// wait for it, and is then answered as the inode's open is, without
	// asking whether the file is resident).
	if num(st, "passthrough", "opens") != 0 || num(st, "passthrough", "cached_opens") < 2 || num(st, "passthrough", "not_resident") < 1 {
		t.Fatalf("passthrough %v before the file was held whole; want no passthrough open, 2 cached", st["passthrough"])
	}
	noCachedOpen(t, d.Mnt)
	readFile(t, f, old) // held whole now
	st = dlfsStats(t, d.Mnt)
	if num(st, "passthrough", "opens") != 1 || num(st, "passthrough", "bytes") != float64(len(old)) {
		t.Fatalf("passthrough after the second read: %v; want 1 open of %d bytes", st["passthrough"], len(old))
	}
	if num(st, "cache", "ram", "backing", "files") != 1 || num(st, "cache", "ram", "backing", "bytes") < float64(len(old)) {
		t.Fatalf("RAM tier %v: want its backing file counted", st["cache"])
	}
	served := num(st, "served", "ram", "bytes") + num(st, "served", "stage", "bytes") + num(st, "served", "pfs", "bytes")

	// An open of the old version, held across the rewrite and refresh.
	held, err := os.Open(f)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	head = make([]byte, 4096)
	if _, err := io.ReadFull(held, head); err != nil || !bytes.Equal(head, old[:4096]) {
		t.Fatalf("the held open's first page: %v", err)
	}
	rewrite(t, path, next)
	if err := control(d.Mnt, "refresh"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the refresh to drop the old backing file", 10*time.Second, func() bool {
		return num(dlfsStats(t, d.Mnt), "cache", "ram", "backing", "files") == 0
	})
	if n := passthroughNum(t, d.Mnt, "evicted_open_bytes"); n < float64(len(old)) {
		t.Fatalf("evicted-open bytes %v while the old version is open; want its %d bytes", n, len(old))
	}
	rest, err := io.ReadAll(held)
	if err != nil || !bytes.Equal(append(head, rest...), old) {
		t.Fatalf("the open of the old version read %d bytes (%v), not the old version whole", len(head)+len(rest), err)
	}
	// While it is open the kernel allows the inode no other backing file:
	// an open meanwhile reads the old version too, whole.
	readFile(t, f, old)
	held.Close()
	waitFor(t, "the old version's last open to be released", 10*time.Second, func() bool {
		st := dlfsStats(t, d.Mnt)
		return num(st, "passthrough", "registered") == 0 && num(st, "passthrough", "evicted_open_bytes") == 0
	})

	readFile(t, f, next) // the new version, through dlfs
	noCachedOpen(t, d.Mnt)
	readFile(t, f, next) // and by passthrough
	st = dlfsStats(t, d.Mnt)
	if num(st, "passthrough", "opens") != 4 || num(st, "passthrough", "built") != 2 {
		t.Fatalf("passthrough %v: want 4 opens, 2 backing files built", st["passthrough"])
	}
	// The passthrough opens' bytes never reached dlfs's read path.
	now := num(st, "served", "ram", "bytes") + num(st, "served", "stage", "bytes") + num(st, "served", "pfs", "bytes")
	if now-served > float64(len(next)) {
		t.Errorf("dlfs served %v bytes after the rewrite; want at most the new version's one read of %d", now-served, len(next))
	}
}

// TestPassthroughBuiltAhead: a file read to its end through dlfs while
// RAM holds it whole gets its backing file built in the background, so
// the next epoch's open finds it built (no copy at the open) and is
// served by passthrough; a file read in part gets none.
func TestPassthroughBuiltAhead(t *testing.T) {
	whole, part := randomBytes(9<<20+4321, 3), randomBytes(5<<20, 4)
	d, _ := passthroughMount(t, "256MiB", map[string][]byte{"whole.bin": whole, "part.bin": part})
	readFile(t, filepath.Join(d.Mnt, "whole.bin"), whole) // the first epoch, through dlfs
	fh, err := os.Open(filepath.Join(d.Mnt, "part.bin"))
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 2<<20)
	if _, err := io.ReadFull(fh, head); err != nil || !bytes.Equal(head, part[:len(head)]) {
		t.Fatalf("part.bin's head: %v", err)
	}
	fh.Close()
	waitFor(t, "whole.bin's backing file built in the background", 10*time.Second, func() bool {
		st := dlfsStats(t, d.Mnt)
		return num(st, "passthrough", "built_ahead") == 1 && num(st, "cache", "ram", "backing", "files") == 1
	})
	noCachedOpen(t, d.Mnt)
	readFile(t, filepath.Join(d.Mnt, "whole.bin"), whole) // the next epoch
	st := dlfsStats(t, d.Mnt)
	if num(st, "passthrough", "opens") != 1 || num(st, "passthrough", "bytes") != float64(len(whole)) {
		t.Fatalf("passthrough %v: want whole.bin's next open served by passthrough", st["passthrough"])
	}
	if num(st, "passthrough", "built") != 1 || num(st, "passthrough", "built_ahead") != 1 {
		t.Fatalf("passthrough %v: want one backing file, built ahead of the open, none for the file read in part", st["passthrough"])
	}
}

// passthroughMount mounts a SOURCE of files with --ram-cache ram, no
// inference and no pushing, and skips the test where passthrough is off.
func passthroughMount(t *testing.T, ram string, files map[string][]byte) (d *proc, src string) {
	t.Helper()
	src = t.TempDir()
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d = startDlfs(t, src, "--ram-cache", ram, "--infer=false", "--push=false")
	needPassthrough(t, d.Mnt)
	return d, src
}

func readFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %s: %d bytes, %v; want %d bytes as written", path, len(got), err, len(want))
	}
}

// rewrite replaces path's contents and makes sure its mtime moves.
func rewrite(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
}

// TestPassthroughMovesTheCursor: the reads of a file served by
// passthrough never reach dlfs, so its open is the read: an announced
// job's cursor moves with every open, in order, exactly (no position
// taken as consumed without a read).
func TestPassthroughMovesTheCursor(t *testing.T) {
	src := t.TempDir()
	const files = 12
	var names []string
	contents := map[string][]byte{}
	if err := os.MkdirAll(filepath.Join(src, "class_a"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < files; i++ {
		rel := fmt.Sprintf("class_a/img_%02d.jpg", i)
		contents[rel] = randomBytes(2<<20+i, uint64(i))
		if err := os.WriteFile(filepath.Join(src, rel), contents[rel], 0o644); err != nil {
			t.Fatal(err)
		}
		names = append(names, rel)
	}
	d := startDlfs(t, src, "--ram-cache", "256MiB", "--infer=false", "--push=false")
	needPassthrough(t, d.Mnt)
	if err := control(d.Mnt, "job=pt sampler=sequential epoch=0"); err != nil {
		t.Fatal(err)
	}
	plan, err := os.ReadFile(filepath.Join(d.Mnt, ".dlfs/jobs/pt/rank-0/epoch-0"))
	if err != nil {
		t.Fatal(err)
	}
	order := strings.Split(strings.TrimSpace(string(plan)), "\n")
	if strings.Join(order, ",") != strings.Join(names, ",") {
		t.Fatalf("plan %v, want %v", order, names)
	}
	job := func(key string) float64 { return num(dlfsStats(t, d.Mnt), "jobs", "pt", "rank-0", key) }

	// Epoch 0 fills RAM (some of it may be passthrough already, from what
	// the prefetcher staged).
	for _, rel := range order {
		readFile(t, filepath.Join(d.Mnt, rel), contents[rel])
	}
	if c := job("cursor"); c != files {
		t.Fatalf("cursor %v after epoch 0, want %d", c, files)
	}
	noCachedOpen(t, d.Mnt)
	opens := passthroughNum(t, d.Mnt, "opens")
	for i, rel := range order {
		readFile(t, filepath.Join(d.Mnt, rel), contents[rel])
		if c := job("cursor"); c != float64(files+i+1) {
			t.Fatalf("epoch 1, after %s: cursor %v, want %d", rel, c, files+i+1)
		}
	}
	if n := passthroughNum(t, d.Mnt, "opens") - opens; n != files {
		t.Fatalf("%v of epoch 1's %d opens were served by passthrough; want all", n, files)
	}
	st := dlfsStats(t, d.Mnt)
	if c, inf := num(st, "jobs", "pt", "rank-0", "consumed_total"), num(st, "jobs", "pt", "rank-0", "inferred"); c != 2*files || inf != 0 {
		t.Fatalf("consumed %v, inferred %v; want %d consumed by reads and opens, none inferred", c, inf, 2*files)
	}
}

// TestPassthroughStagedAhead: the files an announced job's prefetcher
// staged get their backing files built before their first open, kept on
// the stage beside the blocks and counted against --staging with them
// (16 MiB, the prefetcher's 12 of it: one or two files of 3 MiB and their
// backing files at a time; the open takes them, which frees the stage for
// the next), so the job's first read of each is served by passthrough,
// bytes right, and the cursor moves with every open.
func TestPassthroughStagedAhead(t *testing.T) {
	src := t.TempDir()
	const files = 6
	contents := map[string][]byte{}
	for i := 0; i < files; i++ {
		rel := fmt.Sprintf("class_a/img_%02d.jpg", i)
		contents[rel] = randomBytes(3<<20+i*1000, uint64(40+i))
		if err := os.MkdirAll(filepath.Dir(filepath.Join(src, rel)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, rel), contents[rel], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := startDlfs(t, src, "--ram-cache", "256MiB", "--staging", "16MiB", "--infer=false", "--push=false")
	needPassthrough(t, d.Mnt)
	if err := control(d.Mnt, "job=ahead sampler=sequential epoch=0"); err != nil {
		t.Fatal(err)
	}
	plan, err := os.ReadFile(filepath.Join(d.Mnt, ".dlfs/jobs/ahead/rank-0/epoch-0"))
	if err != nil {
		t.Fatal(err)
	}
	order := strings.Split(strings.TrimSpace(string(plan)), "\n")
	for i, rel := range order {
		waitFor(t, fmt.Sprintf("%s's backing file built ahead of its open", rel), 20*time.Second, func() bool {
			return passthroughNum(t, d.Mnt, "built_ahead") >= float64(i+1)
		})
		if i == 0 {
			st := dlfsStats(t, d.Mnt)
			if held, bound := num(st, "prefetch", "staged_bytes")+num(st, "prefetch", "staged_backing_bytes"), num(st, "prefetch", "staging_capacity_bytes"); held > bound {
				t.Fatalf("the stage holds %v bytes of blocks and backing files, over its %v", held, bound)
			}
		}
		readFile(t, filepath.Join(d.Mnt, rel), contents[rel])
		if c := num(dlfsStats(t, d.Mnt), "jobs", "ahead", "rank-0", "cursor"); c != float64(i+1) {
			t.Fatalf("after %s: cursor %v, want %d", rel, c, i+1)
		}
	}
	st := dlfsStats(t, d.Mnt)
	if n := num(st, "passthrough", "opens"); n != files {
		t.Fatalf("%v of the first epoch's %d opens were served by passthrough; want all", n, files)
	}
	if b := num(st, "passthrough", "built"); b != files {
		t.Errorf("%v backing files built, want %d (one each, ahead of its open)", b, files)
	}
	if sb := num(st, "prefetch", "staged_bytes"); sb != 0 {
		t.Errorf("%v bytes left on the stage; the backing files hold them", sb)
	}
}

// TestPassthroughFromSSD: with --passthrough-ssd, a file only the SSD tier
// holds (a remount over the same --ssd-cache: RAM starts empty) is copied
// into a backing file at its open and read by passthrough, bytes right,
// and the RAM tier does not keep the copy (the SSD's share is not its
// own); its last close frees it.
func TestPassthroughFromSSD(t *testing.T) {
	want := randomBytes(6<<20+123, 7)
	src, ssd := t.TempDir(), filepath.Join(t.TempDir(), "ssd")
	if err := os.WriteFile(filepath.Join(src, "a.bin"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--ram-cache", "64MiB", "--ssd-cache", ssd, "--infer=false", "--push=false", "--passthrough", "on", "--passthrough-ssd"}
	d := startDlfs(t, src, args...)
	needPassthrough(t, d.Mnt)
	readFile(t, filepath.Join(d.Mnt, "a.bin"), want)
	waitFor(t, "the file in the SSD tier", 10*time.Second, func() bool {
		return num(dlfsStats(t, d.Mnt), "cache", "ssd", "bytes") == float64(len(want))
	})
	d.stop(t)

	d = startDlfs(t, src, args...)
	readFile(t, filepath.Join(d.Mnt, "a.bin"), want)
	st := dlfsStats(t, d.Mnt)
	if num(st, "passthrough", "opens") != 1 || num(st, "passthrough", "built_from_ssd") != 1 {
		t.Fatalf("passthrough %v: want the open served by passthrough from a copy of the SSD tier's blocks", st["passthrough"])
	}
	if num(st, "passthrough", "backing_files") != 0 || num(st, "served", "pfs", "reads") != 0 {
		t.Fatalf("after the close: %v backing files kept, %v PFS reads; want none", num(st, "passthrough", "backing_files"), num(st, "served", "pfs", "reads"))
	}
	waitFor(t, "the open's bytes given back", 5*time.Second, func() bool { return passthroughNum(t, d.Mnt, "open_bytes") == 0 })
}

// TestPassthroughDaemonKilled: SIGKILL of the daemon while a file is open
// with passthrough: the open reads its sealed backing file's bytes (the
// kernel holds it) or an error, never other bytes; a new open fails; the
// next mount at the same place clears the dead one and reads right.
func TestPassthroughDaemonKilled(t *testing.T) {
	want := randomBytes(8<<20, 5)
	d, src := passthroughMount(t, "64MiB", map[string][]byte{"a.bin": want})
	f := filepath.Join(d.Mnt, "a.bin")
	readFile(t, f, want)
	noCachedOpen(t, d.Mnt)
	readFile(t, f, want)
	held, err := os.Open(f)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if n := passthroughNum(t, d.Mnt, "registered"); n != 1 {
		t.Fatalf("%v backing files registered with the file open, want 1", n)
	}
	head := make([]byte, 4096)
	if _, err := io.ReadFull(held, head); err != nil {
		t.Fatal(err)
	}
	d.Cmd.Process.Kill()
	<-d.Exited
	rest, err := io.ReadAll(held)
	if got := append(head, rest...); len(got) > len(want) || !bytes.Equal(got, want[:len(got)]) || err == nil && len(got) != len(want) {
		t.Fatalf("the open read %d bytes after SIGKILL (err %v) that differ from the file's", len(got), err)
	}
	t.Logf("after SIGKILL the open read %d of %d bytes, err %v", len(head)+len(rest), len(want), err)
	if _, err := os.ReadFile(f); err == nil {
		t.Fatal("a new open of a killed daemon's mount succeeded")
	}
	held.Close()
	again := startMount(t, bin.dlfs, d.Mnt, "mount", "--ram-cache", "64MiB", src, d.Mnt)
	readFile(t, filepath.Join(again.Mnt, "a.bin"), want)
}

// TestPassthroughBackingSealed: the daemon's backing file of a file open
// with passthrough can be found through /proc/PID/fd, as root can, but
// not written, shrunk or grown through it; it holds the file's bytes.
func TestPassthroughBackingSealed(t *testing.T) {
	want := randomBytes(3<<20+99, 6)
	d, _ := passthroughMount(t, "64MiB", map[string][]byte{"s.bin": want})
	f := filepath.Join(d.Mnt, "s.bin")
	readFile(t, f, want)
	waitFor(t, "s.bin's backing file", 10*time.Second, func() bool {
		return num(dlfsStats(t, d.Mnt), "cache", "ram", "backing", "files") == 1
	})
	fdDir := fmt.Sprintf("/proc/%d/fd", d.Cmd.Process.Pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatal(err)
	}
	var memfd string
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join(fdDir, e.Name())); err == nil && strings.Contains(target, "memfd:dlfs:s.bin") {
			memfd = filepath.Join(fdDir, e.Name())
		}
	}
	if memfd == "" {
		t.Fatalf("no memfd of s.bin among the daemon's descriptors")
	}
	if w, err := os.OpenFile(memfd, os.O_WRONLY, 0); err == nil {
		_, werr := w.WriteAt([]byte("evil"), 0)
		terr := w.Truncate(5)
		gerr := w.Truncate(int64(len(want)) + 4096)
		w.Close()
		if werr == nil || terr == nil || gerr == nil {
			t.Fatalf("through %s: write %v, shrink %v, grow %v; want all refused", memfd, werr, terr, gerr)
		}
	}
	got, err := os.ReadFile(memfd)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the backing file holds %d bytes (%v), not the file's", len(got), err)
	}
	noCachedOpen(t, d.Mnt)
	readFile(t, f, want) // by passthrough, the same bytes
	if n := passthroughNum(t, d.Mnt, "opens"); n < 1 {
		t.Fatalf("%v passthrough opens, want the second read's", n)
	}
}

// TestPassthroughThousandsOfOpens: 2,000 concurrent opens of one large
// file, held whole in RAM, share one backing file (one build, one
// registration), every one reads the file's bytes, and once the last
// closes the backing id stays registered, idle, while RAM keeps the file:
// the next open reuses it.
func TestPassthroughThousandsOfOpens(t *testing.T) {
	want := randomBytes(8<<20+17, 7)
	d, _ := passthroughMount(t, "64MiB", map[string][]byte{"big.bin": want})
	f := filepath.Join(d.Mnt, "big.bin")
	readFile(t, f, want) // held whole now
	noCachedOpen(t, d.Mnt)
	readFile(t, f, want)
	if n := passthroughNum(t, d.Mnt, "opens"); n != 1 {
		t.Fatalf("%v passthrough opens; want the second read's", n)
	}
	const opens = 2000
	files := make([]*os.File, 0, opens)
	defer func() {
		for _, h := range files {
			h.Close()
		}
	}()
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, opens)
	for range opens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := os.Open(f)
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			files = append(files, h)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("open: %v", err)
	}
	st := dlfsStats(t, d.Mnt)
	if num(st, "passthrough", "registered") != 1 || num(st, "passthrough", "built") != 1 {
		t.Fatalf("passthrough %v with %d opens; want one backing file built and registered", st["passthrough"], opens)
	}
	// Every open reads the whole file, some at once.
	sem := make(chan struct{}, 64)
	bad := make(chan string, opens)
	for i, h := range files {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			got := make([]byte, len(want))
			if n, err := h.ReadAt(got, 0); n != len(want) || !bytes.Equal(got, want) {
				bad <- fmt.Sprintf("open %d read %d bytes (%v) that differ from the file's", i, n, err)
			}
		}()
	}
	wg.Wait()
	close(bad)
	for msg := range bad {
		t.Fatal(msg)
	}
	st = dlfsStats(t, d.Mnt)
	if pt, sh := num(st, "passthrough", "opens"), num(st, "passthrough", "shared_opens"); pt < opens || sh < opens-1 {
		t.Fatalf("passthrough %v: want all %d opens by passthrough, sharing one backing file", st["passthrough"], opens)
	}
	for _, h := range files {
		h.Close()
	}
	files = nil
	waitFor(t, "the backing id idle after the last close", 30*time.Second, func() bool {
		st := dlfsStats(t, d.Mnt)
		return num(st, "passthrough", "registered") == 1 && num(st, "passthrough", "registered_idle") == 1
	})
	reused := passthroughNum(t, d.Mnt, "reused_registrations")
	readFile(t, f, want)
	if st := dlfsStats(t, d.Mnt); num(st, "passthrough", "reused_registrations") != reused+1 || num(st, "passthrough", "built") != 1 {
		t.Fatalf("passthrough %v: want the open after the last close to reuse the idle id, one backing file built", st["passthrough"])
	}
}

// TestPassthroughAllowOther: a reader's mmap of a file open by
// passthrough holds the daemon's backing file past the RAM bound, so a
// mount open to other users keeps passthrough off under auto, saying
// why, and uses it where asked (--passthrough on).
func TestPassthroughAllowOther(t *testing.T) {
	want := randomBytes(3<<20, 8)
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "a.bin"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDlfs(t, src, "--allow-other", "--ram-cache", "64MiB", "--infer=false", "--push=false")
	readFile(t, filepath.Join(d.Mnt, "a.bin"), want)
	st := dlfsStats(t, d.Mnt)
	pt, _ := st["passthrough"].(map[string]any)
	if on, _ := pt["on"].(bool); on || !strings.Contains(fmt.Sprint(pt["why"]), "--allow-other") {
		t.Fatalf("passthrough %v with --allow-other under auto; want off, saying why", pt)
	}
	d.stop(t)

	d = startDlfs(t, src, "--allow-other", "--passthrough", "on", "--ram-cache", "64MiB", "--infer=false", "--push=false")
	needPassthrough(t, d.Mnt)
	readFile(t, filepath.Join(d.Mnt, "a.bin"), want)
	noCachedOpen(t, d.Mnt)
	readFile(t, filepath.Join(d.Mnt, "a.bin"), want)
	if n := passthroughNum(t, d.Mnt, "opens"); n != 1 {
		t.Fatalf("%v passthrough opens with --allow-other --passthrough on; want the second read's", n)
	}
}
