package fusefs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/backing"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/test/fusecap"
)

// backedTree is a counting tree that holds backing files of the files it
// is told to (by inode number), built from SOURCE's bytes.
type backedTree struct {
	*countingTree
	mu      sync.Mutex
	backed  map[uint64]bool
	asked   map[uint64]int    // Backing calls by inode
	opened  map[uint64]uint32 // the last passthrough open's pid, by inode
	nOpened int
	// own makes every open the daemon's own (FS.ownThread), as Push's are.
	own atomic.Bool
	// With keeping, the tree keeps each file it builds, as the RAM tier
	// does (backing.File.Keep), and answers with it until letGo. With
	// rebuild too, it builds a new file from SOURCE at every ask and
	// keeps it beside the ones it kept before (another version, or the
	// same rebuilt, while the first is still kept).
	keeping bool
	rebuild bool
	kept    map[uint64]*backing.File
	before  []*backing.File // kept files a rebuild replaced, still kept
}

func (b *backedTree) Backing(e *catalog.Entry) BackingFile {
	b.mu.Lock()
	b.asked[e.Ino]++
	ok := b.backed[e.Ino]
	b.mu.Unlock()
	if !ok {
		return nil
	}
	if b.keeping {
		b.mu.Lock()
		kf, rebuild := b.kept[e.Ino], b.rebuild
		b.mu.Unlock()
		if kf != nil && !rebuild && kf.Acquire() {
			return kf
		}
	}
	data, err := os.ReadFile(filepath.Join(b.Source(), e.Path()))
	if err != nil {
		return nil
	}
	const bs = 64 << 10
	f, err := backing.Build(e.Path(), int64(len(data)), bs, func(i int64) (backing.Block, bool) {
		d := data[i*bs : min(int64(len(data)), (i+1)*bs)]
		return backing.Block{Data: d, Tag: 7, Sum: integrity.Sum(7, d)}, true
	})
	if err != nil {
		return nil
	}
	if b.keeping && f.Acquire() { // the keeper's reference is Build's
		f.Keep()
		b.mu.Lock()
		if old := b.kept[e.Ino]; old != nil {
			b.before = append(b.before, old)
		}
		b.kept[e.Ino] = f
		b.mu.Unlock()
	}
	return f
}

// letGo makes the tree let go of ino's kept file, as the RAM tier evicts.
func (b *backedTree) letGo(ino uint64) {
	b.mu.Lock()
	kf := b.kept[ino]
	delete(b.kept, ino)
	b.mu.Unlock()
	if kf != nil {
		kf.Drop()
		kf.Release()
	}
}

func (b *backedTree) OpenedPassthrough(e *catalog.Entry, pid uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.opened[e.Ino] = pid
	b.nOpened++
}

func (b *backedTree) back(ino uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.backed[ino] = true
}

func (b *backedTree) askedOf(ino uint64) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.asked[ino]
}

// mountBacked mounts a backed tree with passthrough on. It skips the test
// only where the kernel, asked directly (fusecap), cannot give this
// process passthrough, and fails it where the kernel can and the mount
// turned passthrough off.
func mountBacked(t *testing.T, sizes ...int) (*FS, *backedTree, string) {
	t.Helper()
	var bt *backedTree
	f, _, mnt := mountDataset(t, Config{Passthrough: true}, func(c *countingTree) Dataset {
		bt = &backedTree{countingTree: c, backed: map[uint64]bool{}, asked: map[uint64]int{}, opened: map[uint64]uint32{},
			kept: map[uint64]*backing.File{}}
		return bt
	}, func(f *FS) {
		f.ownThread = func(uint32) bool { return bt.own.Load() } // this test reads through its own mount
	}, sizes...)
	if ok, why := fusecap.Passthrough(); !ok {
		t.Skipf("no FUSE passthrough here: %s", why)
	}
	if !f.passthroughOn() {
		t.Fatalf("the kernel offers passthrough and registers a backing file here, but the mount turned it off: %s", f.PassthroughStats().Why)
	}
	return f, bt, mnt
}

func content(i, n int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, n) }

