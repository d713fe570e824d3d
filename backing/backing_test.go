package backing

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/integrity"
)

// blocks cuts data into blocks of bs bytes, each with its tag and sum.
func blocks(data []byte, bs int64) []Block {
	var out []Block
	for off := int64(0); off < int64(len(data)); off += bs {
		tag := uint64(off/bs + 1)
		b := data[off:min(off+bs, int64(len(data)))]
		out = append(out, Block{Data: b, Tag: tag, Sum: integrity.Sum(tag, b)})
	}
	return out
}

func from(bs []Block) func(int64) (Block, bool) {
	return func(i int64) (Block, bool) {
		if i < 0 || i >= int64(len(bs)) || bs[i].Data == nil {
			return Block{}, false
		}
		return bs[i], true
	}
}

func randomBytes(n int) []byte {
	r := rand.New(rand.NewPCG(1, uint64(n)))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestBuild: a File holds exactly the bytes at their offsets, for sizes
// around the block size, and is sealed against every change.
func TestBuild(t *testing.T) {
	const bs = 4096
	for _, size := range []int{0, 1, bs - 1, bs, bs + 1, 5*bs + 17} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			data := randomBytes(size)
			f, err := Build("a/b.jpg", int64(size), bs, from(blocks(data, bs)))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Release()
			if f.Size() != int64(size) {
				t.Fatalf("size %d, want %d", f.Size(), size)
			}
			var st unix.Stat_t
			if err := unix.Fstat(f.Fd(), &st); err != nil || st.Size != int64(size) {
				t.Fatalf("fstat: size %d, %v; want %d", st.Size, err, size)
			}
			got := make([]byte, size+10)
			n, err := f.ReadAt(got, 0)
			if err != nil || !bytes.Equal(got[:n], data) {
				t.Fatalf("read %d bytes (%v), want the %d written", n, err, size)
			}
			if size > 3 {
				if n, _ := f.ReadAt(got[:2], int64(size-3)); n != 2 || !bytes.Equal(got[:2], data[size-3:size-1]) {
					t.Fatal("a read at an offset got other bytes")
				}
			}
			seals, err := unix.FcntlInt(uintptr(f.Fd()), unix.F_GET_SEALS, 0)
			if err != nil || seals&Seals != Seals {
				t.Fatalf("seals %#x (%v), want %#x", seals, err, Seals)
			}
		})
	}
}

// TestSealedAgainstWriters: nobody can change a File once built: not by
// its descriptor, not through /proc/self/fd (as another process would
// reach it), not through a shared writable mapping, not by resizing, and
// the seals cannot be removed.
func TestSealedAgainstWriters(t *testing.T) {
	data := randomBytes(10000)
	f, err := Build("x", int64(len(data)), 4096, from(blocks(data, 4096)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release()
	fd := f.Fd()
	if _, err := unix.Pwrite(fd, []byte("evil"), 0); !errors.Is(err, unix.EPERM) {
		t.Errorf("pwrite on its descriptor: %v, want EPERM", err)
	}
	if w, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), os.O_WRONLY, 0); err == nil {
		if _, err := w.WriteAt([]byte("evil"), 0); err == nil {
			t.Error("a write through /proc/self/fd succeeded")
		}
		w.Close()
	}
	if _, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
		t.Error("a shared writable mapping succeeded")
	}
	if err := unix.Ftruncate(fd, 5); err == nil {
		t.Error("shrinking succeeded")
	}
	if err := unix.Ftruncate(fd, 1<<20); err == nil {
		t.Error("growing succeeded")
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE); err == nil {
		t.Error("adding a seal after F_SEAL_SEAL succeeded")
	}
	got := make([]byte, len(data))
	if n, _ := f.ReadAt(got, 0); n != len(data) || !bytes.Equal(got, data) {
		t.Fatal("the bytes changed")
	}
}

