// Package ssdstore is the SSD tier: a persistent, size-bounded store of sample
// blocks in Badger.
//
// # Layout
//
// Each block is one Badger entry. Its key is "s", the 4-byte big-endian
// number of the segment it was written in, the 4-byte data length, and the
// block key; its value is a
// 32-byte header (magic, version, the block's integrity tag, the data's
// length and its integrity sum) followed by the data. Values go to Badger's value log;
// the LSM tree holds only keys and pointers, so the index is small and the
// store reopens quickly.
//
// # Eviction and space
//
// Blocks are written into the current segment; a segment closes when it
// holds Capacity/Segments bytes. When the live bytes exceed Capacity, the
// oldest segment is dropped as a whole with DropPrefix (after copying out
// the blocks a known plan needs soonest, when Config.NextUse is set), which also tells
// Badger that its value-log space is garbage, and value-log GC then deletes
// or rewrites those files. Evicting by segment, as flash caches do by region,
// keeps write amplification low and makes reclaimed space real rather than
// merely unreferenced. A block read from the oldest segments is copied into
// the current one, so blocks in use survive their segment.
//
// # Persistence and integrity
//
// Open rebuilds the in-memory index by iterating keys only. Get verifies the
// header, the tag the caller expects (dataset, key and file version: see
// package integrity) and the sum over tag and data; any mismatch is a miss
// and the entry is deleted, never returned. Badger's own checksums are on
// too: its tables' on every read, and each value's in the value log.
//
// # Goroutines
//
// The Store owns one writer goroutine (batches Puts) and one maintenance
// goroutine (evicts, runs value-log GC). Close stops both, after the writer
// has committed everything queued, then closes Badger.
package ssdstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/ristretto/v2/z"

	"github.com/dlfs/dlfs/integrity"
)

// Config configures a Store.
type Config struct {
	// Dir holds the Badger files. Required unless InMemory.
	Dir string
	// Capacity bounds every byte the store keeps on disk: block data,
	// Badger's tables, memtable logs and value-log files, garbage
	// included. Block data gets what Badger's own files leave (see
	// Stats.Capacity).
	Capacity int64 // default 4 GiB
	// MinFree is the free space the store leaves on Dir's filesystem: below
	// it, it writes nothing (Badger's memory-mapped files take a SIGBUS,
	// not an error, from a full disk). At Open, below half of it, the
	// store refuses to open (ErrNoSpace).
	MinFree int64 // default: two value-log files, two memtables and 16 MiB
	// Segments is the eviction granularity: Capacity/Segments bytes are
	// dropped at a time.
	Segments int // default 16
	// InMemory keeps everything in RAM (tests).
	InMemory bool
	// QueueBytes bounds the data of Puts waiting for the writer; Put drops
	// blocks beyond it.
	QueueBytes int64 // default 64 MiB
	// GCInterval is how often value-log GC runs when there is garbage.
	GCInterval time.Duration // default 10s
	// NextUse tells how soon a block is needed by a known plan
	// (math.MaxInt64: not planned). When a segment is evicted, the planned
	// blocks needed soonest are kept. nil: plain segment FIFO.
	NextUse func(key string) int64
	// TrimBytes of SSD traffic (reads and writes) trigger a page-out of
	// Badger's value-log mappings, which keeps them out of the
	// daemon's RSS (see pageout_linux.go). 0 disables.
	TrimBytes int64        // default 32 MiB
	Logger    *slog.Logger // nil: discard
}

// DefaultConfig returns the defaults for dir.
func DefaultConfig(dir string) Config {
	return Config{Dir: dir, Capacity: 4 << 30, Segments: 16, QueueBytes: 64 << 20, GCInterval: 10 * time.Second, TrimBytes: 32 << 20}
}

// Block is one stored piece of a file.
type Block struct {
	Data []byte
	Tag  uint64 // integrity.Tag of the block's dataset, key and file version
	Sum  uint32 // integrity.Sum of Data under Tag
}

