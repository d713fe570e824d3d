// Package pfssim simulates a contended shared parallel filesystem (a PFS)
// as a FUSE passthrough over a local directory.
//
// # Model
//
// Every open waits OpenLatency and every read call waits ReadLatency, as a
// metadata server and object storage targets would make a client wait.
// Reads share one aggregate bandwidth: each read reserves its bytes on a
// single timeline, so N concurrent readers together get Bandwidth, not N
// times it. At most MaxInFlight opens and reads are served at once; the
// rest queue, as on a busy server. A read of up to 1 MiB is one call (one
// RPC of a PFS client). Files are opened with direct I/O, so the
// kernel caches nothing and every read reaches the simulator, like a PFS
// client with no cache of its own.
//
// # Faults
//
// FailDir makes a directory's opens fail with an errno, FailStat a path's
// lookups and getattrs.
//
// Hang makes every open, read, lookup, getattr and listing wait, deaf to
// interrupts, until Resume or Unmount: a PFS that stops answering (a
// hard-mounted NFS server gone, a Lustre OST in recovery). Reading counts
// the reads being served, so a test can act while one is in progress.
//
// # Counting
//
// The simulator counts opens, read calls and bytes read and writes them as
// JSON to StatsFile (atomically, by rename) whenever they change, at most
// every FlushInterval, and at once on Dump. Tests and benchmarks measure PFS
// traffic there, independently of what dlfs reports.
package pfssim

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Config configures a simulator.
type Config struct {
	Dir         string        // backing directory; required
	OpenLatency time.Duration // added to every open
	ReadLatency time.Duration // added to every read call
	Bandwidth   int64         // aggregate bytes/s over all readers; 0 is unlimited
	MaxInFlight int           // opens and reads served at once; default 64
	StatsFile   string        // where the counters go; "" disables
	// NoAttrCache makes the kernel ask for attributes on every stat, so a
	// change to Dir shows at once (default: cached for a second, as a PFS
	// client caches them).
	NoAttrCache bool
	// PerMountInodes numbers inodes afresh on each mount, from a base of
	// its own, as FUSE clients without use_ino do (s3fs, JuiceFS without
	// it): two mounts of one directory then show every file with another
	// inode number. By default the backing files' numbers show through.
	PerMountInodes bool
	// FlushInterval bounds how often StatsFile is rewritten.
	FlushInterval time.Duration // default 50ms
	// TraceFile, if set, gets a line per read served: the file's path
	// under Dir, the offset and the bytes ("path off n"), written at
	// Unmount; each Dump adds a line "-- dump N 0" where it came. For
	// finding which bytes were read twice.
	TraceFile string
	// HangReads makes every open of a file for reading wait, deaf to
	// interrupts, from the mount on until Resume or Unmount, while
	// lookups, attributes and listings answer: a PFS whose data servers
	// hang while its metadata server answers.
	HangReads bool
}

// Counters are what the simulator counts.
type Counters struct {
	Opens   int64 `json:"opens"`
	ReadOps int64 `json:"read_ops"`
	Bytes   int64 `json:"bytes"`
	// Dumps counts Dump calls; a reader that asked for a dump waits until
	// it sees its number.
	Dumps int64 `json:"dumps"`
	// Reading is how many reads are being served at the dump (Reading).
	Reading int64 `json:"reading"`
}

// Sim is a mounted simulator.
type Sim struct {
	cfg    Config
	server *fuse.Server
	slots  chan struct{}

	opens, readOps, bytes, dumps atomic.Int64
	reading                      atomic.Int64 // reads past their slot, not yet answered

	gateMu  sync.Mutex
	gate    chan struct{}              // gateMu guards gate: non-nil while hung, closed by Resume
	faults  map[faultKey]syscall.Errno // (gateMu): FailDir, FailStat
	dirGate chan struct{}              // (gateMu) like gate, for HangDirs
	opGate  chan struct{}              // (gateMu) like gate, for HangReads

	bwMu   sync.Mutex
	bwNext time.Time // bwMu guards bwNext: when the link is next free

	inoMu   sync.Mutex
	inos    map[[2]uint64]uint64 // inoMu guards inos: (st_dev, st_ino) to this mount's number (PerMountInodes)
	inoBase uint64               // this mount's first number

	writeMu sync.Mutex // serializes StatsFile writes

	traceMu sync.Mutex
	trace   []traced // (traceMu) the reads served, with TraceFile

	stop chan struct{}
	done chan struct{}
}

