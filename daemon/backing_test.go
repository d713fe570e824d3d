package daemon

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/test/fusecap"
)

// The node's side of passthrough (passthrough.go, builder.go), on a real
// mount. The test process is the daemon: its opens would count as the
// daemon's own (never passthrough) from the main thread, whose id is the
// process's, so every open here runs on another thread (onThread).

// ptNode starts a node with passthrough on over a SOURCE of files (name
// to bytes). It skips the test only where the kernel, asked directly
// (fusecap), gives this process no passthrough, and fails it where the
// kernel does and the mount turned passthrough off.
func ptNode(t *testing.T, files map[string][]byte, mod func(*Config)) (*Node, string) {
	t.Helper()
	if ok, why := fusecap.Passthrough(); !ok {
		t.Skipf("no FUSE passthrough here: %s", why)
	}
	src := t.TempDir()
	files["decide"] = nil // empty: no backing file, nothing for the builder
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n, mnt := start(t, src, func(c *Config) {
		c.Passthrough, c.NoInfer, c.NoPush = PassthroughOn, true, true
		if mod != nil {
			mod(c)
		}
	})
	onThread(t, func() { readWant(t, filepath.Join(mnt, "decide"), files["decide"]) }) // the first open decides
	if st := n.fs.PassthroughStats(); !st.On {
		t.Fatalf("the kernel offers passthrough here, but the mount turned it off: %s", st.Why)
	}
	return n, mnt
}

// onThread runs fn on a thread other than the main one, whose id is the
// process's (fusefs takes a request from it for the daemon's own).
func onThread(t *testing.T, fn func()) {
	t.Helper()
	done := make(chan struct{})
	var run func()
	run = func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if unix.Gettid() == os.Getpid() { // hold the main thread, run on another
			inner := make(chan struct{})
			go func() { defer close(inner); run() }()
			<-inner
			return
		}
		defer close(done)
		fn()
	}
	go run()
	<-done
}

func readWant(t *testing.T, path string, want []byte) {
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("read %s: %d bytes (%v), want %d as written", path, len(got), err, len(want))
	}
}

func (n *Node) ptStats() PassthroughStats { return n.passthroughStats(n.tiers.ram.Stats()) }

// waitPT polls the node's passthrough stats until cond holds, failing
// after a deadline.
func waitPT(t *testing.T, n *Node, what string, cond func(PassthroughStats) bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(n.ptStats()); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %+v", what, n.ptStats())
		}
	}
}

// noCachedOpen waits until every open answered in caching mode, but
// held of those still open, has its RELEASE (it comes after close
// returns): until then the inode's next open is cached too.
func noCachedOpen(t *testing.T, n *Node, held int) {
	t.Helper()
	waitPT(t, n, "the cached opens' RELEASE", func(st PassthroughStats) bool { return st.CachedNow == held })
}

// holder holds opens of a mount's files, counting those answered in
// caching mode.
type holder struct {
	n      *Node
	files  []*os.File
	cached int
}

// open opens path and holds it, and reports whether passthrough serves it.
func (h *holder) open(t *testing.T, path string) bool {
	t.Helper()
	before := h.n.ptStats().Opens
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	h.files = append(h.files, f)
	pt := h.n.ptStats().Opens > before
	if !pt {
		h.cached++
	}
	return pt
}

func (h *holder) close() {
	for _, f := range h.files {
		f.Close()
	}
	h.files, h.cached = nil, 0
}

// memfds counts this process's descriptors of backing files.
func memfds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, "/memfd:dlfs:") {
			count++
		}
	}
	return count
}