// Stats describe the tier's contents.
type Stats struct {
	Entries  int64 `json:"entries"`
	Bytes    int64 `json:"bytes"`
	Capacity int64 `json:"capacity_bytes"`
	// DiskBytes is what Badger occupies on disk (LSM + value log).
	DiskBytes int64 `json:"disk_bytes"`
	Evicted   int64 `json:"evicted_segments"`
	Corrupt   int64 `json:"corrupt"`
	// Dropped counts blocks not cached because the write queue was full.
	Dropped int64 `json:"dropped_writes"`
	// Kept counts blocks copied out of an evicted segment because a plan
	// needs them soon.
	Kept int64 `json:"kept_on_eviction"`
}

// ErrClosed is returned by operations on a closed Store.
var ErrClosed = errors.New("ssdstore: closed")

// ErrBusy means a Put was dropped because the write queue was full.
var ErrBusy = errors.New("ssdstore: write queue full")

// ErrNoSpace means the cache's filesystem has too little free space to
// open the store safely.
var ErrNoSpace = errors.New("ssdstore: too little free space")

// Store is safe for concurrent use. Get blocks on the SSD; Put blocks only
// when the write queue is full.
type Store struct {
	cfg     Config // read-only after Open
	db      *badger.DB
	log     *slog.Logger
	lock    *os.File     // holds the directory's lock; nil in memory
	dataCap int64        // bytes of block data kept: Capacity less Badger's own files
	low     atomic.Bool  // writes stopped: too little free space, or the disk bound reached
	room    atomic.Int64 // bytes of the last write dropped at the disk bound

	queue   chan put
	kick    chan struct{} // wakes maintenance; capacity 1
	traffic atomic.Int64  // bytes read and written since the last page-out
	pending atomic.Int64  // bytes queued for the writer
	stop    chan struct{}
	wg      sync.WaitGroup
	// closeMu is held for writing only while Close marks the store closed
	// and signals stop, never while it waits for the goroutines (whose
	// Puts take it for reading); Puts hold it for reading across their
	// check of closed and their send, so none is queued after the
	// writer's final drain.
	closeMu sync.RWMutex
	closed  bool
	// dropMu is held for writing while a segment is dropped: Badger refuses
	// writes during DropPrefix, so writers hold it for reading.
	dropMu sync.RWMutex

	mu sync.Mutex
	// mu guards the following.
	// INVARIANT: bytes == sum of meta.len over index; segBytes[s] == sum over index entries in s.
	index     map[string]meta
	segBytes  map[uint32]int64
	cur       uint32 // segment being written
	bytes     int64
	evicted   int64
	corrupt   int64
	dropped   int64
	rewritten int64
}

type meta struct {
	seg uint32
	len int64
}

type put struct {
	key  string
	b    Block
	keep bool // a copy of a block the store holds (kept on eviction, or aging): it may pass the disk bound
}

const (
	magic      = 0x444c4653 // "DLFS"
	version    = 2          // 1 had the file's size and mtime where the tag is, and a sum over the data alone
	headerSize = 32
)

