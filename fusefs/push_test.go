package fusefs

import (
	"bytes"
	"context"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/catalog"
)

// countingTree is a tree that counts the reads reaching the daemon, per
// inode number.
type countingTree struct {
	tree
	mu    sync.Mutex
	reads map[uint64]int
}

func (c *countingTree) ReadAt(ctx context.Context, e *catalog.Entry, dest []byte, off int64, pid uint32) ([]byte, string, error) {
	c.mu.Lock()
	c.reads[e.Ino]++
	c.mu.Unlock()
	return c.tree.ReadAt(ctx, e, dest, off, pid)
}

func (c *countingTree) readsOf(ino uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads[ino]
}

// mountTree mounts a tree of files of the given sizes (file i holds byte
// 'a'+i%26 repeated) and returns the filesystem, its dataset and the
// mountpoint.
func mountTree(t *testing.T, sizes ...int) (*FS, *countingTree, string) {
	t.Helper()
	return mountDataset(t, Config{}, func(c *countingTree) Dataset { return c }, nil, sizes...)
}

// mountDataset is mountTree with the filesystem's configuration, the
// dataset the filesystem serves made from the counting tree, and setup
// (if not nil) run on the filesystem before it is mounted.
func mountDataset(t *testing.T, cfg Config, dataset func(*countingTree) Dataset, setup func(*FS), sizes ...int) (*FS, *countingTree, string) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	root := t.TempDir()
	for i, n := range sizes {
		p := filepath.Join(root, "c", fileName(i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, bytes.Repeat([]byte{byte('a' + i%26)}, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cat, err := catalog.Open(context.Background(), catalog.DefaultConfig(root))
	if err != nil {
		t.Fatal(err)
	}
	data := &countingTree{tree: tree{cat}, reads: map[uint64]int{}}
	f := New(cfg, dataset(data), &plane{})
	if setup != nil {
		setup(f)
	}
	mnt := t.TempDir()
	server, err := f.Mount(mnt, "dlfs-test")
	if err != nil {
		t.Skipf("cannot mount: %v", err)
	}
	t.Cleanup(func() { _ = server.Unmount() })
	return f, data, mnt
}

func fileName(i int) string { return string(rune('a'+i%26)) + ".jpg" }

// blocksOf serves e's bytes from SOURCE, as the tiers would.
func blocksOf(t *testing.T, data *countingTree, e *catalog.Entry, bs int64) func(int64) ([]byte, bool) {
	b, err := os.ReadFile(filepath.Join(data.Source(), e.Path()))
	if err != nil {
		t.Fatal(err)
	}
	return func(i int64) ([]byte, bool) {
		if i*bs >= int64(len(b)) {
			return nil, false
		}
		return b[i*bs : min(int64(len(b)), (i+1)*bs)], true
	}
}

// A pushed file is read from the page cache: no read reaches the daemon,
// although the kernel had never looked the file up before the push.
func TestPushServesFromThePageCache(t *testing.T) {
	sizes := []int{110_000, 5000, 300_000}
	f, data, mnt := mountTree(t, sizes...)
	const bs = 128 << 10 // several blocks for the last file
	for i, n := range sizes {
		e := data.Snapshot().Lookup("c/" + fileName(i))
		stored, err := f.Push(e, bs, blocksOf(t, data, e, bs))
		if err != nil || stored != int64(n) {
			t.Fatalf("push %s: stored %d of %d, err %v", e.Path(), stored, n, err)
		}
		got, err := os.ReadFile(filepath.Join(mnt, e.Path()))
		if err != nil || !bytes.Equal(got, bytes.Repeat([]byte{byte('a' + i)}, n)) {
			t.Fatalf("read %s after the push: %d bytes, err %v", e.Path(), len(got), err)
		}
		if r := data.readsOf(e.Ino); r != 0 {
			t.Fatalf("%s: %d reads reached the daemon after the push, want 0", e.Path(), r)
		}
		// Cached whole: a second push stores nothing.
		if stored, err := f.Push(e, bs, blocksOf(t, data, e, bs)); err != nil || stored != 0 {
			t.Fatalf("second push of %s: stored %d, err %v; want 0, nil", e.Path(), stored, err)
		}
	}

	// Evicted by the kernel: the read falls back to the daemon.
	e := data.Snapshot().Lookup("c/" + fileName(0))
	evict(t, filepath.Join(mnt, e.Path()))
	if got, err := os.ReadFile(filepath.Join(mnt, e.Path())); err != nil || len(got) != sizes[0] {
		t.Fatalf("read after eviction: %d bytes, err %v", len(got), err)
	}
	if data.readsOf(e.Ino) == 0 {
		t.Fatal("no read reached the daemon after the page cache dropped the file")
	}
}

// A block the tiers cannot supply, or of the wrong length, fails the push
// and stores nothing wrong: the read goes to the daemon.
func TestPushRefusesShortBlocks(t *testing.T) {
	f, data, mnt := mountTree(t, 10_000)
	e := data.Snapshot().Lookup("c/" + fileName(0))
	if _, err := f.Push(e, 1<<20, func(int64) ([]byte, bool) { return nil, false }); err == nil {
		t.Fatal("push without bytes succeeded")
	}
	if _, err := f.Push(e, 1<<20, func(int64) ([]byte, bool) { return make([]byte, 100), true }); err == nil {
		t.Fatal("push of a short block succeeded")
	}
	got, err := os.ReadFile(filepath.Join(mnt, e.Path()))
	if err != nil || !bytes.Equal(got, bytes.Repeat([]byte{'a'}, 10_000)) {
		t.Fatalf("read: %d bytes, err %v", len(got), err)
	}
	if data.readsOf(e.Ino) == 0 {
		t.Fatal("the read did not reach the daemon")
	}
	unmounted := New(Config{}, data, &plane{})
	if _, err := unmounted.Push(e, 1<<20, blocksOf(t, data, e, 1<<20)); err != ErrNoMount {
		t.Fatalf("push on an unmounted filesystem: %v, want ErrNoMount", err)
	}
}

// A push of bytes a refresh has since replaced is dropped again: the
// reader gets the new bytes.
func TestPushRacingARefresh(t *testing.T) {
	f, data, mnt := mountTree(t, 4000)
	old := data.Snapshot().Lookup("c/" + fileName(0))
	oldBytes := blocksOf(t, data, old, 1<<20)
	src := filepath.Join(data.Source(), old.Path())
	if err := os.WriteFile(src, bytes.Repeat([]byte{'z'}, 4000), 0o644); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Hour)
	if err := os.Chtimes(src, future, future); err != nil {
		t.Fatal(err)
	}
	d, err := data.cat.Refresh(context.Background())
	if err != nil || len(d.Changed) != 1 {
		t.Fatalf("refresh: %+v, %v", d, err)
	}
	f.Invalidate(d)
	if _, err := f.Push(old, 1<<20, oldBytes); err == nil {
		t.Fatal("a push of the old version succeeded")
	}
	got, err := os.ReadFile(filepath.Join(mnt, old.Path()))
	if err != nil || !bytes.Equal(got, bytes.Repeat([]byte{'z'}, 4000)) {
		t.Fatalf("read after the refresh: %q..., err %v", got[:min(8, len(got))], err)
	}
}

// evict drops path's pages from the page cache.
func evict(t *testing.T, path string) {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
}

// A close costs no round trip: FLUSH is answered ENOSYS once, and the
// kernel never sends it again (it sent one per close before).
func TestNoFlushOnClose(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	_, data, _ := mountTree(t, 1000) // for the tree; mounted again below with a request log
	f := New(Config{}, data, &plane{})
	var logged syncBuffer
	opts := f.MountOptions("dlfs-test")
	opts.Debug, opts.Logger = true, log.New(&logged, "", 0)
	mnt := t.TempDir()
	server, err := fuse.NewServer(f, mnt, opts)
	if err != nil {
		t.Skipf("cannot mount: %v", err)
	}
	go server.Serve()
	t.Cleanup(func() { _ = server.Unmount() })
	if err := server.WaitMount(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if _, err := os.ReadFile(filepath.Join(mnt, "c", fileName(0))); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logged.String(), "FLUSH"); n > 2 { // the request and its answer, once
		t.Errorf("%d FLUSH lines in the request log for 5 closes, want at most 2 (one request)", n)
	}
}

// syncBuffer is a bytes.Buffer safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Push refuses a block size that is not positive with an error, before it
// divides by it.
func TestPushRefusesBlockSize(t *testing.T) {
	f, data, _ := mountTree(t, 10_000)
	e := data.Snapshot().Lookup("c/" + fileName(0))
	for _, bs := range []int64{0, -4096} {
		stored, err := f.Push(e, bs, blocksOf(t, data, e, 4096))
		if err == nil || stored != 0 || !strings.Contains(err.Error(), "block size") {
			t.Errorf("push with block size %d: stored %d, err %v; want an error about the block size", bs, stored, err)
		}
	}
}

// A file of a whole number of blocks, and of pages, is stored whole (no
// block past its end is asked for), and is then found cached whole.
func TestPushWholeBlocks(t *testing.T) {
	size := 3 * pageSize
	f, data, mnt := mountTree(t, int(size))
	e := data.Snapshot().Lookup("c/" + fileName(0))
	var asked []int64
	blocks := blocksOf(t, data, e, pageSize)
	block := func(i int64) ([]byte, bool) {
		asked = append(asked, i)
		return blocks(i)
	}
	if stored, err := f.Push(e, pageSize, block); err != nil || stored != size {
		t.Fatalf("push of %d bytes in blocks of %d: stored %d, err %v (blocks asked %v)", size, pageSize, stored, err, asked)
	}
	if stored, err := f.Push(e, pageSize, block); err != nil || stored != 0 {
		t.Fatalf("second push of a file of %d whole pages: stored %d, err %v; want 0, nil", size/pageSize, stored, err)
	}
	if len(asked) != 3 {
		t.Errorf("blocks asked %v, want 0, 1 and 2 once", asked)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, e.Path())); err != nil || int64(len(got)) != size || data.readsOf(e.Ino) != 0 {
		t.Fatalf("read after the push: %d bytes, err %v, %d reads reached the daemon", len(got), err, data.readsOf(e.Ino))
	}
}

// A push that fails names the block that failed, and returns the bytes it
// stored before it.
func TestPushErrorNamesTheBlock(t *testing.T) {
	const bs = 4096
	f, data, _ := mountTree(t, 10_000) // blocks 0, 1 and 2 (1808 bytes)
	e := data.Snapshot().Lookup("c/" + fileName(0))
	blocks := blocksOf(t, data, e, bs)
	missing := func(i int64) ([]byte, bool) {
		if i == 2 {
			return nil, false
		}
		return blocks(i)
	}
	if stored, err := f.Push(e, bs, missing); err == nil || stored != 2*bs || !strings.Contains(err.Error(), "block 2 is not cached") {
		t.Errorf("push missing block 2: stored %d, err %v; want %d and block 2 named", stored, err, 2*bs)
	}
	short := func(i int64) ([]byte, bool) {
		if i == 1 {
			return make([]byte, 100), true
		}
		return blocks(i)
	}
	if stored, err := f.Push(e, bs, short); err == nil || stored != bs || !strings.Contains(err.Error(), "block 1 has 100 bytes, want 4096") {
		t.Errorf("push with block 1 short: stored %d, err %v; want %d and block 1 named", stored, err, bs)
	}
}

// TestMaxRequest: the mount asks for READs of MaxRequest bytes, lowered to
// what the kernel allows (max_pages_limit pages), as its max_read shows.
func TestMaxRequest(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	limit := 256 * os.Getpagesize()
	if b, err := os.ReadFile("/proc/sys/fs/fuse/max_pages_limit"); err == nil {
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		limit = n * os.Getpagesize()
	}
	cat, err := catalog.Open(context.Background(), catalog.DefaultConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	for _, asked := range []int{256 << 10, 1 << 20, 64 << 20} {
		f := New(Config{MaxRequest: asked}, tree{cat}, &plane{})
		mnt := t.TempDir()
		server, err := f.Mount(mnt, "dlfs-test")
		if err != nil {
			t.Skipf("cannot mount: %v", err)
		}
		got := mountOption(t, mnt, "max_read")
		m, _ := MountAt(mnt)
		ra, raErr := os.ReadFile("/sys/class/bdi/" + m.Dev + "/read_ahead_kb")
		_ = server.Unmount()
		if want := strconv.Itoa(min(asked, limit)); got != want {
			t.Errorf("MaxRequest %d: max_read=%s, want %s (the kernel allows %d)", asked, got, want, limit)
		}
		// The kernel's read-ahead window is raised to it (as root), so
		// page-cache reads come in requests of that size, not 128 KiB.
		if want := strconv.Itoa(max(min(asked, limit), 128<<10) >> 10); os.Geteuid() == 0 && (raErr != nil || strings.TrimSpace(string(ra)) != want) {
			t.Errorf("MaxRequest %d: read_ahead_kb %q (%v), want %s", asked, ra, raErr, want)
		}
	}
}

// mountOption returns option key of the mount at mnt, from mountinfo.
func mountOption(t *testing.T, mnt, key string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[4] != mnt {
			continue
		}
		for _, o := range strings.Split(f[len(f)-1], ",") {
			if k, v, _ := strings.Cut(o, "="); k == key {
				return v
			}
		}
		t.Fatalf("mount %s has no %s: %s", mnt, key, line)
	}
	t.Fatalf("%s is not in mountinfo", mnt)
	return ""
}