// Mount mounts a simulator of cfg.Dir at mountpoint.
func Mount(mountpoint string, cfg Config) (*Sim, error) {
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 64
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = 50 * time.Millisecond
	}
	abs, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	cfg.Dir = abs
	s := &Sim{cfg: cfg, slots: make(chan struct{}, cfg.MaxInFlight), stop: make(chan struct{}), done: make(chan struct{}),
		inos: map[[2]uint64]uint64{}, inoBase: 1<<32 + uint64(rand.Uint32())<<8}
	if cfg.HangReads {
		s.opGate = make(chan struct{})
	}
	var st syscall.Stat_t
	if err := syscall.Stat(abs, &st); err != nil {
		return nil, fmt.Errorf("pfssim: %w", err)
	}
	root := &fs.LoopbackRoot{Path: abs, Dev: uint64(st.Dev)}
	//lint:ignore SA1019 the simulator builds its nodes itself (Lookup below makes them with NewNode too); NodeWrapChilder would wrap the loopback's own nodes, a rewrite of the simulator for no change in what it does
	root.NewNode = func(r *fs.LoopbackRoot, parent *fs.Inode, name string, st *syscall.Stat_t) fs.InodeEmbedder {
		return &node{LoopbackNode: fs.LoopbackNode{RootData: r}, sim: s}
	}
	//lint:ignore SA1019 as above
	rootNode := root.NewNode(root, nil, "", &st)
	root.RootNode = rootNode
	one := time.Second
	attr := one
	if cfg.NoAttrCache {
		attr = 0
	}
	s.server, err = fs.Mount(mountpoint, rootNode, &fs.Options{
		MountOptions: fuse.MountOptions{
			FsName: "pfssim:" + abs, Name: "pfssim", DirectMount: true, MaxBackground: 64,
			// A read call of up to 1 MiB is one request, as a PFS client
			// sends reads of up to its RPC size in one.
			MaxWrite:   1 << 20,
			AllowOther: os.Getuid() == 0,
		},
		EntryTimeout: &one, AttrTimeout: &attr,
	})
	if err != nil {
		return nil, fmt.Errorf("pfssim: mount %s: %w", mountpoint, err)
	}
	go s.flusher()
	return s, nil
}

// traced is one read served, for TraceFile.
type traced struct {
	path   string
	off, n int64
}

// writeTrace writes the reads served to TraceFile.
func (s *Sim) writeTrace() error {
	if s.cfg.TraceFile == "" {
		return nil
	}
	s.traceMu.Lock()
	defer s.traceMu.Unlock()
	var b []byte
	for _, t := range s.trace {
		b = fmt.Appendf(b, "%s %d %d\n", t.path, t.off, t.n)
	}
	if err := os.WriteFile(s.cfg.TraceFile, b, 0o644); err != nil {
		return fmt.Errorf("pfssim: trace: %w", err)
	}
	return nil
}

// Counters returns the current counts.
func (s *Sim) Counters() Counters {
	return Counters{Opens: s.opens.Load(), ReadOps: s.readOps.Load(), Bytes: s.bytes.Load(), Dumps: s.dumps.Load(),
		Reading: s.reading.Load()}
}

// Dump writes the counters to StatsFile now.
func (s *Sim) Dump() error {
	n := s.dumps.Add(1)
	if s.cfg.TraceFile != "" {
		s.traceMu.Lock()
		s.trace = append(s.trace, traced{path: "-- dump", off: n})
		s.traceMu.Unlock()
	}
	return s.write(s.Counters())
}

func (s *Sim) write(c Counters) error {
	if s.cfg.StatsFile == "" {
		return nil
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	b, _ := json.Marshal(c)
	tmp := s.cfg.StatsFile + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("pfssim: stats: %w", err)
	}
	return os.Rename(tmp, s.cfg.StatsFile)
}

// flusher rewrites StatsFile when the counters change, until Unmount.
func (s *Sim) flusher() {
	defer close(s.done)
	t := time.NewTicker(s.cfg.FlushInterval)
	defer t.Stop()
	last := Counters{Opens: -1}
	for {
		select {
		case <-s.stop:
			_ = s.write(s.Counters())
			return
		case <-t.C:
			if c := s.Counters(); c != last {
				_ = s.write(c)
				last = c
			}
		}
	}
}

// Wait blocks until the simulator is unmounted.
func (s *Sim) Wait() { s.server.Wait() }

// Unmount unmounts and writes the final counters. It resumes a hung
// simulator first.
func (s *Sim) Unmount() error {
	s.Resume()
	err := s.server.Unmount()
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
	if terr := s.writeTrace(); err == nil {
		err = terr
	}
	return err
}

