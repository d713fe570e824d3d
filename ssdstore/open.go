package ssdstore

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/ristretto/v2/z"
)

// Opening a store: the directory lock, the tables checked before Badger
// opens them, the index rebuilt from keys, and a damaged cache moved aside.

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

// load rebuilds the index, IDs included, from the keys alone.
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
			if old, ok := s.index[key]; ok {
				// Two keys for one block (a rewrite under another
				// length or ID whose old key was not deleted): the
				// newer segment's counts; the other goes with its
				// segment.
				if old.seg > m.seg {
					continue
				}
				s.segBytes[old.seg] -= int64(old.len)
				s.bytes -= int64(old.len)
			}
			s.index[key] = m
			s.segBytes[m.seg] += int64(m.len)
			s.bytes += int64(m.len)
			s.cur = max(s.cur, m.seg)
		}
		if len(s.index) > 0 {
			s.cur++ // never append to a segment of an earlier run
		}
		return nil
	})
}

// badgerLogger sends Badger's warnings and errors to slog; its chatty info
// and debug lines are dropped.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, a ...any)   { b.l.Error("badger: " + fmt.Sprintf(f, a...)) }
func (b badgerLogger) Warningf(f string, a ...any) { b.l.Warn("badger: " + fmt.Sprintf(f, a...)) }
func (b badgerLogger) Infof(string, ...any)        {}
func (b badgerLogger) Debugf(string, ...any)       {}

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