// TestPassthroughServesBackedFiles: a file with a backing file is opened
// with passthrough: its bytes are right, no read reaches the daemon, the
// open is reported with its reader's pid and counted; a file without one
// is read through the daemon as before.
func TestPassthroughServesBackedFiles(t *testing.T) {
	sizes := []int{300_000, 5000}
	f, data, mnt := mountBacked(t, sizes...)
	backed := data.Snapshot().Lookup("c/" + fileName(0))
	plain := data.Snapshot().Lookup("c/" + fileName(1))
	data.back(backed.Ino)

	got, err := os.ReadFile(filepath.Join(mnt, backed.Path()))
	if err != nil || !bytes.Equal(got, content(0, sizes[0])) {
		t.Fatalf("read %s: %d bytes, err %v", backed.Path(), len(got), err)
	}
	if r, st := data.readsOf(backed.Ino), f.PassthroughStats(); r != 0 || st.Reads != 0 {
		t.Fatalf("%d reads of a passthrough file reached the dataset, %d READs the daemon (FOPEN_DIRECT_IO sends them all); stats %+v", r, st.Reads, st)
	}
	data.mu.Lock()
	pid, n := data.opened[backed.Ino], data.nOpened
	data.mu.Unlock()
	if n != 1 || pid == 0 {
		t.Fatalf("opens reported %d, pid %d; want 1, a pid", n, pid)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, plain.Path())); err != nil || !bytes.Equal(got, content(1, sizes[1])) {
		t.Fatalf("read %s: %d bytes, err %v", plain.Path(), len(got), err)
	}
	reads := data.readsOf(plain.Ino)
	if reads == 0 {
		t.Fatal("the file without a backing file was not read through the daemon")
	}
	// Its open in caching mode keeps the page cache (FOPEN_KEEP_CACHE, as
	// noOpen did): the next open's read is the kernel's.
	if got, err := os.ReadFile(filepath.Join(mnt, plain.Path())); err != nil || !bytes.Equal(got, content(1, sizes[1])) {
		t.Fatalf("read %s again: %d bytes, err %v", plain.Path(), len(got), err)
	}
	if r := data.readsOf(plain.Ino); r != reads {
		t.Fatalf("the second open's read reached the daemon (%d reads, then %d): the page cache was dropped at the open", reads, r)
	}
	waitFor(t, "the backing file unregistered after close", func() bool { return f.PassthroughStats().Registered == 0 })
	st := f.PassthroughStats()
	if !st.On || st.Opens != 1 || st.Bytes != int64(sizes[0]) || st.Cached != 2 {
		t.Fatalf("stats %+v; want on, 1 passthrough open of %d bytes, 2 cached", st, sizes[0])
	}
}

// TestPassthroughOwnOpens: the daemon's own opens (Push's) are never an
// inode's first passthrough open, and never reported as a reader's: one
// of an inode open by passthrough already shares its backing file, and is
// not reported either.
func TestPassthroughOwnOpens(t *testing.T) {
	f, data, mnt := mountBacked(t, 100_000)
	e := data.Snapshot().Lookup("c/" + fileName(0))
	data.back(e.Ino)
	path := filepath.Join(mnt, e.Path())
	opened := func() int {
		data.mu.Lock()
		defer data.mu.Unlock()
		return data.nOpened
	}

	data.own.Store(true)
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, content(0, 100_000)) {
		t.Fatalf("the daemon's own read: %d bytes, %v", len(got), err)
	}
	if st := f.PassthroughStats(); st.Opens != 0 || st.Cached != 1 || opened() != 0 || data.askedOf(e.Ino) != 0 {
		t.Fatalf("stats %+v, %d reported, asked %d; want the daemon's own open cached, unreported, no backing file asked for", st, opened(), data.askedOf(e.Ino))
	}
	waitFor(t, "the own open's RELEASE", func() bool { return f.PassthroughStats().CachedNow == 0 })

	data.own.Store(false)
	reader, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	data.own.Store(true)
	own, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	readWhole(t, own, content(0, 100_000))
	own.Close()
	if st := f.PassthroughStats(); st.Opens != 2 || st.Shared != 1 || opened() != 1 {
		t.Fatalf("stats %+v, %d reported; want the reader's open and the daemon's sharing its backing file, only the reader's reported", st, opened())
	}
}