// Open opens or creates the store and rebuilds its index.
func Open(cfg Config) (*Store, error) {
	def := DefaultConfig(cfg.Dir)
	if cfg.Capacity <= 0 {
		return nil, fmt.Errorf("ssdstore: capacity must be positive, got %d", cfg.Capacity)
	}
	if cfg.Segments <= 0 {
		cfg.Segments = def.Segments
	}
	if cfg.QueueBytes <= 0 {
		cfg.QueueBytes = def.QueueBytes
	}
	if cfg.GCInterval <= 0 {
		cfg.GCInterval = def.GCInterval
	}
	if cfg.Dir != "" {
		if abs, err := filepath.Abs(cfg.Dir); err == nil {
			cfg.Dir = abs // pageOut matches mappings by absolute path
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Dir == "" && !cfg.InMemory {
		return nil, errors.New("ssdstore: no directory given")
	}
	vlogSize, memSize, dataCap := layout(cfg.Capacity, cfg.InMemory)
	if cfg.MinFree <= 0 {
		cfg.MinFree = 2*vlogSize + 2*memSize + 16<<20
	}
	if err := checkCapacity(cfg.Capacity, dataCap); err != nil {
		return nil, err
	}
	opts := badger.DefaultOptions(cfg.Dir).
		WithInMemory(cfg.InMemory).
		WithLogger(badgerLogger{cfg.Logger}).
		WithCompression(options.None). // samples are compressed images already
		WithValueThreshold(1 << 10).   // sample data goes to the value log
		WithValueLogFileSize(vlogSize).
		WithMemTableSize(memSize). // small memtables and caches: RAM belongs to the RAM tier
		WithNumMemtables(2).
		WithNumLevelZeroTables(2).
		WithNumLevelZeroTablesStall(8).
		WithBlockCacheSize(0).
		WithIndexCacheSize(0).
		WithNumCompactors(2).
		WithNumGoroutines(2).
		WithMetricsEnabled(false).
		WithDetectConflicts(false).
		WithChecksumVerificationMode(options.OnTableAndBlockRead).
		WithVerifyValueChecksum(true)
	if cfg.InMemory {
		// No value log in memory: values live in the tree, up to 1 MB.
		opts = opts.WithDir("").WithValueDir("").WithValueThreshold(1 << 20)
	}
	var lock *os.File
	if !cfg.InMemory {
		var err error
		if lock, err = lockDir(cfg.Dir); err != nil {
			return nil, err
		}
		if free, err := freeSpace(cfg.Dir); err == nil && free < cfg.MinFree/2 {
			lock.Close()
			return nil, fmt.Errorf("%w: %d MiB free on %s, under half the floor of %d MiB; free space or move --ssd-cache", ErrNoSpace, free>>20, cfg.Dir, cfg.MinFree>>20)
		}
	}
	s := &Store{
		cfg: cfg, log: cfg.Logger, lock: lock, dataCap: dataCap,
		queue:    make(chan put, 4096),
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		index:    make(map[string]meta),
		segBytes: make(map[uint32]int64),
	}
	err := s.open(opts)
	if err != nil && !cfg.InMemory && !errors.Is(err, errLocked) {
		// A cache is rebuildable: move the damaged one aside, start empty.
		aside := fmt.Sprintf("%s.damaged-%s", cfg.Dir, time.Now().Format("20060102-150405.000"))
		cfg.Logger.Warn("ssdstore: the cache is damaged; moved it aside and starting empty", "dir", cfg.Dir, "aside", aside, "err", err)
		s.lock.Close()
		s.lock = nil
		if rerr := os.Rename(cfg.Dir, aside); rerr != nil {
			return nil, fmt.Errorf("ssdstore: %s is damaged (%v) and cannot be moved aside: %w; remove it", cfg.Dir, err, rerr)
		}
		if s.lock, err = lockDir(cfg.Dir); err != nil {
			return nil, err
		}
		s.index, s.segBytes, s.bytes, s.cur = make(map[string]meta), make(map[uint32]int64), 0, 0
		err = s.open(opts)
	}
	if err != nil {
		if s.lock != nil {
			s.lock.Close()
		}
		return nil, err
	}
	s.wg.Add(2)
	go s.writer()
	go s.maintain()
	s.wakeMaintenance()
	return s, nil
}

// open opens Badger over the directory and rebuilds the index. Any error
// means the cache cannot be used as it is (Open moves it aside). Tables are
// checked first in this goroutine: Badger opens them in goroutines of its
// own, where a truncated one panics out of reach.
func (s *Store) open(opts badger.Options) error {
	if !s.cfg.InMemory {
		if err := restrict(s.cfg.Dir); err != nil {
			return err
		}
		if err := checkTables(s.cfg.Dir); err != nil {
			return err
		}
	}
	db, err := badger.Open(opts)
	if err != nil {
		return fmt.Errorf("ssdstore: open %s: %w", s.cfg.Dir, err)
	}
	s.db = db
	if !s.cfg.InMemory {
		if err := restrict(s.cfg.Dir); err != nil { // the files Badger just made
			db.Close()
			return err
		}
	}
	if err := s.load(); err != nil {
		db.Close()
		return fmt.Errorf("ssdstore: read the index of %s: %w", s.cfg.Dir, err)
	}
	return nil
}

// errLocked means another process holds the cache directory.
var errLocked = errors.New("ssdstore: another dlfs is using this cache directory")

// lockDir makes dir if it is missing and takes an exclusive lock on it
// for this process, so that two daemons never share a cache (and a second
// one does not take the first's cache for damaged).
func lockDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ssdstore: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "dlfs.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ssdstore: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s; give each mount its own --ssd-cache", errLocked, dir)
		}
		return nil, fmt.Errorf("ssdstore: lock %s: %w", dir, err)
	}
	return f, nil
}

