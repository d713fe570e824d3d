// Package ssdstore is the SSD tier: a persistent, size-bounded store of sample
// blocks in Badger.
//
// # Layout
//
// Each block is one Badger entry. Its key is "i", the 4-byte big-endian
// number of the segment it was written in, the 4-byte data length, the
// 8-byte ID of its file (see Block.ID), and the block key ("s" and no ID
// for a block whose ID is unknown, as every block of a store written
// before IDs were kept); its value is a 32-byte header (magic, version,
// the block's integrity tag, the data's length and its integrity sum)
// followed by the data. Values go to Badger's value log; the LSM tree
// holds only keys and pointers, so the index is small and the store
// reopens quickly.
//
// # Eviction and space
//
// Blocks are written into the current segment; a segment closes when it
// holds Capacity/Segments bytes. When the live bytes exceed Capacity, the
// oldest segment is dropped as a whole with DropPrefix (after copying out
// the blocks a known plan needs soonest, when Config.NextUse
// is set), which also tells Badger that its value-log space is garbage,
// and value-log GC then deletes or rewrites those files. Evicting by
// segment, as flash caches do by region, keeps write amplification low and
// makes reclaimed space real rather than merely unreferenced. A block read
// from the oldest segments is copied into the current one, so blocks in
// use survive their segment.
//
// # Persistence and integrity
//
// Open rebuilds the in-memory index, file IDs included, by iterating keys
// only. Get verifies the header, the tag the caller expects (dataset, key
// and file version: see package integrity) and the sum over tag and data;
// any mismatch is a miss and the entry is deleted, never returned.
// Badger's own checksums are on too: its tables' on every read, and each
// value's in the value log.
//
// # Goroutines
//
// The Store owns one writer goroutine (batches Puts) and one maintenance
// goroutine (evicts, runs value-log GC). Close stops both, after the writer
// has committed everything queued, then closes Badger.
package ssdstore

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"
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
	// NextUse tells how soon a known plan needs the file with Block.ID
	// id (math.MaxInt64: not planned; a block whose ID is 0 is not asked
	// about, and not planned). When a segment is evicted, the planned
	// blocks needed soonest are kept; nil: plain segment FIFO. It is
	// called from the maintenance goroutine, with no lock of the store
	// held.
	NextUse func(id uint64) int64
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
	// ID is what Config.NextUse is asked about: the file's inode
	// number, as ramcache.Block's; 0 is unknown. It is kept in the
	// block's key, across a reopen too, outside the integrity sum: a
	// wrong one (from before a catalog numbered its files anew) costs
	// eviction a good choice, never a wrong read.
	ID   uint64
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
	// INVARIANT: every index entry's dbKey (its ID included) is in Badger:
	// writers add a key to Badger before the index, and take it out of the
	// index first.
	// (The tests check them: checkInvariant, checkPersisted.)
	index     map[string]meta
	segBytes  map[uint32]int64
	cur       uint32 // segment being written
	bytes     int64
	evicted   int64
	corrupt   int64
	dropped   int64
	rewritten int64
}

// meta is an index entry: 16 bytes, as it was before it held the ID (len
// is the 4 bytes the key holds, not an int64 after 4 of padding).
type meta struct {
	seg uint32
	len uint32 // the key's 4-byte length: put refuses larger blocks
	id  uint64 // Block.ID
}

type put struct {
	key  string
	b    Block
	keep bool // a copy of a block the store holds (kept on eviction, or aging): it may pass the disk bound
}

// Get returns the block for key, with its ID, if it is stored with tag
// and intact. A missing, stale or corrupt entry is a miss (false, nil).
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
	b.ID = m.id // the value does not hold it; the key does
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
	if int64(len(b.Data)) > min(s.dataCap/int64(s.cfg.Segments), math.MaxUint32) || (s.cfg.InMemory && len(b.Data) > 1<<20-1<<10) {
		return nil // larger than a segment (or a key's length, or an in-memory value): not worth caching
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
		s.segBytes[m.seg] -= int64(m.len)
		s.bytes -= int64(m.len)
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
