// Package source reads sample bytes from SOURCE, the dataset directory on the
// shared parallel filesystem (the PFS).
//
// # Confinement
//
// Every open goes through openat2(2) relative to SOURCE's directory
// descriptor with RESOLVE_BENEATH and RESOLVE_NO_SYMLINKS: no path, however
// crafted, and no symlink swapped into SOURCE after the scan, reaches a file
// outside the dataset.
//
// # Identity
//
// A file's Version is its size, mtime, ctime and inode number. Reads check
// the opened file's Version against what the caller expects, so bytes of a
// file that changed since the catalog scan are never returned under the
// old identity: a rewrite that keeps the size and puts the mtime back
// still moves the ctime (and a replacement by rename, the inode).
//
// # Open files
//
// ReadAt keeps the files it opens, up to Config.Handles, so that reading
// a large file block by block costs one open (handles.go).
//
// # Accounting
//
// Source counts opens, read calls and bytes actually read: the PFS traffic
// dlfs causes. Safe for concurrent use.
package source

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// ErrChanged means the file's Version differs from the expected one:
// SOURCE changed since the last catalog scan.
var ErrChanged = errors.New("source: file changed since scan")

// ErrPath means the path is not a plain relative path inside SOURCE.
var ErrPath = errors.New("source: path escapes the dataset")

// Stats are the PFS traffic counters.
type Stats struct {
	Opens   int64 `json:"opens"`
	ReadOps int64 `json:"read_ops"`
	Bytes   int64 `json:"bytes"`
}

// Source is an open dataset directory.
type Source struct {
	root string

	// The directory descriptor every open is relative to. Close may come
	// while opens are stuck in a PFS that stopped answering (their callers
	// gave up on them): the descriptor is closed when the last of them
	// ends, never under one, whose open would then resolve against
	// whatever file took its number.
	mu     sync.Mutex
	rootFD int  // (mu)
	users  int  // (mu) opens in progress
	closed bool // (mu)

	opens, readOps, bytes atomic.Int64
	handles               *handles // open descriptors kept for ReadAt (handles.go)
}

// Config configures a Source.
type Config struct {
	// Handles is how many open files ReadAt keeps for later reads of the
	// same file (0: none, each read opens its file).
	Handles int
	// HandleIdle is how long a kept file may go unread before it is
	// closed; 0 keeps it until it is evicted, dropped or Close (a
	// deleted file kept open holds its space, and on NFS its .nfs file).
	HandleIdle time.Duration
}

// DefaultConfig keeps 256 files open, each for up to 10 s unread.
func DefaultConfig() Config { return Config{Handles: 256, HandleIdle: 10 * time.Second} }

// Validate reports a setting out of range.
func (c Config) Validate() error {
	if c.Handles < 0 || c.Handles > 1<<16 {
		return fmt.Errorf("source: %d open handles: want 0 to 65536", c.Handles)
	}
	if c.HandleIdle < 0 {
		return fmt.Errorf("source: handle idle time %v is negative", c.HandleIdle)
	}
	return nil
}

// ErrClosed means the Source was closed.
var ErrClosed = errors.New("source: closed")

// Open opens the dataset directory root with DefaultConfig.
func Open(root string) (*Source, error) { return OpenConfig(root, DefaultConfig()) }

// OpenConfig opens the dataset directory root.
func OpenConfig(root string, cfg Config) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("source: %s: %w", root, err)
	}
	fd, err := unix.Open(abs, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("source: open %s: %w", abs, err)
	}
	return &Source{root: abs, rootFD: fd, handles: newHandles(cfg.Handles, cfg.HandleIdle)}, nil
}

// Close releases the directory descriptor, at once or when the last
// open in progress ends.
func (s *Source) Close() error {
	s.handles.dropAll(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.users > 0 {
		return nil // the last user closes it
	}
	err := unix.Close(s.rootFD)
	s.rootFD = -1
	return err
}

// acquire returns the directory descriptor for an open, which must
// release it.
func (s *Source) acquire() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return -1, ErrClosed
	}
	s.users++
	return s.rootFD, nil
}

func (s *Source) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users--; s.users == 0 && s.closed && s.rootFD >= 0 {
		unix.Close(s.rootFD)
		s.rootFD = -1
	}
}

// Stats returns the traffic counters.
func (s *Source) Stats() Stats {
	return Stats{Opens: s.opens.Load(), ReadOps: s.readOps.Load(), Bytes: s.bytes.Load()}
}