// checkTables opens every table of dir as Badger would, checking its
// checksum, and turns a panic on a damaged one into an error.
func checkTables(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("ssdstore: %w", err)
	}
	for _, e := range ents {
		if filepath.Ext(e.Name()) != ".sst" {
			continue
		}
		if err := checkTable(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func checkTable(path string) (err error) {
	var mf *z.MmapFile
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("ssdstore: table %s is damaged: %v", path, v)
			if mf != nil {
				mf.Close(-1)
			}
		}
	}()
	mf, err = z.OpenMmapFile(path, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("ssdstore: table %s: %w", path, err)
	}
	// OpenTable closes mf itself on an error. On success, mf is unmapped
	// here: the table's DecrRef would delete the file.
	if _, err := table.OpenTable(mf, table.Options{ReadOnly: true, ChkMode: options.OnTableRead, Compression: options.None}); err != nil {
		return fmt.Errorf("ssdstore: table %s is damaged: %w", path, err)
	}
	return mf.Close(-1)
}

// load rebuilds the index from the keys alone.
func (s *Store) load() error {
	return s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.PrefetchValues = false
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			m, key, ok := parseKey(it.Item().Key())
			if !ok {
				continue
			}
			s.index[key] = m
			s.segBytes[m.seg] += m.len
			s.bytes += m.len
			s.cur = max(s.cur, m.seg)
		}
		if len(s.index) > 0 {
			s.cur++ // never append to a segment of an earlier run
		}
		return nil
	})
}

// dbKey is the Badger key of a block: 's', the segment, the data length
// (so that Open rebuilds the index from keys alone) and the block key.
func dbKey(m meta, key string) []byte {
	k := make([]byte, 9+len(key))
	k[0] = 's'
	binary.BigEndian.PutUint32(k[1:5], m.seg)
	binary.BigEndian.PutUint32(k[5:9], uint32(m.len))
	copy(k[9:], key)
	return k
}

func segPrefix(seg uint32) []byte { return dbKey(meta{seg: seg}, "")[:5] }

func parseKey(k []byte) (m meta, key string, ok bool) {
	if len(k) < 9 || k[0] != 's' {
		return meta{}, "", false
	}
	m = meta{seg: binary.BigEndian.Uint32(k[1:5]), len: int64(binary.BigEndian.Uint32(k[5:9]))}
	return m, string(k[9:]), true
}

// encode returns the stored form of b.
func encode(b Block) []byte {
	v := make([]byte, headerSize+len(b.Data))
	binary.BigEndian.PutUint32(v[0:], magic)
	v[4] = version
	binary.BigEndian.PutUint64(v[8:], b.Tag)
	binary.BigEndian.PutUint32(v[24:], uint32(len(b.Data)))
	binary.BigEndian.PutUint32(v[28:], b.Sum)
	copy(v[headerSize:], b.Data)
	return v
}

// ErrCorrupt means a stored value failed its header or checksum check.
var ErrCorrupt = errors.New("ssdstore: corrupt entry")

