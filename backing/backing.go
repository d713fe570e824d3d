// Package backing builds the files FUSE passthrough serves resident
// samples from.
//
// # What a backing file is
//
// A File is an anonymous memory file (memfd) holding exactly one version
// of one sample's bytes, at the same offsets. The kernel reads it instead
// of asking the daemon (package fusefs registers it at OPEN), so its bytes
// must be right without any further check: Build writes each block only
// after checking it against its integrity sum (package integrity), refuses
// the whole file when a block is missing, of the wrong length or fails its
// sum (a hole would read as zeros), and seals the file (F_SEAL_WRITE,
// F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL) before anyone else sees it.
// Once sealed, nobody can change its bytes or its size, not through the
// descriptor, not through /proc/PID/fd, not through a mapping.
//
// # Lifetime
//
// A File is reference counted: Build returns it with one reference, the
// caller's. Whoever keeps it (the RAM tier while it is resident, the
// mount while an open of its sample lasts) holds a reference of its own;
// the descriptor is closed when the last goes. The kernel keeps its own
// reference to a registered file, so an open file reads correct bytes
// after the daemon let go.
package backing

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/integrity"
)

// ErrMissing means a block of the file was not there, or not whole: no
// backing file is made with a hole in it.
var ErrMissing = errors.New("backing: a block is missing")

// ErrCorrupt means a block failed its integrity sum.
var ErrCorrupt = errors.New("backing: a block fails its checksum")

// Seals are the seals every File carries: nobody may write it, shrink it,
// grow it, or remove the seals.
const Seals = unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// Block is one block's bytes with their integrity tag and sum.
type Block struct {
	Data []byte
	Tag  uint64
	Sum  uint32
}

// File is a sealed backing file. Safe for concurrent use; no method
// blocks but on memory.
type File struct {
	size int64 // read-only after Build
	name string

	mu sync.Mutex
	// mu guards the following.
	// INVARIANT: fd >= 0 exactly while refs > 0.
	fd     int
	refs   int
	onFree []func() // run once the last reference is gone
	kept   int      // keepers holding the file as their copy (Keep)
	onDrop func()   // run once the last keeper lets go (WatchDrop)
}

// maxName is the longest name memfd_create takes, less its terminator.
const maxName = 249

// Build makes a sealed File of size bytes: block i (of blockSize bytes,
// the last one shorter) comes from block(i), which reports false when it
// has none. name is for /proc/PID/fd and errors (the sample's path). Every
// block is checked against its sum before it is written; a block missing,
// of another length than the file's size says, or failing its sum
// refuses the whole file (ErrMissing, ErrCorrupt).
func Build(name string, size, blockSize int64, block func(i int64) (Block, bool)) (*File, error) {
	return build(name, size, blockSize, block, ShmemTHP())
}

// build is Build with shmem's huge page mode given (tests give one other
// than the system's, which they never change).
func build(name string, size, blockSize int64, block func(i int64) (Block, bool), thp string) (*File, error) {
	if size < 0 || blockSize <= 0 {
		return nil, fmt.Errorf("backing: %s: size %d, block size %d: want size >= 0 and block size > 0", name, size, blockSize)
	}
	memName := "dlfs:" + strings.ReplaceAll(name, "\x00", "/") // a NUL would end it
	if len(memName) > maxName {
		memName = memName[:maxName]
	}
	fd, err := unix.MemfdCreate(memName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("backing: %s: memfd_create: %w", name, err)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
		}
	}()
	if err := unix.Ftruncate(fd, size); err != nil {
		return nil, fmt.Errorf("backing: %s: size %d: %w", name, size, err)
	}
	if err := fill(fd, name, size, blockSize, block, thp); err != nil {
		return nil, err
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, Seals); err != nil {
		return nil, fmt.Errorf("backing: %s: seal: %w", name, err)
	}
	ok = true
	return &File{size: size, name: name, fd: fd, refs: 1}, nil
}