// TestPassthroughDescriptorBudget: every backing file holds a descriptor
// until its last reference goes, those an open holds after the RAM tier
// let them go too. The node's backing files never hold more than their
// budget (maxFiles): an open past it is read through the daemon, bytes
// right. (Counting only the tier's files, held opens of small files the
// tier kept evicting took a daemon to EMFILE.)
func TestPassthroughDescriptorBudget(t *testing.T) {
	const small, budget = 30, 8
	files := map[string][]byte{"filler.bin": bytes.Repeat([]byte("f"), 3<<20)}
	for i := range small {
		files[fmt.Sprintf("s%02d", i)] = bytes.Repeat([]byte{byte('a' + i%26)}, 100)
	}
	n, mnt := ptNode(t, files, func(c *Config) { c.RAMCache = 2 << 20 })
	n.tiers.backing.maxFiles.Store(budget)
	base := memfds(t) // other nodes' in this process
	held := &holder{n: n}
	defer held.close()
	onThread(t, func() {
		for i := range small {
			name := fmt.Sprintf("s%02d", i)
			readWant(t, filepath.Join(mnt, name), files[name]) // now in RAM
			noCachedOpen(t, n, held.cached)
			held.open(t, filepath.Join(mnt, name))                             // by passthrough while the budget allows
			readWant(t, filepath.Join(mnt, "filler.bin"), files["filler.bin"]) // evicts the tier's files
			noCachedOpen(t, n, held.cached)
			if fds, st := memfds(t)-base, n.ptStats(); fds > budget || st.BackingFds > budget {
				t.Fatalf("after %d held opens: %d backing files' descriptors (stats %d), over the budget of %d", i+1, fds, st.BackingFds, budget)
			}
		}
		for i, h := range held.files {
			got := make([]byte, 200)
			if k, _ := h.ReadAt(got, 0); !bytes.Equal(got[:k], files[fmt.Sprintf("s%02d", i)]) {
				t.Errorf("held open %d read %q", i, got[:k])
			}
		}
	})
	st := n.ptStats()
	if st.MaxFiles != budget || st.TooMany == 0 || st.Opens == 0 {
		t.Fatalf("stats %+v: want the budget of %d reported, some opens by passthrough and some turned away by it", st, budget)
	}
	if st.EvictedOpenBytes == 0 {
		t.Fatalf("stats %+v: the filler evicted no backing file still open, so the test shows nothing", st)
	}
	held.close()
	waitPT(t, n, "the opens' descriptors closed", func(st PassthroughStats) bool { return st.BackingFds == st.BackingFiles && st.OpenBytes == 0 })
	if fds := memfds(t) - base; int64(fds) != n.ptStats().BackingFds {
		t.Fatalf("%d backing files' descriptors open, stats say %d", fds, n.ptStats().BackingFds)
	}
}

// TestPassthroughOpenCharge: each open holding a backing file counts its
// pages and a fixed overhead against the open bound (a quarter of the
// RAM tier), not its size: 100-byte files count 6 KiB each (4 KiB
// pages), so a 1 MiB tier lets opens hold 42 of them, and turns the rest
// away.
func TestPassthroughOpenCharge(t *testing.T) {
	const small = 60
	files := map[string][]byte{}
	for i := range small {
		files[fmt.Sprintf("s%02d", i)] = bytes.Repeat([]byte{byte('a' + i%26)}, 100)
	}
	n, mnt := ptNode(t, files, func(c *Config) { c.RAMCache = 1 << 20 })
	bound := n.openBound()
	want := int(bound / openCharge(100))
	if openCharge(100) != pageSize+openOverhead || want >= small {
		t.Fatalf("the bound %d holds %d opens of 100 bytes, charged %d each; want a page and %d bytes each, fewer than %d", bound, want, openCharge(100), openOverhead, small)
	}
	held := &holder{n: n}
	defer held.close()
	onThread(t, func() {
		for i := range small {
			name := fmt.Sprintf("s%02d", i)
			readWant(t, filepath.Join(mnt, name), files[name])
			noCachedOpen(t, n, held.cached)
			held.open(t, filepath.Join(mnt, name))
		}
	})
	st := n.ptStats()
	if st.Opens != int64(want) || held.cached != small-want || st.OverBound < int64(small-want) || st.OpenBytes > bound {
		t.Fatalf("stats %+v with %d opens held, %d cached: want %d by passthrough, the rest turned away by the bound, open bytes within %d", st, small, held.cached, want, bound)
	}
	held.close()
	waitPT(t, n, "the open bytes given back", func(st PassthroughStats) bool { return st.OpenBytes == 0 })
}