// Hang makes every request wait until Resume or Unmount, ignoring
// interrupts.
func (s *Sim) Hang() {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.gate == nil {
		s.gate = make(chan struct{})
	}
}

// Resume answers the requests Hang and HangDirs held, and every later one.
func (s *Sim) Resume() {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.gate != nil {
		close(s.gate)
		s.gate = nil
	}
	if s.dirGate != nil {
		close(s.dirGate)
		s.dirGate = nil
	}
	if s.opGate != nil {
		close(s.opGate)
		s.opGate = nil
	}
}

// Kinds of injected faults.
const (
	dirFault  = iota // an open of a directory
	statFault        // a lookup or getattr
)

type faultKey struct {
	kind int
	path string
}

// FailDir makes every open of the directory at path (relative to Dir)
// fail with errno, until FailDir(path, 0): an unreadable directory, or a
// server's transient error.
func (s *Sim) FailDir(path string, errno syscall.Errno) { s.setFault(dirFault, path, errno) }

// FailStat makes every lookup and getattr of path (relative to Dir) fail
// with errno, until FailStat(path, 0).
func (s *Sim) FailStat(path string, errno syscall.Errno) { s.setFault(statFault, path, errno) }

func (s *Sim) setFault(kind int, path string, errno syscall.Errno) {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.faults == nil {
		s.faults = map[faultKey]syscall.Errno{}
	}
	if errno == 0 {
		delete(s.faults, faultKey{kind, path})
	} else {
		s.faults[faultKey{kind, path}] = errno
	}
}

func (s *Sim) fault(kind int, path string) syscall.Errno {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	return s.faults[faultKey{kind, path}]
}

// HangDirs makes opens of directories other than the root wait, deaf to
// interrupts, until Resume or Unmount: a PFS that stops answering in the
// middle of a scan.
func (s *Sim) HangDirs() {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.dirGate == nil {
		s.dirGate = make(chan struct{})
	}
}

func (s *Sim) waitDirs() { s.waitGate(&s.dirGate) }

// waitGate blocks while *g (gateMu) is set.
func (s *Sim) waitGate(g *chan struct{}) {
	s.gateMu.Lock()
	c := *g
	s.gateMu.Unlock()
	if c != nil {
		<-c
	}
}

// Reading reports how many reads are being served now.
func (s *Sim) Reading() int64 { return s.reading.Load() }

// wait blocks while the simulator hangs.
func (s *Sim) wait() {
	s.gateMu.Lock()
	g := s.gate
	s.gateMu.Unlock()
	if g != nil {
		<-g
	}
}

// acquire takes an in-flight slot and waits d, as the server would.
func (s *Sim) acquire(ctx context.Context, d time.Duration) bool {
	s.wait()
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	if d > 0 {
		time.Sleep(d) // not a wait in a test: the server's latency, simulated
	}
	return true
}

func (s *Sim) release() { <-s.slots }

// transfer waits until n bytes have crossed the shared link.
func (s *Sim) transfer(n int) {
	if s.cfg.Bandwidth <= 0 || n <= 0 {
		return
	}
	cost := time.Duration(float64(n) / float64(s.cfg.Bandwidth) * float64(time.Second))
	s.bwMu.Lock()
	now := time.Now()
	if s.bwNext.Before(now) {
		s.bwNext = now
	}
	s.bwNext = s.bwNext.Add(cost)
	until := s.bwNext
	s.bwMu.Unlock()
	time.Sleep(time.Until(until)) // the link's bandwidth, simulated
}

// node is a loopback node whose opens of regular files are slowed and
// counted.
type node struct {
	fs.LoopbackNode
	sim *Sim
}

var (
	_ = (fs.NodeOpener)((*node)(nil))
	_ = (fs.NodeLookuper)((*node)(nil))
	_ = (fs.NodeGetattrer)((*node)(nil))
	_ = (fs.NodeReaddirer)((*node)(nil))
	_ = (fs.NodeOpendirHandler)((*node)(nil))
	_ = (fs.NodeStatfser)((*node)(nil))
)

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	n.sim.wait()
	return n.LoopbackNode.Statfs(ctx, out)
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n.sim.wait()
	if errno := n.sim.fault(statFault, filepath.Join(n.Path(n.Root()), name)); errno != 0 {
		return nil, errno
	}
	if !n.sim.cfg.PerMountInodes {
		return n.LoopbackNode.Lookup(ctx, name, out)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(n.RootData.Path, n.Path(n.Root()), name), &st); err != nil {
		return nil, fs.ToErrno(err)
	}
	out.Attr.FromStat(&st)
	ino := n.sim.inoOf(&st)
	out.Attr.Ino = ino
	//lint:ignore SA1019 as at Mount
	child := n.RootData.NewNode(n.RootData, n.EmbeddedInode(), name, &st)
	return n.NewInode(ctx, child, fs.StableAttr{Mode: st.Mode, Ino: ino, Gen: 1}), 0
}