// fill writes the blocks into fd, a file of size bytes: its whole huge
// pages through a shared mapping advised huge, where shmem gives such a
// mapping huge pages (the kernel then reads the file through 2 MiB
// pages: 32 MiB files read by passthrough at 0.76x the native page cache
// with 4 KiB pages, 1.03x with huge ones; docs/benchmarks.md), the rest
// with pwrite (a mapping of 4 KiB pages writes at half pwrite's speed).
// thp is shmem's huge page mode (ShmemTHP). The mapping is gone before
// fill returns: sealing refuses a file mapped writable.
func fill(fd int, name string, size, blockSize int64, block func(i int64) (Block, bool), thp string) error {
	m := hugeMapping(fd, size, thp) // nil: all by pwrite
	err := fillBlocks(name, size, blockSize, block, func(b []byte, off int64) error {
		n := 0
		if off < int64(len(m)) {
			n = copy(m[off:], b)
		}
		return pwriteAll(fd, b[n:], off+int64(n))
	})
	if m != nil {
		if uerr := unix.Munmap(m); uerr != nil && err == nil {
			err = fmt.Errorf("backing: %s: unmap: %w", name, uerr)
		}
	}
	return err
}

// hugeMapping maps fd's whole huge pages (of size bytes) shared and
// writable, advised huge and populated, if size spans a huge page and
// shmem gives huge pages to such a mapping (thp, shmem's mode: ShmemTHP);
// nil otherwise, or if the kernel cannot populate
// it (writing into a mapping it could not populate would fault, and a
// fault that finds no memory kills the process, where pwrite fails).
func hugeMapping(fd int, size int64, thp string) []byte {
	if size < hugePage || !HugeAllowed(thp) {
		return nil
	}
	// Whole huge pages only: a huge page for the tail would hold up to
	// 2 MiB past the file's end, which the tier's count (Pages) leaves
	// out; the tail is written with pwrite, into small pages.
	m, err := unix.Mmap(fd, 0, int(size&^(hugePage-1)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil
	}
	if unix.Madvise(m, unix.MADV_HUGEPAGE) != nil || unix.Madvise(m, unix.MADV_POPULATE_WRITE) != nil {
		unix.Munmap(m)
		return nil
	}
	return m
}

const hugePage = 2 << 20

// ShmemTHPFile is where the kernel says (and root sets) how shmem
// (memfd's) uses transparent huge pages.
const ShmemTHPFile = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"

// ShmemTHP is the kernel's shmem huge page mode (always, within_size,
// advise, never, deny, force), or "" where it has none.
func ShmemTHP() string {
	b, err := os.ReadFile(ShmemTHPFile)
	if err != nil {
		return ""
	}
	return selectedMode(string(b))
}

// selectedMode is the bracketed word of a sysfs choice list such as
// "always within_size [advise] never deny force".
func selectedMode(s string) string {
	_, rest, ok := strings.Cut(s, "[")
	if !ok {
		return ""
	}
	mode, _, ok := strings.Cut(rest, "]")
	if !ok {
		return ""
	}
	return mode
}

// HugeAllowed says whether shmem mode gives a mapping advised huge (or
// any mapping) huge pages.
func HugeAllowed(mode string) bool {
	switch mode {
	case "always", "within_size", "advise", "force":
		return true
	}
	return false
}

// fillBlocks checks each block of a file of size bytes and writes it
// with write at its offset.
func fillBlocks(name string, size, blockSize int64, block func(i int64) (Block, bool), write func(b []byte, off int64) error) error {
	for off, i := int64(0), int64(0); off < size; off, i = off+blockSize, i+1 {
		b, there := block(i)
		want := min(blockSize, size-off)
		switch {
		case !there:
			return fmt.Errorf("%w: %s: block %d", ErrMissing, name, i)
		case int64(len(b.Data)) != want:
			return fmt.Errorf("%w: %s: block %d has %d bytes, want %d", ErrMissing, name, i, len(b.Data), want)
		case !integrity.Check(b.Tag, b.Sum, b.Data):
			return fmt.Errorf("%w: %s: block %d", ErrCorrupt, name, i)
		}
		if err := write(b.Data, off); err != nil {
			return fmt.Errorf("backing: %s: write block %d: %w", name, i, err)
		}
	}
	return nil
}

func pwriteAll(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

// Size is the file's length in bytes.
func (f *File) Size() int64 { return f.size }

// Name is the sample's path it was built for.
func (f *File) Name() string { return f.name }

// Pages is what the file holds in memory: its size in whole pages.
func (f *File) Pages() int64 { return (f.size + pageSize - 1) &^ (pageSize - 1) }

var pageSize = int64(unix.Getpagesize())

// Fd is the file's descriptor, valid while the caller holds a reference.
func (f *File) Fd() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fd
}

// Acquire takes another reference, and reports false if the file was
// already closed (the caller then must not use it).
func (f *File) Acquire() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refs == 0 {
		return false
	}
	f.refs++
	return true
}