// TestRefused: a block missing, short, long or failing its sum refuses
// the whole file, and no descriptor is left behind.
func TestRefused(t *testing.T) {
	const bs = 4096
	data := randomBytes(3*bs + 5)
	cases := []struct {
		name  string
		alter func([]Block)
		want  error
	}{
		{"missing", func(b []Block) { b[1].Data = nil }, ErrMissing},
		{"missing last", func(b []Block) { b[3].Data = nil }, ErrMissing},
		{"short", func(b []Block) { b[2].Data = b[2].Data[:bs-1] }, ErrMissing},
		{"long", func(b []Block) { b[3].Data = append(b[3].Data[:len(b[3].Data):len(b[3].Data)], 0) }, ErrMissing},
		{"flipped bit", func(b []Block) {
			c := bytes.Clone(b[2].Data)
			c[100] ^= 1
			b[2].Data = c
		}, ErrCorrupt},
		{"wrong tag", func(b []Block) { b[0].Tag++ }, ErrCorrupt},
		{"wrong sum", func(b []Block) { b[3].Sum++ }, ErrCorrupt},
	}
	before := openFds(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bs0 := blocks(data, bs)
			c.alter(bs0)
			f, err := Build("x", int64(len(data)), bs, from(bs0))
			if !errors.Is(err, c.want) {
				t.Fatalf("err %v, want %v", err, c.want)
			}
			if f != nil {
				t.Fatal("a File came back with the error")
			}
		})
	}
	if after := openFds(t); after != before {
		t.Errorf("%d descriptors open after the refusals, %d before", after, before)
	}
}

func openFds(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestReferences: the descriptor lives until the last reference goes,
// and Detach's function runs then, once.
func TestReferences(t *testing.T) {
	data := randomBytes(100)
	f, err := Build("x", 100, 64, from(blocks(data, 64)))
	if err != nil {
		t.Fatal(err)
	}
	if !f.Acquire() {
		t.Fatal("Acquire of a live file failed")
	}
	var freed atomic.Int32
	if !f.Detach(func() { freed.Add(1) }) {
		t.Fatal("Detach with a reference left reported none")
	}
	if freed.Load() != 0 || f.Fd() < 0 {
		t.Fatal("closed with a reference left")
	}
	got := make([]byte, 100)
	if n, err := f.ReadAt(got, 0); n != 100 || err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d (%v) after Detach", n, err)
	}
	f.Release()
	if freed.Load() != 1 || f.Fd() >= 0 {
		t.Fatalf("after the last Release: ran %d times, fd %d", freed.Load(), f.Fd())
	}
	if f.Acquire() {
		t.Fatal("Acquire of a closed file succeeded")
	}
	if _, err := f.ReadAt(got, 0); err == nil {
		t.Fatal("read after close succeeded")
	}
	f.Release() // one too many: no effect
	if freed.Load() != 1 {
		t.Fatal("an extra Release ran the function again")
	}
}

// TestOnClose: the function OnClose sets runs once, when the descriptor
// is closed (not while a reference is left), and none is set on a file
// closed already.
func TestOnClose(t *testing.T) {
	f, err := Build("x", 10, 64, from(blocks(randomBytes(10), 64)))
	if err != nil {
		t.Fatal(err)
	}
	var closed atomic.Int32
	if !f.Acquire() || !f.OnClose(func() { closed.Add(1) }) {
		t.Fatal("OnClose of a live file set nothing")
	}
	f.Release()
	if closed.Load() != 0 || f.Fd() < 0 {
		t.Fatal("ran with a reference left")
	}
	f.Release()
	if closed.Load() != 1 || f.Fd() >= 0 {
		t.Fatalf("after the last Release: ran %d times, fd %d", closed.Load(), f.Fd())
	}
	if f.OnClose(func() { closed.Add(1) }) || closed.Load() != 1 {
		t.Fatal("OnClose of a closed file set a function")
	}
}