// Version identifies one version of a file's bytes. For a sample of a
// packed container, Ctime and Ino are whatever versions it there (see
// package packed).
type Version struct {
	Size  int64
	Mtime int64 // nanoseconds
	Ctime int64 // nanoseconds
	Ino   uint64
}

// VersionOf returns the Version in st.
func VersionOf(st *unix.Stat_t) Version {
	return Version{Size: st.Size, Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano(), Ino: st.Ino}
}

// ReadAt opens path, checks its Version against want and reads len(p)
// bytes at off (fewer only at end of file). It blocks on the PFS.
//
// It reads through a descriptor kept from an earlier read of the same
// version of path when there is one (handles.go), and keeps the one it
// opens.
func (s *Source) ReadAt(path string, want Version, p []byte, off int64) (int, error) {
	k := handleKey{path, want}
	if h := s.handles.get(k); h != nil {
		n, err := s.readChecked(h.fd, path, want, p, off, true)
		s.handles.put(h, err != nil)
		return n, err
	}
	// A bare descriptor: an *os.File costs a fcntl per open.
	fd, err := s.openFD(path)
	if err != nil {
		return 0, err
	}
	if err := checkVersion(fd, path, want); err != nil {
		unix.Close(fd)
		return 0, err
	}
	h := s.handles.add(k, fd)
	n, err := s.readChecked(fd, path, want, p, off, false)
	if h != nil {
		s.handles.put(h, err != nil)
	} else {
		unix.Close(fd)
	}
	return n, err
}

// readChecked reads p at off from fd and checks the version after the
// bytes: a file rewritten while they were read may have handed back some
// of each version. Through a kept descriptor (cached) it checks the path,
// which shows a rename or an unlink since the open.
func (s *Source) readChecked(fd int, path string, want Version, p []byte, off int64, cached bool) (int, error) {
	n, err := s.pread(fd, path, p, off)
	if err != nil && err != io.EOF {
		return n, err
	}
	if cached {
		err = s.checkPathAfter(path, want)
	} else {
		err = checkVersionAfter(fd, path, want)
	}
	if err != nil {
		return 0, err
	}
	return n, nil
}

// checkVersionAfter is checkVersion after a read, asking the filesystem
// itself (AT_STATX_FORCE_SYNC): a PFS client that caches attributes (NFS
// for seconds) would otherwise answer from before the rewrite. The check
// before a read needs no such care: the open just revalidated them.
func checkVersionAfter(fd int, path string, want Version) error {
	var stx unix.Statx_t
	err := IgnoringEINTR(func() error {
		return unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_STATX_FORCE_SYNC,
			unix.STATX_SIZE|unix.STATX_MTIME|unix.STATX_CTIME|unix.STATX_INO, &stx)
	})
	if err == unix.ENOSYS || err == unix.EINVAL {
		return checkVersion(fd, path, want) // no statx here
	}
	if err != nil {
		return fmt.Errorf("source: stat %s: %w", path, err)
	}
	got := Version{Size: int64(stx.Size), Mtime: stx.Mtime.Sec*1e9 + int64(stx.Mtime.Nsec),
		Ctime: stx.Ctime.Sec*1e9 + int64(stx.Ctime.Nsec), Ino: stx.Ino}
	return changed(path, got, want)
}

// checkVersion fails with ErrChanged unless the open file fd has
// Version want.
func checkVersion(fd int, path string, want Version) error {
	var st unix.Stat_t
	if err := IgnoringEINTR(func() error { return unix.Fstat(fd, &st) }); err != nil {
		return fmt.Errorf("source: stat %s: %w", path, err)
	}
	return changed(path, VersionOf(&st), want)
}

// changed fails with ErrChanged unless got is want.
func changed(path string, got, want Version) error {
	if got != want {
		return fmt.Errorf("%w: %s (size %d, mtime %d, ctime %d, inode %d; the catalog has %d, %d, %d, %d); write 'refresh' to the control file",
			ErrChanged, path, got.Size, got.Mtime, got.Ctime, got.Ino, want.Size, want.Mtime, want.Ctime, want.Ino)
	}
	return nil
}