// decode parses a stored value. The returned block shares v.
func decode(v []byte) (Block, error) {
	if len(v) < headerSize {
		return Block{}, fmt.Errorf("%w: %d-byte value is shorter than the header", ErrCorrupt, len(v))
	}
	if binary.BigEndian.Uint32(v[0:]) != magic || v[4] != version || v[5]|v[6]|v[7] != 0 ||
		binary.BigEndian.Uint64(v[16:]) != 0 {
		return Block{}, fmt.Errorf("%w: bad magic, version or reserved bytes", ErrCorrupt)
	}
	b := Block{
		Tag:  binary.BigEndian.Uint64(v[8:]),
		Sum:  binary.BigEndian.Uint32(v[28:]),
		Data: v[headerSize:],
	}
	if n := binary.BigEndian.Uint32(v[24:]); int(n) != len(b.Data) {
		return Block{}, fmt.Errorf("%w: header says %d bytes, value holds %d", ErrCorrupt, n, len(b.Data))
	}
	if !integrity.Check(b.Tag, b.Sum, b.Data) {
		return Block{}, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	return b, nil
}

// Get returns the block for key if it is stored with tag and intact. A
// missing, stale or corrupt entry is a miss (false, nil).
func (s *Store) Get(key string, tag uint64) (Block, bool, error) {
	s.mu.Lock()
	m, ok := s.index[key]
	s.mu.Unlock()
	if !ok {
		return Block{}, false, nil
	}
	var v []byte
	err := s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(dbKey(m, key))
		if err != nil {
			return err
		}
		v, err = item.ValueCopy(nil)
		return err
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		s.forget(key, m)
		return Block{}, false, nil
	}
	if errors.Is(err, badger.ErrDBClosed) {
		return Block{}, false, ErrClosed
	}
	if err != nil {
		return Block{}, false, fmt.Errorf("ssdstore: get %s: %w", key, err)
	}
	s.noteTraffic(int64(len(v)))
	b, err := decode(v)
	if err != nil {
		s.log.Warn("ssdstore: dropping corrupt entry", "key", key, "err", err)
		s.mu.Lock()
		s.corrupt++
		s.mu.Unlock()
		s.Delete(key)
		return Block{}, false, nil
	}
	if b.Tag != tag {
		s.Delete(key) // another version of the file, or another dataset's
		return Block{}, false, nil
	}
	if s.aging(m.seg) {
		// Keep a block in use: rewrite it into the current segment.
		_ = s.put(key, b, true)
	}
	return b, true, nil
}

// aging reports whether seg is among the oldest quarter of live segments,
// which eviction will drop next.
func (s *Store) aging(seg uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur-seg >= uint32(max(s.cfg.Segments*3/4, 1))
}

// Contains reports whether key is indexed (its bytes may still fail checks).
func (s *Store) Contains(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.index[key]
	return ok
}

// Put queues b for writing under key and returns at once. When the queue
// is full (the SSD is slower than the reads filling it) the block is not
// cached on the SSD and Put returns ErrBusy: a reader never waits for the
// cache. It returns ErrClosed after Close.
func (s *Store) Put(key string, b Block) error { return s.put(key, b, false) }