// TestPassthroughOneBackingPerInode: concurrent opens of one file share
// one backing file, registered while any is open; an open while the inode
// is open in caching mode stays in caching mode (the kernel would fail a
// passthrough one), and the first open after every open closed uses
// passthrough again.
func TestPassthroughOneBackingPerInode(t *testing.T) {
	f, data, mnt := mountBacked(t, 200_000)
	e := data.Snapshot().Lookup("c/" + fileName(0))
	path := filepath.Join(mnt, e.Path())

	// Caching mode first: no backing file yet.
	cached, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	data.back(e.Ino)
	second, err := os.Open(path)
	if err != nil {
		t.Fatalf("an open while the inode is open in caching mode: %v", err)
	}
	if st := f.PassthroughStats(); st.Opens != 0 || st.Cached != 2 {
		t.Fatalf("stats %+v; want 2 cached opens", st)
	}
	readWhole(t, second, content(0, 200_000))
	second.Close()
	cached.Close()
	waitFor(t, "the cached opens released (RELEASE comes after close returns)", func() bool {
		f.pt.mu.Lock()
		defer f.pt.mu.Unlock()
		return f.pt.inodes[e.Ino] == nil
	})

	// Passthrough: many opens, one backing file.
	var files []*os.File
	for i := 0; i < 20; i++ {
		fh, err := os.Open(path)
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		files = append(files, fh)
	}
	st := f.PassthroughStats()
	if st.Opens != 20 || st.Shared != 19 || st.Registered != 1 {
		t.Fatalf("stats %+v; want 20 passthrough opens, 19 shared, 1 registered", st)
	}
	if a := data.askedOf(e.Ino); a != 2 {
		t.Fatalf("backing file asked for %d times, want 2 (the cached opens', then the first passthrough open's)", a)
	}
	for _, fh := range files {
		readWhole(t, fh, content(0, 200_000))
		fh.Close()
	}
	if data.readsOf(e.Ino) == 0 {
		t.Fatal("the cached opens' read never reached the daemon")
	}
	waitFor(t, "the backing file unregistered after the last close (RELEASE comes after close returns)", func() bool {
		return f.PassthroughStats().Registered == 0
	})
}

// TestPassthroughIdleRegistration: while the Dataset's keeper keeps a
// file, its id stays registered after the last close, and the next open
// reuses it and reads the right bytes; the keeper letting go of the file
// unregisters the idle id at once, and an open after that registers the
// new file. A file let go while open is unregistered at its last close.
func TestPassthroughIdleRegistration(t *testing.T) {
	f, data, mnt := mountBacked(t, 150_000)
	data.keeping = true
	e := data.Snapshot().Lookup("c/" + fileName(0))
	data.back(e.Ino)
	path := filepath.Join(mnt, e.Path())
	read := func() {
		t.Helper()
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, content(0, 150_000)) {
			t.Fatalf("read: %d bytes, err %v", len(got), err)
		}
	}
	idle := func() bool { st := f.PassthroughStats(); return st.Registered == 1 && st.Idle == 1 }

	read()
	waitFor(t, "the id idle after the close (RELEASE comes after close returns)", idle)
	read()
	waitFor(t, "the id idle again", idle)
	if st := f.PassthroughStats(); st.Opens != 2 || st.Reused != 1 {
		t.Fatalf("stats %+v; want 2 passthrough opens, the second reusing the idle id", st)
	}
	if r := data.readsOf(e.Ino); r != 0 {
		t.Fatalf("%d reads reached the daemon", r)
	}

	data.letGo(e.Ino)
	if st := f.PassthroughStats(); st.Registered != 0 || st.Idle != 0 {
		t.Fatalf("stats %+v after the keeper let go; want the idle id unregistered at once", st)
	}
	read() // a new file, kept and registered
	waitFor(t, "the new file's id idle", idle)
	if st := f.PassthroughStats(); st.Opens != 3 || st.Reused != 1 {
		t.Fatalf("stats %+v; want 3 passthrough opens, 1 reusing", st)
	}

	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	data.letGo(e.Ino) // while open: the open keeps reading its file
	readWhole(t, fh, content(0, 150_000))
	// Its id stays registered while the inode is open: an open meanwhile
	// shares it (an id unregistered under an open fails the next one).
	f.pt.mu.Lock()
	io := f.pt.inodes[e.Ino]
	registered := io != nil && io.id > 0 && io.pt == 1
	f.pt.mu.Unlock()
	if !registered {
		t.Fatal("the keeper letting go of a file still open unregistered its id")
	}
	shared, err := os.Open(path)
	if err != nil {
		t.Fatalf("an open while the first is open, after the keeper let go: %v", err)
	}
	readWhole(t, shared, content(0, 150_000))
	shared.Close()
	fh.Close()
	waitFor(t, "the id unregistered at the last close", func() bool { return f.PassthroughStats().Registered == 0 })
	if st := f.PassthroughStats(); st.Reused != 2 || st.Shared != 1 {
		t.Fatalf("stats %+v; want the open before the letting go to reuse the idle id, and one open sharing it", st)
	}
}