// inoOf is this mount's inode number of the file st describes: numbered
// in the order first looked up, from the mount's base.
func (s *Sim) inoOf(st *syscall.Stat_t) uint64 {
	s.inoMu.Lock()
	defer s.inoMu.Unlock()
	k := [2]uint64{uint64(st.Dev), st.Ino}
	ino, ok := s.inos[k]
	if !ok {
		ino = s.inoBase + uint64(len(s.inos))
		s.inos[k] = ino
	}
	return ino
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.sim.wait()
	if errno := n.sim.fault(statFault, n.Path(n.Root())); errno != 0 {
		return errno
	}
	return n.LoopbackNode.Getattr(ctx, f, out)
}

func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	n.sim.wait()
	return n.LoopbackNode.Readdir(ctx)
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	n.sim.wait()
	if p := n.Path(n.Root()); p != "" {
		n.sim.waitDirs()
	}
	if errno := n.sim.fault(dirFault, n.Path(n.Root())); errno != 0 {
		return nil, 0, errno
	}
	return n.LoopbackNode.OpendirHandle(ctx, flags)
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return n.LoopbackNode.Open(ctx, flags)
	}
	n.sim.waitGate(&n.sim.opGate)
	if !n.sim.acquire(ctx, n.sim.cfg.OpenLatency) {
		return nil, 0, syscall.EINTR
	}
	defer n.sim.release()
	p := filepath.Join(n.RootData.Path, n.Path(n.Root()))
	fd, err := syscall.Open(p, syscall.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, 0, fs.ToErrno(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		syscall.Close(fd)
		return nil, 0, fs.ToErrno(err)
	}
	n.sim.opens.Add(1)
	return &file{fd: fd, size: st.Size, sim: n.sim, path: n.Path(n.Root())}, fuse.FOPEN_DIRECT_IO, 0
}

// file is an open read-only file. The simulated PFS serves a stable
// dataset, so the size seen at open bounds every read.
type file struct {
	fd   int
	size int64
	sim  *Sim
	path string // under Dir, for TraceFile
}

var (
	_ = (fs.FileReader)((*file)(nil))
	_ = (fs.FileReleaser)((*file)(nil))
	_ = (fs.FileGetattrer)((*file)(nil))
	_ = (fs.FileFlusher)((*file)(nil))
)

// Flush answers ENOSYS, so the kernel stops sending FLUSH on close. A
// FLUSH is a FUSE round trip with no counterpart in the model (a PFS
// client's close is not modelled), and it would spend the client
// machine's CPU, which the readers under test share with the simulator.
func (f *file) Flush(ctx context.Context) syscall.Errno { return syscall.ENOSYS }

func (f *file) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f.sim.reading.Add(1)
	defer f.sim.reading.Add(-1)
	if !f.sim.acquire(ctx, f.sim.cfg.ReadLatency) {
		return nil, syscall.EINTR
	}
	defer f.sim.release()
	n := int(max(min(int64(len(dest)), f.size-off), 0))
	f.sim.transfer(n)
	f.sim.readOps.Add(1)
	f.sim.bytes.Add(int64(n))
	if f.sim.cfg.TraceFile != "" {
		f.sim.traceMu.Lock()
		f.sim.trace = append(f.sim.trace, traced{f.path, off, int64(n)})
		f.sim.traceMu.Unlock()
	}
	// Spliced from the file to the FUSE device: the simulator stands in for
	// a remote server, so it should take as little of the client machine's
	// CPU as it can (about 10% less than copying, measured here).
	return fuse.ReadResultFd(uintptr(f.fd), off, n), 0
}

func (f *file) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Fstat(f.fd, &st); err != nil {
		return fs.ToErrno(err)
	}
	out.FromStat(&st)
	return 0
}

func (f *file) Release(ctx context.Context) syscall.Errno {
	return fs.ToErrno(syscall.Close(f.fd))
}

// ReadCounters reads a StatsFile.
func ReadCounters(path string) (Counters, error) {
	var c Counters
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("pfssim: %s: %w", path, err)
	}
	return c, nil
}