// TestKeepers: WatchDrop sets a watcher only while a keeper keeps the
// file, a later one replaces it, and it runs once, when the last keeper
// lets go.
func TestKeepers(t *testing.T) {
	f, err := Build("x", 10, 64, from(blocks(randomBytes(10), 64)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release()
	var first, second atomic.Int32
	if f.WatchDrop(func() { first.Add(1) }) {
		t.Fatal("WatchDrop of a file no keeper keeps reported true")
	}
	f.Keep()
	f.Keep()
	if !f.WatchDrop(func() { first.Add(1) }) || !f.WatchDrop(func() { second.Add(1) }) {
		t.Fatal("WatchDrop of a kept file reported false")
	}
	f.Drop()
	if second.Load() != 0 {
		t.Fatal("the watcher ran with a keeper left")
	}
	f.Drop()
	f.Drop() // one too many: no effect
	if first.Load() != 0 || second.Load() != 1 {
		t.Fatalf("watchers ran %d (replaced) and %d times; want 0 and 1", first.Load(), second.Load())
	}
	if f.WatchDrop(func() {}) {
		t.Fatal("WatchDrop after the last Drop reported true")
	}
}

func TestBadArguments(t *testing.T) {
	if _, err := Build("x", 10, 0, from(nil)); err == nil {
		t.Error("block size 0 accepted")
	}
	if _, err := Build("x", -1, 4096, from(nil)); err == nil {
		t.Error("negative size accepted")
	}
}

// shmemHugeBytes is the kernel's count of shmem in huge pages.
func shmemHugeBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "ShmemHugePages:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Skip("no ShmemHugePages in /proc/meminfo")
	return 0
}

// TestBuildHugePages: where shmem gives huge pages to a mapping advised
// so (shmem_enabled advise or always, as this machine is set: the test
// never changes that system-wide setting), a backing file of 16 MiB is
// written into huge pages, and holds its bytes, sealed.
func TestBuildHugePages(t *testing.T) {
	if mode := ShmemTHP(); !HugeAllowed(mode) {
		t.Skipf("shmem_enabled is %q here, which gives no mapping huge pages (this test does not change it)", mode)
	}
	data := randomBytes(16<<20 + 12345)
	before := shmemHugeBytes(t)
	f, err := Build("huge", int64(len(data)), 1<<20, from(blocks(data, 1<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release()
	grew := shmemHugeBytes(t) - before
	checkHolds(t, f, data)
	if grew < 12<<20 {
		t.Errorf("shmem in huge pages grew by %d bytes for a file of %d", grew, len(data))
	}
}

// TestHugeMapping: a file of 2 MiB or more is written through a mapping
// of its whole huge pages only where shmem's mode gives such a mapping
// huge pages, and with pwrite otherwise; either way the file holds its
// bytes, sealed.
func TestHugeMapping(t *testing.T) {
	fd, err := unix.MemfdCreate("huge", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 5<<20+3); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mode string
		size int64
		want int // the mapping's length, 0 for none
	}{{"advise", 5<<20 + 3, 4 << 20}, {"always", 2 << 20, 2 << 20}, {"advise", 2<<20 - 1, 0}, {"never", 5<<20 + 3, 0}, {"deny", 5<<20 + 3, 0}, {"", 5<<20 + 3, 0}} {
		m := hugeMapping(fd, c.size, c.mode)
		if len(m) != c.want {
			t.Errorf("shmem %q, %d bytes: a mapping of %d bytes, want %d", c.mode, c.size, len(m), c.want)
		}
		if m != nil {
			unix.Munmap(m)
		}
	}
	data := randomBytes(5<<20 + 3)
	for _, mode := range []string{"advise", "never"} {
		f, err := build("x", int64(len(data)), 1<<20, from(blocks(data, 1<<20)), mode)
		if err != nil {
			t.Fatalf("shmem %s: %v", mode, err)
		}
		checkHolds(t, f, data)
		f.Release()
	}
}

// checkHolds checks that f holds data and is sealed.
func checkHolds(t *testing.T, f *File, data []byte) {
	t.Helper()
	got := make([]byte, len(data))
	if n, _ := f.ReadAt(got, 0); n != len(data) || !bytes.Equal(got, data) {
		t.Fatal("the file does not hold its bytes")
	}
	if _, err := unix.Pwrite(f.Fd(), []byte("x"), 0); err == nil {
		t.Fatal("the file is not sealed")
	}
}

func TestSelectedMode(t *testing.T) {
	for in, want := range map[string]string{
		"always within_size [advise] never deny force\n": "advise",
		"[always] never": "always",
		"always never":   "",
		"[unterminated":  "",
		"":               "",
	} {
		if got := selectedMode(in); got != want {
			t.Errorf("selectedMode(%q) = %q, want %q", in, got, want)
		}
	}
}