// TestPassthroughIdleIdOfAnotherFile: an idle id is reused only for the
// file it was registered for. When the Dataset answers an inode's next
// open with another backing file (another version of the file, while the
// keeper still keeps the first), the open registers that one and reads
// its bytes, never the idle id's.
func TestPassthroughIdleIdOfAnotherFile(t *testing.T) {
	const size = 120_000
	f, data, mnt := mountBacked(t, size)
	data.keeping = true
	e := data.Snapshot().Lookup("c/" + fileName(0))
	data.back(e.Ino)
	path := filepath.Join(mnt, e.Path())
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, content(0, size)) {
		t.Fatalf("read: %d bytes, err %v", len(got), err)
	}
	waitFor(t, "the id idle after the close", func() bool { st := f.PassthroughStats(); return st.Registered == 1 && st.Idle == 1 })

	// Other bytes of the same size (the attributes the kernel caches
	// stay right), in a file the tree builds beside the one it keeps.
	if err := os.WriteFile(filepath.Join(data.Source(), e.Path()), content(7, size), 0o644); err != nil {
		t.Fatal(err)
	}
	data.mu.Lock()
	data.rebuild = true
	data.mu.Unlock()
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, content(7, size)) {
		t.Fatalf("the open after the Dataset's file changed read %d bytes (%v), not the new file's: the idle id of the old one was reused", len(got), err)
	}
	waitFor(t, "the new file's id idle", func() bool { st := f.PassthroughStats(); return st.Registered == 1 && st.Idle == 1 })
	if st := f.PassthroughStats(); st.Opens != 2 || st.Reused != 0 || st.Failed != 0 {
		t.Fatalf("stats %+v; want 2 passthrough opens, none reusing the idle id", st)
	}
}

// waitFor polls cond until it holds, failing after a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func readWhole(t *testing.T, fh *os.File, want []byte) {
	t.Helper()
	got := make([]byte, len(want)+1)
	n, err := fh.ReadAt(got, 0)
	if err != nil && n != len(want) || !bytes.Equal(got[:n], want) {
		t.Fatalf("read %s: %d bytes, err %v; want %d", fh.Name(), n, err, len(want))
	}
}