// put queues b; keep marks a copy of a block the store already holds.
func (s *Store) put(key string, b Block, keep bool) error {
	if int64(len(b.Data)) > s.dataCap/int64(s.cfg.Segments) || (s.cfg.InMemory && len(b.Data) > 1<<20-1<<10) {
		return nil // larger than a segment (or an in-memory value): not worth caching
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	n := int64(len(b.Data))
	if s.pending.Add(n) <= s.cfg.QueueBytes {
		select {
		case s.queue <- put{key, b, keep}:
			return nil
		default:
		}
	}
	s.pending.Add(-n)
	s.mu.Lock()
	s.dropped++
	s.mu.Unlock()
	return ErrBusy
}

// Delete removes key.
func (s *Store) Delete(key string) {
	s.mu.Lock()
	m, ok := s.index[key]
	s.mu.Unlock()
	if !ok {
		return
	}
	s.forget(key, m)
	s.dropMu.RLock()
	err := s.db.Update(func(txn *badger.Txn) error { return txn.Delete(dbKey(m, key)) })
	s.dropMu.RUnlock()
	if err != nil && !errors.Is(err, badger.ErrDBClosed) {
		s.log.Warn("ssdstore: delete failed", "key", key, "err", err)
	}
}

// DeletePrefix removes every key that begins with prefix (a file's
// blocks), walking the index: for a file of more blocks than the store
// holds.
func (s *Store) DeletePrefix(prefix string) {
	s.mu.Lock()
	var keys []string
	for k := range s.index {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	s.mu.Unlock()
	for _, k := range keys {
		s.Delete(k)
	}
}

// forget drops key from the index if it still points at m.
func (s *Store) forget(key string, m meta) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.index[key]; ok && cur == m {
		delete(s.index, key)
		s.segBytes[m.seg] -= m.len
		s.bytes -= m.len
	}
}

// writer commits queued Puts in batches until stop, then drains the queue.
func (s *Store) writer() {
	defer s.wg.Done()
	batch := make([]put, 0, 64)
	for {
		select {
		case p := <-s.queue:
			batch = append(batch[:0], p)
		more:
			for len(batch) < cap(batch) {
				select {
				case p := <-s.queue:
					batch = append(batch, p)
				default:
					break more
				}
			}
			s.commit(batch)
		case <-s.stop:
			for {
				select {
				case p := <-s.queue:
					s.commit([]put{p})
				default:
					return
				}
			}
		}
	}
}

func (s *Store) commit(batch []put) {
	// Every Put of the batch is released, the ones dropped below too: the
	// closure must not see batch once it is cut down to the kept copies.
	queued := batch
	defer func() {
		for _, p := range queued {
			s.pending.Add(-int64(len(p.b.Data)))
		}
	}()
	var n, fresh int64
	for _, p := range batch {
		n += int64(len(p.b.Data)) + headerSize
		if !p.keep {
			fresh += int64(len(p.b.Data)) + headerSize
		}
	}
	if low, full := s.lowSpace(n, fresh); low || full {
		// Below the floor nothing is written; at the disk bound only
		// copies of blocks the store already holds, which leave garbage
		// behind for maintenance to collect.
		kept := batch[:0:0]
		for _, p := range batch {
			if p.keep && !low {
				kept = append(kept, p)
			}
		}
		s.mu.Lock()
		s.dropped += int64(len(batch) - len(kept))
		s.mu.Unlock()
		s.wakeMaintenance()
		if len(kept) == 0 {
			return
		}
		batch = kept
	}
	s.dropMu.RLock()
	defer s.dropMu.RUnlock()
	s.mu.Lock()
	seg := s.cur
	s.mu.Unlock()
	wb := s.db.NewWriteBatch()
	for _, p := range batch {
		if err := wb.Set(dbKey(meta{seg: seg, len: int64(len(p.b.Data))}, p.key), encode(p.b)); err != nil {
			s.log.Warn("ssdstore: write failed", "key", p.key, "err", err)
		}
	}
	if err := wb.Flush(); err != nil {
		s.log.Warn("ssdstore: commit failed; blocks stay uncached", "n", len(batch), "err", err)
		return
	}
	segSize := s.dataCap / int64(s.cfg.Segments)
	var stale []meta
	var staleKeys []string
	s.mu.Lock()
	for _, p := range batch {
		n := int64(len(p.b.Data))
		if old, ok := s.index[p.key]; ok {
			s.segBytes[old.seg] -= old.len
			s.bytes -= old.len
			if old.seg != seg {
				stale = append(stale, old)
				staleKeys = append(staleKeys, p.key)
			}
		}
		s.index[p.key] = meta{seg: seg, len: n}
		s.segBytes[seg] += n
		s.bytes += n
	}
	if s.segBytes[s.cur] >= segSize {
		s.cur++
	}
	over := s.bytes > s.dataCap
	s.mu.Unlock()
	if len(stale) > 0 {
		// A rewritten block's old copy lives in an older segment: delete it
		// so the segment's drop cannot remove the fresh copy's bytes twice.
		_ = s.db.Update(func(txn *badger.Txn) error {
			for i, m := range stale {
				if err := txn.Delete(dbKey(m, staleKeys[i])); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if over {
		s.wakeMaintenance()
	}
	s.noteTraffic(n)
}

// lowSpace reports whether a write of n bytes, fresh of them new to the
// store, would take the filesystem's free space under MinFree (low), or
// the store's files past Capacity (full: maintenance then evicts and
// collects). It logs when that starts and ends.
func (s *Store) lowSpace(n, fresh int64) (low, full bool) {
	if s.cfg.InMemory {
		return false, false
	}
	free, err := freeSpace(s.cfg.Dir)
	low = err == nil && free-n < s.cfg.MinFree
	disk := diskUsage(s.cfg.Dir)
	full = disk+fresh > s.cfg.Capacity
	if full {
		s.room.Store(fresh) // maintenance makes room for it
	} else {
		s.room.Store(0)
	}
	if was := s.low.Swap(low || full); was != (low || full) {
		if low || full {
			s.log.Warn("ssdstore: not caching on the SSD until there is room", "free_mib", free>>20, "floor_mib", s.cfg.MinFree>>20,
				"disk_mib", disk>>20, "capacity_mib", s.cfg.Capacity>>20)
		} else {
			s.log.Info("ssdstore: caching on the SSD again", "free_mib", free>>20)
		}
	}
	return low, full
}

// overDisk reports whether the store's files, with the room a dropped
// write asked for, exceed Capacity.
func (s *Store) overDisk() bool {
	return !s.cfg.InMemory && diskUsage(s.cfg.Dir)+s.room.Load() > s.cfg.Capacity
}

// freeSpace returns the bytes an unprivileged writer may still use on
// dir's filesystem.
func freeSpace(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// noteTraffic counts SSD bytes and wakes maintenance for a page-out when
// enough have passed through Badger's mappings.
func (s *Store) noteTraffic(n int64) {
	if s.cfg.TrimBytes > 0 && s.traffic.Add(n) >= s.cfg.TrimBytes {
		s.wakeMaintenance()
	}
}

// trim pages out Badger's value-log mappings.
func (s *Store) trim() {
	if s.cfg.InMemory || s.cfg.TrimBytes <= 0 || s.traffic.Load() < s.cfg.TrimBytes {
		return
	}
	s.traffic.Store(0)
	if _, err := pageOut(s.cfg.Dir); err != nil {
		s.log.Warn("ssdstore: page-out failed", "err", err)
	}
}

func (s *Store) wakeMaintenance() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// maintain evicts whole segments while over capacity and collects the value
// log, until stop.
func (s *Store) maintain() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.GCInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-s.kick:
		case <-t.C:
		}
		dropped := false
		for s.evictOldest(false) {
			dropped = true
		}
		if dropped || s.garbage() || s.overDisk() {
			s.collect()
		}
		// Still over the disk bound: the value log's garbage is not yet
		// collectable (Badger learns of it as it compacts). Drop one more
		// segment a round, oldest first, until it is.
		if s.overDisk() && s.evictOldest(true) {
			s.collect()
		}
		s.trim()
	}
}

// evictOldest drops the oldest segment if the store holds more data than
// it may, or, with force, if it holds more than the open segment.
func (s *Store) evictOldest(force bool) bool {
	s.mu.Lock()
	if s.bytes <= s.dataCap && !(force && len(s.segBytes) > 1) {
		s.mu.Unlock()
		return false
	}
	oldest := s.cur
	for seg := range s.segBytes {
		if seg < oldest {
			oldest = seg
		}
	}
	if oldest == s.cur {
		s.cur++ // everything is in the open segment: close it and drop it
	}
	var victims []keyMeta
	for k, m := range s.index {
		if m.seg == oldest {
			victims = append(victims, keyMeta{k, m})
			delete(s.index, k)
			s.bytes -= m.len
		}
	}
	delete(s.segBytes, oldest)
	s.evicted++
	s.mu.Unlock()
	s.keepPlanned(victims)
	s.dropMu.Lock()
	err := s.db.DropPrefix(segPrefix(oldest))
	s.dropMu.Unlock()
	if err != nil && !errors.Is(err, badger.ErrDBClosed) {
		s.log.Warn("ssdstore: dropping segment failed", "segment", oldest, "err", err)
	}
	return true
}

type keyMeta struct {
	key string
	m   meta
}

// keepPlanned copies the blocks of a segment about to be dropped that a
// plan needs soonest into the current segment, up to half a segment's
// bytes: segment eviction approximates Belady's policy when the future is
// known. Without Config.NextUse it does nothing.
func (s *Store) keepPlanned(victims []keyMeta) {
	if s.cfg.NextUse == nil {
		return
	}
	type planned struct {
		keyMeta
		next int64
	}
	var keep []planned
	for _, v := range victims {
		if n := s.cfg.NextUse(v.key); n != math.MaxInt64 {
			keep = append(keep, planned{v, n})
		}
	}
	sort.Slice(keep, func(i, j int) bool { return keep[i].next < keep[j].next })
	budget := s.dataCap / int64(s.cfg.Segments) / 2
	for _, k := range keep {
		if budget -= k.m.len; budget < 0 {
			break
		}
		var v []byte
		err := s.db.View(func(txn *badger.Txn) error {
			item, err := txn.Get(dbKey(k.m, k.key))
			if err != nil {
				return err
			}
			v, err = item.ValueCopy(nil)
			return err
		})
		if err != nil {
			continue
		}
		if b, err := decode(v); err == nil && s.put(k.key, b, true) == nil {
			s.mu.Lock()
			s.rewritten++
			s.mu.Unlock()
		}
	}
}

// garbage reports whether the value log is noticeably larger than the data.
func (s *Store) garbage() bool {
	if s.cfg.InMemory {
		return false
	}
	disk := diskUsage(s.cfg.Dir)
	s.mu.Lock()
	defer s.mu.Unlock()
	return disk > s.bytes+s.bytes/4+min(64<<20, s.cfg.Capacity/8)
}

// collect runs value-log GC until it finds nothing worth rewriting.
func (s *Store) collect() {
	if s.cfg.InMemory {
		return
	}
	for i := 0; i < 64; i++ {
		select {
		case <-s.stop:
			return
		default:
		}
		// Badger's GC reads state its write path changes without a lock
		// (the race detector sees it): no write of ours runs meanwhile.
		s.dropMu.Lock()
		err := s.db.RunValueLogGC(0.5)
		s.dropMu.Unlock()
		if err != nil {
			return // ErrNoRewrite: done; anything else is logged by Badger
		}
	}
}

// Stats returns the current contents.
func (s *Store) Stats() Stats {
	var disk int64
	if !s.cfg.InMemory {
		disk = diskUsage(s.cfg.Dir)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Entries: int64(len(s.index)), Bytes: s.bytes, Capacity: s.dataCap,
		DiskBytes: disk, Evicted: s.evicted, Corrupt: s.corrupt, Dropped: s.dropped, Kept: s.rewritten}
}

// Close commits queued writes, stops the goroutines and closes Badger. It is
// safe to call twice.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		s.wg.Wait() // a concurrent Close may still be closing
		return nil
	}
	s.closed = true
	close(s.stop)
	s.closeMu.Unlock()
	s.wg.Wait()
	err := s.db.Close()
	if s.lock != nil {
		s.lock.Close()
	}
	if err != nil {
		return fmt.Errorf("ssdstore: close: %w", err)
	}
	return nil
}

// badgerLogger sends Badger's warnings and errors to slog; its chatty info
// and debug lines are dropped.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, a ...any)   { b.l.Error("badger: " + fmt.Sprintf(f, a...)) }
func (b badgerLogger) Warningf(f string, a ...any) { b.l.Warn("badger: " + fmt.Sprintf(f, a...)) }
func (b badgerLogger) Infof(string, ...any)        {}
func (b badgerLogger) Debugf(string, ...any)       {}

// diskUsage returns the bytes the files directly in dir occupy on disk.
func diskUsage(dir string) int64 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
	}
	return n
}

// restrict makes dir 0700 and the files in it 0600: the cache holds copies
// of SOURCE's files, some of which only their owners may read. Badger
// makes its memory-mapped files 0666 less the umask; in a 0700 directory
// nobody else reaches them.
func restrict(dir string) error {
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("ssdstore: %s: %w", dir, err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("ssdstore: %s: %w", dir, err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() {
			if err := os.Chmod(filepath.Join(dir, e.Name()), 0o600); err != nil {
				return fmt.Errorf("ssdstore: %s: %w", dir, err)
			}
		}
	}
	return nil
}