// pread reads len(p) bytes of fd at off, fewer only at end of file, with
// one counted pread per call the kernel needs, so read_ops counts the
// requests the PFS sees.
func (s *Source) pread(fd int, path string, p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		m, err := unix.Pread(fd, p[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		s.readOps.Add(1)
		if err != nil {
			return n, fmt.Errorf("source: read %s at %d: %w", path, off+int64(n), err)
		}
		s.bytes.Add(int64(m))
		if m == 0 {
			return n, io.EOF
		}
		n += m
	}
	return n, nil
}

func (s *Source) open(path string) (*os.File, error) {
	fd, err := s.openFD(path)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// openFD opens path beneath the root for reading, refusing to leave it.
func (s *Source) openFD(path string) (int, error) {
	fd, err := s.openBeneath(path, unix.O_RDONLY)
	if err != nil {
		return -1, fmt.Errorf("source: open %s: %w", path, err)
	}
	s.opens.Add(1)
	return fd, nil
}

// openBeneath opens path beneath the root with flags, refusing to leave
// it: no "..", no symlink anywhere on the way.
func (s *Source) openBeneath(path string, flags uint64) (int, error) {
	if !Local(path) {
		return -1, fmt.Errorf("%w: %q", ErrPath, path)
	}
	how := unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	root, err := s.acquire()
	if err != nil {
		return -1, err
	}
	defer s.release()
	var fd int
	err = IgnoringEINTR(func() (err error) {
		fd, err = unix.Openat2(root, path, &how)
		return err
	})
	return fd, err
}

// Local reports whether path is a clean, relative, slash-separated path that
// stays inside its root: no "..", no leading "/", no empty or "." elements.
func Local(path string) bool {
	if path == "" || strings.HasPrefix(path, "/") || strings.ContainsRune(path, 0) {
		return false
	}
	for _, el := range strings.Split(path, "/") {
		if el == "" || el == "." || el == ".." {
			return false
		}
	}
	return true
}

// Handle is a file of SOURCE kept open for many reads: a shard of a packed
// dataset. Its reads are counted like any other. Safe for concurrent use.
type Handle struct {
	s    *Source
	f    *os.File
	path string
	v    Version
}

// OpenHandle opens path, confined to SOURCE like every open, and keeps it
// open until Close.
func (s *Source) OpenHandle(path string) (*Handle, error) {
	f, err := s.open(path)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := IgnoringEINTR(func() error { return unix.Fstat(int(f.Fd()), &st) }); err != nil {
		f.Close()
		return nil, fmt.Errorf("source: stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, fmt.Errorf("source: %s is not a regular file", path)
	}
	return &Handle{s: s, f: f, path: path, v: VersionOf(&st)}, nil
}

// Size is the file's size when it was opened.
func (h *Handle) Size() int64 { return h.v.Size }

// Mtime is the file's mtime when it was opened, in nanoseconds.
func (h *Handle) Mtime() int64 { return h.v.Mtime }

// Version is the file's Version when it was opened.
func (h *Handle) Version() Version { return h.v }

// Path is the file's path relative to SOURCE.
func (h *Handle) Path() string { return h.path }

// ReadAt reads len(p) bytes at off, fewer only at end of file, with one
// counted pread per call the kernel needs. It implements io.ReaderAt. A
// read after which the file's Version is no longer the one it had when
// opened fails with ErrChanged: its bytes may mix two versions.
func (h *Handle) ReadAt(p []byte, off int64) (int, error) {
	n, err := h.s.pread(int(h.f.Fd()), h.path, p, off)
	if err != nil && err != io.EOF {
		return n, err
	}
	if cerr := h.Check(); cerr != nil {
		return 0, cerr
	}
	return n, err
}

// Check fails with ErrChanged if the file's Version is no longer the one
// it had when opened. A library that reads the file itself calls it after
// its reads.
func (h *Handle) Check() error { return checkVersionAfter(int(h.f.Fd()), h.path, h.v) }

// Close closes the file.
func (h *Handle) Close() error { return h.f.Close() }

// Fd is the open file's descriptor, for a library that must open the file
// itself (as /proc/self/fd/N, so that it opens this same confined file).
func (h *Handle) Fd() uintptr { return h.f.Fd() }

// Count records reads of SOURCE made by a library on a Handle's file,
// which Source cannot see itself.
func (s *Source) Count(ops, bytes int64) {
	s.readOps.Add(ops)
	s.bytes.Add(bytes)
}

// IgnoringEINTR runs call until a signal does not interrupt it. A SOURCE
// on FUSE (or NFS) answers a signal that reaches a blocked call with
// EINTR, and Go's runtime signals its own threads; the os package retries
// for its callers, but bare system calls must do it themselves.
func IgnoringEINTR(call func() error) error {
	for {
		if err := call(); err != unix.EINTR {
			return err
		}
	}
}