// TestPassthroughRead: a READ the kernel still sends for a passthrough
// open is answered from its backing file, not the daemon's tiers.
func TestPassthroughRead(t *testing.T) {
	f, data, mnt := mountBacked(t, 100_000)
	e := data.Snapshot().Lookup("c/" + fileName(0))
	data.back(e.Ino)
	fh, err := os.Open(filepath.Join(mnt, e.Path()))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	f.pt.mu.Lock()
	var handle uint64
	for h := range f.pt.handles {
		handle = h
	}
	f.pt.mu.Unlock()
	if handle == 0 {
		t.Fatal("no passthrough handle")
	}
	// A buffer larger than asked: the answer is what was asked, no more
	// (the kernel would take the rest as the file's next bytes).
	buf := make([]byte, 1<<20)
	for _, c := range []struct {
		off  uint64
		want int
	}{{0, 4096}, {50_000, 4096}, {99_000, 1000}, {100_000, 0}} {
		in := &fuse.ReadIn{InHeader: fuse.InHeader{NodeId: e.Ino}, Fh: handle, Offset: c.off, Size: 4096}
		res, st := f.Read(nil, in, buf)
		if !st.Ok() {
			t.Fatalf("READ at %d: %v", c.off, st)
		}
		got, _ := res.Bytes(make([]byte, len(buf)))
		if !bytes.Equal(got, content(0, c.want)) {
			t.Fatalf("READ of 4096 bytes at %d got %d bytes, want %d", c.off, len(got), c.want)
		}
	}
	if st := f.PassthroughStats(); data.readsOf(e.Ino) != 0 || st.Reads != 4 {
		t.Fatalf("the READs reached the dataset %d times, the backing file %d; want 0 and 4", data.readsOf(e.Ino), st.Reads)
	}
	// readahead(2) on the passthrough file works too, whoever answers it.
	if err := unix.Fadvise(int(fh.Fd()), 0, 0, unix.FADV_WILLNEED); err != nil && !errors.Is(err, syscall.ENOSYS) {
		t.Fatalf("fadvise: %v", err)
	}
	readWhole(t, fh, content(0, 100_000))
}

// TestPassthroughOff: without Config.Passthrough the mount never answers
// OPEN (noOpen), and says why in its stats.
func TestPassthroughOff(t *testing.T) {
	var bt *backedTree
	f, _, mnt := mountDataset(t, Config{}, func(c *countingTree) Dataset {
		bt = &backedTree{countingTree: c, backed: map[uint64]bool{}, asked: map[uint64]int{}, opened: map[uint64]uint32{}}
		return bt
	}, nil, 10_000)
	e := bt.Snapshot().Lookup("c/" + fileName(0))
	bt.back(e.Ino)
	if got, err := os.ReadFile(filepath.Join(mnt, e.Path())); err != nil || !bytes.Equal(got, content(0, 10_000)) {
		t.Fatalf("read: %d bytes, %v", len(got), err)
	}
	st := f.PassthroughStats()
	if st.On || st.Why == "" || st.Opens != 0 || bt.askedOf(e.Ino) != 0 {
		t.Fatalf("stats %+v, asked %d; want off with a reason, never asked", st, bt.askedOf(e.Ino))
	}
}

// TestOwnThread: a thread of this process is the daemon's own only while
// Push marks it, opening through the mount; the process itself always is.
func TestOwnThread(t *testing.T) {
	f := New(Config{}, nil, nil)
	if !f.isOwnThread(uint32(os.Getpid())) {
		t.Error("the process's own id is not its own")
	}
	// The checks run on a thread other than the main one, whose id is the
	// process's: a goroutine that finds itself locked to the main thread
	// holds it and checks from another.
	errs := make(chan string, 1)
	var check func()
	check = func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if unix.Gettid() == os.Getpid() {
			done := make(chan struct{})
			go func() { check(); close(done) }()
			<-done
			return
		}
		errs <- ownThreadChecks(f)
	}
	go check()
	if e := <-errs; e != "" {
		t.Fatal(e)
	}
}

func ownThreadChecks(f *FS) string {
	tid := uint32(unix.Gettid())
	if tid == uint32(os.Getpid()) {
		return "the checks run on the main thread"
	}
	if f.isOwnThread(tid) {
		return "an unmarked thread counts as the daemon's own"
	}
	if got := f.own.enter(); got != tid || !f.isOwnThread(tid) {
		return fmt.Sprintf("a marked thread (%d, marked %d) does not count as the daemon's own", tid, got)
	}
	f.own.enter() // two opens at once on one thread: both must leave
	f.own.leave(tid)
	if !f.isOwnThread(tid) {
		return "a thread with one open left stopped counting"
	}
	f.own.leave(tid)
	if f.isOwnThread(tid) || len(f.own.tids) != 0 {
		return fmt.Sprintf("a thread that left still counts (%v)", f.own.tids)
	}
	return ""
}