// Release drops a reference; the last closes the file.
func (f *File) Release() { f.Detach(nil) }

// Detach drops a reference. If others remain it reports true, and fn (if
// not nil) runs when the last goes: the RAM tier counts an evicted file
// that is still open until it is closed.
func (f *File) Detach(fn func()) bool {
	f.mu.Lock()
	if f.refs <= 0 {
		f.mu.Unlock()
		return false // released more often than acquired: a bug, but the file is closed already
	}
	f.refs--
	if f.refs > 0 {
		if fn != nil {
			f.onFree = append(f.onFree, fn)
		}
		f.mu.Unlock()
		return true
	}
	fd, fns := f.fd, f.onFree
	f.fd, f.onFree = -1, nil
	f.mu.Unlock()
	unix.Close(fd)
	for _, fn := range fns {
		fn()
	}
	return false
}

// OnClose sets fn to run once the file's descriptor is closed (its last
// reference gone), and reports true; it reports false, and sets nothing,
// if the file is closed already. The daemon counts the descriptors its
// backing files hold with it.
func (f *File) OnClose(fn func()) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refs == 0 {
		return false
	}
	f.onFree = append(f.onFree, fn)
	return true
}

// Keep marks the file as a keeper's copy of its bytes (the RAM tier's),
// beside the reference the keeper holds; Drop ends it. Others may hold
// references to a file no keeper keeps, but nothing should keep using it
// beyond what they read now: it is no longer the cache's copy.
func (f *File) Keep() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kept++
}

// Drop ends a Keep. When the last keeper lets go, the function WatchDrop
// set runs, in the caller's goroutine and under whatever locks it holds:
// it must not block.
func (f *File) Drop() {
	f.mu.Lock()
	if f.kept > 0 {
		f.kept--
	}
	var fn func()
	if f.kept == 0 {
		fn, f.onDrop = f.onDrop, nil
	}
	f.mu.Unlock()
	if fn != nil {
		fn()
	}
}

// WatchDrop sets fn, replacing any earlier one, to run once when the last
// keeper lets go of the file (Drop), and reports true; it reports false,
// and sets nothing, when no keeper keeps the file now. There is one slot:
// one watcher per file (the mount's, for the one inode the file backs).
func (f *File) WatchDrop(fn func()) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kept == 0 {
		return false
	}
	f.onDrop = fn
	return true
}

// ReadAt reads len(p) bytes at off (fewer at the end of the file). The
// caller holds a reference.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	fd := f.Fd()
	if fd < 0 {
		return 0, fmt.Errorf("backing: %s: read after close", f.name)
	}
	n := 0
	for n < len(p) && off+int64(n) < f.size {
		m, err := unix.Pread(fd, p[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("backing: %s: read at %d: %w", f.name, off+int64(n), err)
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, nil
}