// TestPassthroughVersions: a file held whole is built into a backing file
// at its open (or by the builder after its read) and served by
// passthrough, the RAM tier keeping the file; the open's bytes go back at
// its close. Rewritten at SOURCE and refreshed, the tier drops it, and the
// next open held whole reads the new version from a new backing file,
// never the old one.
func TestPassthroughVersions(t *testing.T) {
	old, next := bytes.Repeat([]byte("o"), 3<<20+5), bytes.Repeat([]byte("n"), 2<<20+7)
	n, mnt := ptNode(t, map[string][]byte{"f.bin": old}, nil)
	path := filepath.Join(mnt, "f.bin")
	onThread(t, func() {
		readWant(t, path, old) // through the daemon: not held yet
		noCachedOpen(t, n, 0)
		readWant(t, path, old)
	})
	st := n.ptStats()
	if st.Opens != 1 || st.Built != 1 || st.BackingFiles != 1 || st.Bytes != int64(len(old)) {
		t.Fatalf("stats %+v: want the second open by passthrough, one backing file built and kept", st)
	}
	waitPT(t, n, "the open's bytes given back", func(st PassthroughStats) bool { return st.OpenBytes == 0 && st.Registered == st.Idle })

	if err := os.WriteFile(filepath.Join(n.cat.Source(), "f.bin"), next, 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(filepath.Join(n.cat.Source(), "f.bin"), later, later); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitPT(t, n, "the old version's backing file dropped", func(st PassthroughStats) bool { return st.BackingFiles == 0 && st.Registered == 0 })
	onThread(t, func() {
		readWant(t, path, next)
		noCachedOpen(t, n, 0)
		readWant(t, path, next)
	})
	if st := n.ptStats(); st.Opens != 2 || st.Built != 2 || st.BackingFds != 1 {
		t.Fatalf("stats %+v: want the new version's second open by passthrough from a second backing file, the old one closed", st)
	}
}

// TestPassthroughBuiltAhead: a file read to its end through the daemon
// while RAM holds it whole gets its backing file built in the background,
// and the next open finds it built; a file read in part gets none.
func TestPassthroughBuiltAhead(t *testing.T) {
	whole, part := bytes.Repeat([]byte("w"), 5<<20+3), bytes.Repeat([]byte("p"), 5<<20)
	n, mnt := ptNode(t, map[string][]byte{"whole.bin": whole, "part.bin": part}, nil)
	onThread(t, func() {
		readWant(t, filepath.Join(mnt, "whole.bin"), whole)
		h, err := os.Open(filepath.Join(mnt, "part.bin"))
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		head := make([]byte, 2<<20)
		if k, err := h.ReadAt(head, 0); k != len(head) || !bytes.Equal(head, part[:len(head)]) {
			t.Fatalf("part.bin's head: %d bytes, %v", k, err)
		}
	})
	waitPT(t, n, "whole.bin built in the background", func(st PassthroughStats) bool { return st.BuiltAhead == 1 && st.BackingFiles == 1 })
	noCachedOpen(t, n, 0)
	onThread(t, func() { readWant(t, filepath.Join(mnt, "whole.bin"), whole) })
	if st := n.ptStats(); st.Opens != 1 || st.Built != 1 || st.Bytes != int64(len(whole)) {
		t.Fatalf("stats %+v: want whole.bin's next open by passthrough, from the one file built ahead", st)
	}
	waitPT(t, n, "the open's reference released, the tier's file left", func(st PassthroughStats) bool {
		return st.OpenBytes == 0 && st.BackingFds == 1 && st.BackingFiles == 1
	})
}

// TestPassthroughCorruptBlock: a block of the RAM tier that fails its
// sum gets its file no backing file (the kernel would serve its bytes
// unchecked): the open is read through the daemon, which reads the
// block again, bytes right. (That read reaches the end, so the builder
// may build the file after it, from the block read again.)
func TestPassthroughCorruptBlock(t *testing.T) {
	const bs = 64 << 10
	want := bytes.Repeat([]byte("c"), 3*bs+100)
	n, mnt := ptNode(t, map[string][]byte{"c.bin": want}, func(c *Config) {
		c.BlockSize, c.NoReadAhead = bs, true
		c.SSDDir = "" // whose writer would read the block beside the damage
	})
	path := filepath.Join(mnt, "c.bin")
	onThread(t, func() {
		// A byte of every block, never the last (O_DIRECT: no readahead
		// of the kernel's reaches it), so that the builder is not offered
		// the file: the tier holds every block whole.
		h, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		one := make([]byte, 1)
		for off := int64(0); off < int64(len(want)); off += bs {
			if k, err := h.ReadAt(one, off); k != 1 || one[0] != 'c' {
				t.Fatalf("read at %d: %d bytes, %v", off, k, err)
			}
		}
	})
	e := n.cat.Snapshot().Lookup("c.bin")
	key := loader.BlockKey(e.Path(), 1)
	b, ok := n.tiers.ram.Peek(key, n.tag(e, key))
	if !ok {
		t.Fatal("block 1 is not in the RAM tier")
	}
	b.Data[10] ^= 0xff    // the tier's own copy
	noCachedOpen(t, n, 0) // takes the tier's lock after the damage, before any read of it
	onThread(t, func() {
		h, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		if st := n.ptStats(); st.Opens != 0 || st.BuildFailures != 1 || st.Built != 0 {
			t.Fatalf("stats %+v: want no passthrough open, the build refused for the bad block", st)
		}
		got := make([]byte, len(want)+1)
		if k, _ := h.ReadAt(got, 0); !bytes.Equal(got[:k], want) {
			t.Fatalf("read %d bytes that differ from the file's", k)
		}
	})
}

// TestPassthroughOpensMoveTheReader: a passthrough open, whose reads never
// reach the daemon, is reported as its read (the reader tracker learns
// of it, served by "passthrough").
func TestPassthroughOpensMoveTheReader(t *testing.T) {
	want := bytes.Repeat([]byte("r"), 2<<20)
	n, mnt := ptNode(t, map[string][]byte{"r.bin": want}, nil)
	onThread(t, func() {
		readWant(t, filepath.Join(mnt, "r.bin"), want)
		noCachedOpen(t, n, 0)
		readWant(t, filepath.Join(mnt, "r.bin"), want)
	})
	if st := n.ptStats(); st.Opens != 1 {
		t.Fatalf("stats %+v: want the second open by passthrough", st)
	}
	reported := int64(0)
	for _, s := range n.readers.Streams() {
		reported += s.Sources["passthrough"].Reads
	}
	if reported != 1 {
		t.Fatalf("the reader tracker learned of %d passthrough opens, want 1; streams %+v", reported, n.readers.Streams())
	}
}

// TestBuilderGivesUp: a file offered to the builder that the tiers do not
// hold whole is offered again a little later, builderTries times in all
// (its reader's other blocks may be on their way), then forgotten; a
// closed builder takes no offer.
func TestBuilderGivesUp(t *testing.T) {
	n, _ := ptNode(t, map[string][]byte{"u.bin": bytes.Repeat([]byte("u"), 1<<20)}, nil)
	e := n.cat.Snapshot().Lookup("u.bin")
	b := n.tiers.builder
	b.offer(e) // never read: missing
	most := 0
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
		b.mu.Lock()
		tries, idle := b.tries[e.Ino], len(b.queued) == 0 && len(b.tries) == 0 && len(b.building) == 0
		b.mu.Unlock()
		most = max(most, tries)
		if idle && most > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the builder still retries the file after %d tries", most)
		}
	}
	if most != builderTries-1 {
		t.Fatalf("offered again %d times, want %d", most, builderTries-1)
	}
	if st := n.ptStats(); st.Built != 0 || st.BackingFds != 0 {
		t.Fatalf("stats %+v: want nothing built", st)
	}
	b.close()
	b.offer(e)
	b.mu.Lock()
	queued := len(b.queued)
	b.mu.Unlock()
	if queued != 0 {
		t.Fatal("a closed builder took an offer")
	}
}
