package ssdstore

// Tests written against the mutants gremlins left alive (make mutate,
// docs/mutation.md). Most pin a rule at its exact boundary on a Store
// built by hand, with no goroutines, so that nothing races the check.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	badger "github.com/dgraph-io/badger/v4"
	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/integrity"
)

// recorder is a slog handler that keeps every record's level and message.
type recorder struct {
	mu   sync.Mutex
	recs []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Level.String()+" "+rec.Message)
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

// warnings returns the records at WARN and above.
func (r *recorder) warnings() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, s := range r.recs {
		if strings.HasPrefix(s, "WARN") || strings.HasPrefix(s, "ERROR") {
			out = append(out, s)
		}
	}
	return out
}

// bare is a Store built by hand: no goroutines, no Badger unless withDB.
func bare(t *testing.T, cfg Config, dataCap int64, withDB bool) (*Store, *recorder) {
	t.Helper()
	rec := &recorder{}
	s := &Store{cfg: cfg, log: slog.New(rec), dataCap: dataCap,
		queue: make(chan put, 1024), kick: make(chan struct{}, 1), stop: make(chan struct{}),
		index: map[string]meta{}, segBytes: map[uint32]int64{}}
	if withDB {
		db, err := badger.Open(badger.DefaultOptions("").WithInMemory(true).WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		s.db = db
	}
	return s, rec
}

func TestDefaultConfig(t *testing.T) {
	got := DefaultConfig("/x")
	want := Config{Dir: "/x", Capacity: 4 << 30, Segments: 16, QueueBytes: 64 << 20, GCInterval: 10 * time.Second, TrimBytes: 32 << 20}
	if got.Dir != want.Dir || got.Capacity != want.Capacity || got.Segments != want.Segments || got.QueueBytes != want.QueueBytes ||
		got.GCInterval != want.GCInterval || got.TrimBytes != want.TrimBytes || got.MinFree != 0 || got.InMemory {
		t.Fatalf("DefaultConfig = %+v, want %+v", got, want)
	}
}

// TestOpenSizing pins how Open sizes Badger's files from the capacity and
// what it leaves for block data: every byte on disk is within Capacity.
func TestOpenSizing(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		capacity int64
		inMemory bool
		vlog     int64
		mem      int64
	}{
		{16 * mib, false, 1 * mib, 1 * mib},   // the floors
		{64 * mib, false, 4 * mib, 2 * mib},   // capacity/16 and /32
		{512 * mib, false, 32 * mib, 8 * mib}, // memtables at their ceiling
		{64 * mib, true, 4 * mib, 8 * mib},    // in memory: 8 MiB memtables always
		{64 << 30, true, 1<<30 - 1, 8 * mib},  // the value log's ceiling
	} {
		cfg := Config{Capacity: c.capacity, InMemory: c.inMemory, GCInterval: time.Hour}
		if !c.inMemory {
			cfg.Dir = t.TempDir()
		}
		s := mustOpen(t, cfg)
		if got := s.db.Opts().ValueLogFileSize; got != c.vlog {
			t.Errorf("capacity %d MiB: value-log files of %d, want %d", c.capacity>>20, got, c.vlog)
		}
		if got := s.db.Opts().MemTableSize; got != c.mem {
			t.Errorf("capacity %d MiB: memtables of %d, want %d", c.capacity>>20, got, c.mem)
		}
		if want := 2*c.vlog + 2*c.mem + 16*mib; s.cfg.MinFree != want {
			t.Errorf("capacity %d MiB: MinFree %d, want %d", c.capacity>>20, s.cfg.MinFree, want)
		}
		if want := c.capacity - (2*c.vlog + 2*c.mem + mib) - c.capacity/32; s.Stats().Capacity != want {
			t.Errorf("capacity %d MiB: data capacity %d, want %d", c.capacity>>20, s.Stats().Capacity, want)
		}
		if s.cfg.Segments != 16 || s.cfg.QueueBytes != 64*mib || s.cfg.GCInterval != time.Hour {
			t.Errorf("defaults filled in: %+v", s.cfg)
		}
	}
	// Given values are kept; zero and negative ones get the defaults.
	s := mustOpen(t, Config{Capacity: 64 * mib, InMemory: true, MinFree: 12345, Segments: 5, QueueBytes: 7, GCInterval: time.Minute})
	if s.cfg.MinFree != 12345 || s.cfg.Segments != 5 || s.cfg.QueueBytes != 7 || s.cfg.GCInterval != time.Minute {
		t.Errorf("given values replaced: %+v", s.cfg)
	}
	s = mustOpen(t, Config{Capacity: 64 * mib, InMemory: true, MinFree: -1, Segments: -1, QueueBytes: -1, GCInterval: -1})
	if s.cfg.Segments != 16 || s.cfg.QueueBytes != 64*mib || s.cfg.GCInterval != 10*time.Second || s.cfg.MinFree <= 0 {
		t.Errorf("negative values kept: %+v", s.cfg)
	}
}

func TestOpenCapacityBounds(t *testing.T) {
	if _, err := Open(Config{Capacity: 16<<20 - 1, Dir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "least of 16 MiB") {
		t.Errorf("16 MiB less a byte: %v", err)
	}
	for _, c := range []int64{0, -1} {
		if _, err := Open(Config{Capacity: c, InMemory: true}); err == nil || !strings.Contains(err.Error(), "must be positive") {
			t.Errorf("capacity %d: %v", c, err)
		}
	}
	mustOpen(t, Config{Capacity: 16 << 20, Dir: t.TempDir()})
	// In memory, 16 MiB is all memtables: refused, not a store whose
	// maintenance evicts for ever (and whose Close then never returns).
	if _, err := Open(Config{Capacity: 16 << 20, InMemory: true}); err == nil || !strings.Contains(err.Error(), "no room for data") {
		t.Errorf("16 MiB in memory: %v, want a refusal", err)
	}
	if _, err := Open(Config{Capacity: 16 << 20}); err == nil || !strings.Contains(err.Error(), "no directory") {
		t.Errorf("no directory: %v", err)
	}
}

// TestOpenMakesDirAbsolute: pageOut matches mappings by absolute path.
func TestOpenMakesDirAbsolute(t *testing.T) {
	t.Chdir(t.TempDir())
	s := mustOpen(t, Config{Dir: "cache", Capacity: 16 << 20})
	if !filepath.IsAbs(s.cfg.Dir) || filepath.Base(s.cfg.Dir) != "cache" {
		t.Fatalf("Dir %q, want an absolute path", s.cfg.Dir)
	}
	mem := mustOpen(t, Config{Capacity: 64 << 20, InMemory: true})
	if mem.cfg.Dir != "" {
		t.Fatalf("an in-memory store got the directory %q", mem.cfg.Dir)
	}
}

// TestOpenFreeSpaceFloor: a store opens with at least half of MinFree
// free, and refuses under it.
func TestOpenFreeSpaceFloor(t *testing.T) {
	dir := t.TempDir()
	free, err := freeSpace(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Config{Dir: filepath.Join(dir, "a"), Capacity: 16 << 20, MinFree: 4*free + 1<<30}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("MinFree of four times the free space: %v, want ErrNoSpace", err)
	}
	// MinFree the free space itself: half of it is free with room to spare.
	mustOpen(t, Config{Dir: filepath.Join(dir, "b"), Capacity: 16 << 20, MinFree: free})
}

// TestReopenStartsANewSegment: blocks written after a reopen never go
// into a segment of the earlier run; an empty store starts at segment 0.
func TestReopenStartsANewSegment(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.cur != 0 {
		t.Fatalf("an empty store starts at segment %d", s.cur)
	}
	store(t, s, "k", block(5000, 1))
	seg := s.index["k"].seg
	s.Close()
	again := mustOpen(t, cfg)
	again.mu.Lock()
	cur := again.cur
	again.mu.Unlock()
	if cur != seg+1 {
		t.Fatalf("after a reopen the store writes segment %d, want %d (one past the last loaded)", cur, seg+1)
	}
}

func TestKeyAndValueAtTheirMinimum(t *testing.T) {
	k := dbKey(meta{seg: 7, len: 9}, "")
	if len(k) != 9 {
		t.Fatalf("dbKey of an empty key: %d bytes", len(k))
	}
	if m, key, ok := parseKey(k); !ok || key != "" || m != (meta{seg: 7, len: 9}) {
		t.Fatalf("parseKey(%x) = %+v, %q, %v", k, m, key, ok)
	}
	if _, _, ok := parseKey(k[:8]); ok {
		t.Fatal("an 8-byte key parsed")
	}
	empty := Block{Tag: 5, Sum: integrity.Sum(5, nil)}
	v := encode(empty)
	if len(v) != headerSize {
		t.Fatalf("an empty block encodes to %d bytes", len(v))
	}
	if b, err := decode(v); err != nil || len(b.Data) != 0 || b.Tag != 5 {
		t.Fatalf("decode of an empty block: %+v, %v", b, err)
	}
	if _, err := decode(v[:headerSize-1]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("decode of 31 bytes: %v", err)
	}
}

// TestAging: a block is aging, and rewritten on a hit, from the oldest
// quarter of the segments: cur − seg ≥ max(Segments·3/4, 1).
func TestAging(t *testing.T) {
	for _, c := range []struct {
		segments int
		age      uint32 // the smallest cur − seg that is aging
	}{{16, 12}, {4, 3}, {2, 1}, {1, 1}} {
		s, _ := bare(t, Config{Segments: c.segments}, 1<<20, false)
		s.cur = 100
		if !s.aging(100 - c.age) {
			t.Errorf("%d segments: age %d is not aging", c.segments, c.age)
		}
		if s.aging(100 - c.age + 1) {
			t.Errorf("%d segments: age %d is aging", c.segments, c.age-1)
		}
	}
}

// TestPutSizeLimits: a block up to a segment's share of the data capacity
// is queued; a larger one is not (and an in-memory value up to 1 MiB less
// 1 KiB).
func TestPutSizeLimits(t *testing.T) {
	s, _ := bare(t, Config{Segments: 4, QueueBytes: 1 << 30}, 4000, false)
	if err := s.put("fits", Block{Data: make([]byte, 1000)}, false); err != nil || len(s.queue) != 1 {
		t.Fatalf("a block of a segment's share: %v, queued %d", err, len(s.queue))
	}
	if err := s.put("over", Block{Data: make([]byte, 1001)}, false); err != nil || len(s.queue) != 1 {
		t.Fatalf("a block over a segment's share: %v, queued %d", err, len(s.queue))
	}
	m, _ := bare(t, Config{Segments: 1, QueueBytes: 1 << 30, InMemory: true}, 1<<30, false)
	if err := m.put("fits", Block{Data: make([]byte, 1<<20-1<<10)}, false); err != nil || len(m.queue) != 1 {
		t.Fatalf("an in-memory value of 1 MiB - 1 KiB: %v, queued %d", err, len(m.queue))
	}
	if err := m.put("over", Block{Data: make([]byte, 1<<20-1<<10+1)}, false); err != nil || len(m.queue) != 1 {
		t.Fatalf("an in-memory value past 1 MiB - 1 KiB: %v, queued %d", err, len(m.queue))
	}
}

// TestPutQueueBound: Puts are queued up to QueueBytes exactly; past it they
// are dropped (counted), and a dropped Put leaves no bytes pending.
func TestPutQueueBound(t *testing.T) {
	s, _ := bare(t, Config{Segments: 1, QueueBytes: 3000}, 1<<30, false)
	if err := s.put("a", Block{Data: make([]byte, 3000)}, false); err != nil {
		t.Fatalf("a Put of exactly QueueBytes: %v", err)
	}
	if err := s.put("b", Block{Data: make([]byte, 1)}, false); !errors.Is(err, ErrBusy) {
		t.Fatalf("a Put past QueueBytes: %v, want ErrBusy", err)
	}
	if s.pending.Load() != 3000 || s.Stats().Dropped != 1 {
		t.Fatalf("after a dropped Put: %d bytes pending, %d dropped; want 3000 and 1", s.pending.Load(), s.Stats().Dropped)
	}
	<-s.queue
	s.pending.Add(-3000) // as the writer does once it committed "a"
	if err := s.put("c", Block{Data: make([]byte, 3000)}, false); err != nil {
		t.Fatalf("a Put once the queue drained: %v", err)
	}
	s.closed = true
	if err := s.put("d", Block{Data: make([]byte, 1)}, false); !errors.Is(err, ErrClosed) {
		t.Fatalf("a Put after Close: %v", err)
	}
}

// TestQuietOperation: writing, reading and deleting log no warnings when
// nothing fails (TestEvictOldest checks eviction's).
func TestQuietOperation(t *testing.T) {
	rec := &recorder{}
	cfg := testConfig(t.TempDir())
	cfg.Logger = slog.New(rec)
	s := mustOpen(t, cfg)
	for i := 0; i < 20; i++ {
		store(t, s, strconv.Itoa(i), block(4000+i, byte(i)))
	}
	if _, ok, err := s.Get("3", tagOf(4003)); !ok || err != nil {
		t.Fatalf("Get: %v, %v", ok, err)
	}
	s.Delete("3")
	s.Delete("no such key")
	if w := rec.warnings(); len(w) != 0 {
		t.Fatalf("warnings with nothing wrong: %q", w)
	}
}

// TestSegmentCloses: a segment closes when its data reaches its share of
// the data capacity exactly.
func TestSegmentCloses(t *testing.T) {
	s, _ := bare(t, Config{Segments: 4, InMemory: true, QueueBytes: 1 << 30}, 4000, true)
	s.commit([]put{{key: "a", b: block(999, 1)}})
	if s.cur != 0 {
		t.Fatalf("a segment of 999 of 1000 bytes closed: cur %d", s.cur)
	}
	s.commit([]put{{key: "b", b: block(1, 2)}})
	if s.cur != 1 {
		t.Fatalf("a segment of exactly 1000 bytes is still open: cur %d", s.cur)
	}
	if s.bytes != 1000 || s.segBytes[0] != 1000 || s.index["b"] != (meta{seg: 0, len: 1}) {
		t.Fatalf("after two commits: %d bytes, segment 0 %d, b %+v", s.bytes, s.segBytes[0], s.index["b"])
	}
}

// TestFullDiskKeepsCopiesOnly: at the disk bound a batch writes only the
// copies of blocks the store holds; the fresh ones are dropped, counted,
// and the room they asked for (data and header) is noted for maintenance.
func TestFullDiskKeepsCopiesOnly(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "filler"), make([]byte, 64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	s, _ := bare(t, Config{Dir: dir, Segments: 1, Capacity: 1000, QueueBytes: 1 << 30}, 1<<30, true)
	s.pending.Add(2 * 1000) // the two Puts' bytes, which commit releases
	s.commit([]put{{key: "copy", b: block(1000, 1), keep: true}, {key: "fresh", b: block(1000, 2)}})
	if _, ok := s.index["copy"]; !ok {
		t.Error("the copy was not written at the disk bound")
	}
	if _, ok := s.index["fresh"]; ok {
		t.Error("a fresh block was written past the disk bound")
	}
	if s.dropped != 1 {
		t.Errorf("%d dropped, want 1", s.dropped)
	}
	if got := s.room.Load(); got != 1000+headerSize {
		t.Errorf("room asked for %d, want the fresh block's %d", got, 1000+headerSize)
	}
	if s.pending.Load() != 0 {
		t.Errorf("%d bytes still pending", s.pending.Load())
	}
	if !s.low.Load() {
		t.Error("writing not marked stopped")
	}
}

// TestSpaceBounds pins lowSpace's and overDisk's comparisons at their
// boundaries (the store's files are static: a plain file in a private
// directory).
func TestSpaceBounds(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), make([]byte, 10000), 0o600); err != nil {
		t.Fatal(err)
	}
	disk := diskUsage(dir)
	s, _ := bare(t, Config{Dir: dir, Capacity: disk + 500}, 1<<30, false)
	if low, full := s.lowSpace(0, 500); low || full {
		t.Fatalf("files plus a fresh write exactly at Capacity: low %v, full %v", low, full)
	}
	if s.room.Load() != 0 {
		t.Fatalf("room %d with nothing dropped", s.room.Load())
	}
	if _, full := s.lowSpace(0, 501); !full || s.room.Load() != 501 {
		t.Fatalf("one byte past Capacity: full %v, room %d", full, s.room.Load())
	}
	s.room.Store(500)
	if s.overDisk() {
		t.Fatal("files and room exactly at Capacity count as over")
	}
	s.room.Store(501)
	if !s.overDisk() {
		t.Fatal("files and room one byte past Capacity do not count as over")
	}
	s.cfg.MinFree = 0
	if low, _ := s.lowSpace(0, 0); low {
		t.Fatal("low with no floor")
	}
	s.cfg.MinFree = math.MaxInt64 / 2
	if low, _ := s.lowSpace(0, 0); !low {
		t.Fatal("not low under a floor above all free space")
	}
	m, _ := bare(t, Config{InMemory: true, Capacity: 1, MinFree: math.MaxInt64 / 2}, 1<<30, false)
	if low, full := m.lowSpace(1<<40, 1<<40); low || full || m.overDisk() {
		t.Fatal("an in-memory store is short of disk")
	}
}

// TestTrim: traffic wakes maintenance at TrimBytes exactly, and trim pages
// out (and starts counting again) from TrimBytes on, never before, never
// in memory or with trimming off.
func TestTrim(t *testing.T) {
	s, _ := bare(t, Config{Dir: t.TempDir(), TrimBytes: 100}, 1<<30, false)
	s.noteTraffic(99)
	if len(s.kick) != 0 {
		t.Fatal("99 of 100 bytes woke maintenance")
	}
	s.noteTraffic(1)
	if len(s.kick) != 1 {
		t.Fatal("100 of 100 bytes did not wake maintenance")
	}
	<-s.kick
	s.traffic.Store(99)
	s.trim()
	if s.traffic.Load() != 99 {
		t.Fatal("trimmed below TrimBytes")
	}
	s.traffic.Store(100)
	s.trim()
	if s.traffic.Load() != 0 {
		t.Fatal("not trimmed at TrimBytes")
	}
	off, _ := bare(t, Config{Dir: t.TempDir(), TrimBytes: 0}, 1<<30, false)
	off.noteTraffic(1 << 40)
	off.traffic.Store(1 << 40)
	off.trim()
	if len(off.kick) != 0 || off.traffic.Load() != 1<<40 {
		t.Fatal("trimming off, yet maintenance woken or traffic reset")
	}
	mem, _ := bare(t, Config{InMemory: true, TrimBytes: 100}, 1<<30, false)
	mem.traffic.Store(1000)
	mem.trim()
	if mem.traffic.Load() != 1000 {
		t.Fatal("an in-memory store trimmed")
	}
}

// TestEvictOldest pins when a segment is dropped and which.
func TestEvictOldest(t *testing.T) {
	setup := func(bytes, dataCap int64, segs ...uint32) (*Store, *recorder) {
		s, rec := bare(t, Config{Segments: 4, InMemory: true}, dataCap, true)
		for i, seg := range segs {
			k := strconv.Itoa(i)
			s.index[k] = meta{seg: seg, len: 10}
			s.segBytes[seg] += 10
			s.cur = max(s.cur, seg)
		}
		s.bytes = bytes
		checkInvariant(t, s)
		return s, rec
	}
	s, _ := setup(30, 30, 3, 5, 7)
	if s.evictOldest(false) {
		t.Fatal("evicted at exactly the data capacity")
	}
	s, rec := setup(30, 29, 3, 5, 7)
	if !s.evictOldest(false) {
		t.Fatal("nothing evicted one byte over the data capacity")
	}
	checkInvariant(t, s)
	if _, ok := s.segBytes[3]; ok || len(s.index) != 2 || s.bytes != 20 || s.cur != 7 || s.Stats().Evicted != 1 {
		t.Fatalf("after evicting segment 3: segments %v, %d entries, %d bytes, cur %d, %d evicted", s.segBytes, len(s.index), s.bytes, s.cur, s.Stats().Evicted)
	}
	if w := rec.warnings(); len(w) != 0 {
		t.Fatalf("warnings: %q", w)
	}
	// Forced: only while more than the open segment holds data.
	s, _ = setup(20, 1000, 3, 7)
	if !s.evictOldest(true) {
		t.Fatal("a forced eviction with two segments did nothing")
	}
	if s.evictOldest(true) {
		t.Fatal("a forced eviction dropped the open segment, the only one left")
	}
	checkInvariant(t, s)
	// Everything in the open segment: it is closed, then dropped.
	s, _ = setup(20, 10, 7, 7)
	if !s.evictOldest(false) || s.cur != 8 || len(s.index) != 0 {
		t.Fatalf("evicting the open segment: cur %d, %d entries left", s.cur, len(s.index))
	}
	checkInvariant(t, s)
}

// TestKeepPlanned: of a dropped segment, the planned blocks needed soonest
// are copied out, up to half a segment's share of the data capacity,
// exactly.
func TestKeepPlanned(t *testing.T) {
	next := map[uint64]int64{1: 1, 2: 5, 3: 9, 4: math.MaxInt64}
	cfg := Config{Segments: 2, InMemory: true, QueueBytes: 1 << 30, NextUse: func(id uint64) int64 { return next[id] }}
	s, _ := bare(t, cfg, 4*300, true) // half a segment: 300 bytes
	s.keepPlanned(victims(t, s, map[string]meta{"latest": {0, 150, 3}, "unplanned": {0, 150, 4}, "soon": {0, 150, 1}, "later": {0, 150, 2}}))
	var kept []string
	for _, p := range drain(s) {
		if !p.keep {
			t.Errorf("%s queued as a fresh block", p.key)
		}
		kept = append(kept, p.key)
	}
	if strings.Join(kept, ",") != "soon,later" || s.Stats().Kept != 2 {
		t.Fatalf("kept %v (%d counted), want soon and later: 300 bytes, the budget exactly", kept, s.Stats().Kept)
	}
}

// TestGarbage: value-log GC runs when the files exceed the data by a
// quarter plus min(64 MiB, Capacity/8), not at that exactly.
func TestGarbage(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "vlog"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	d := diskUsage(dir)
	s, _ := bare(t, Config{Dir: dir, Capacity: 8 * (d - 5000)}, 1<<30, false)
	s.bytes = 4000 // threshold: 4000 + 1000 + (d - 5000) = d
	if s.garbage() {
		t.Fatal("garbage at exactly the threshold")
	}
	s.cfg.Capacity = 8 * (d - 5001)
	if !s.garbage() {
		t.Fatal("no garbage one byte past the threshold")
	}
	s.cfg.Capacity = 1 << 40 // the 64 MiB cap applies: d is far below it
	if s.garbage() {
		t.Fatal("garbage under a 64 MiB allowance")
	}
	m, _ := bare(t, Config{InMemory: true, Capacity: 1}, 1<<30, false)
	if m.garbage() {
		t.Fatal("an in-memory store has garbage")
	}
}

func TestDiskUsage(t *testing.T) {
	dir := t.TempDir()
	var want int64
	for i, n := range []int{1, 5000, 100_000} {
		p := filepath.Join(dir, strconv.Itoa(i))
		if err := os.WriteFile(p, make([]byte, n), 0o600); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		want += fi.Sys().(*syscall.Stat_t).Blocks * 512
	}
	if got := diskUsage(dir); got != want || got < 100_000 {
		t.Fatalf("diskUsage = %d, want %d", got, want)
	}
	if got := diskUsage(filepath.Join(dir, "absent")); got != 0 {
		t.Fatalf("diskUsage of a missing directory = %d", got)
	}
}

// vlogMappings sums the sizes and resident bytes of this process's
// mappings of .vlog files under dir, from /proc/self/smaps.
func vlogMappings(t *testing.T, dir string) (size, rss int64) {
	t.Helper()
	return mappings(t, func(path string) bool { return strings.HasPrefix(path, dir+"/") && strings.HasSuffix(path, ".vlog") })
}

// mappings sums the sizes and resident bytes of this process's mappings
// of the files whose paths match, from /proc/self/smaps.
func mappings(t *testing.T, match func(path string) bool) (size, rss int64) {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if strings.Contains(fields[0], "-") && len(fields) >= 5 && !strings.HasSuffix(fields[0], ":") {
			path := ""
			if len(fields) >= 6 {
				path = fields[5]
			}
			in = match(path)
			if in {
				lo, hi, _ := strings.Cut(fields[0], "-")
				a, _ := strconv.ParseUint(lo, 16, 64)
				b, _ := strconv.ParseUint(hi, 16, 64)
				size += int64(b - a)
			}
			continue
		}
		if in && fields[0] == "Rss:" {
			kb, _ := strconv.ParseInt(fields[1], 10, 64)
			rss += kb << 10
		}
	}
	return size, rss
}

// TestPageOut: pageOut advises exactly the store's value-log mappings
// (not another store's whose directory shares a prefix), and they leave
// the process's resident set, though their pages were dirty.
func TestPageOut(t *testing.T) {
	root := t.TempDir()
	dir, sibling := filepath.Join(root, "c"), filepath.Join(root, "c2")
	open := func(d string) *Store {
		cfg := testConfig(d)
		cfg.TrimBytes = 0 // no page-out but this test's
		cfg.GCInterval = time.Hour
		return mustOpen(t, cfg)
	}
	s, other := open(dir), open(sibling)
	for i := 0; i < 40; i++ {
		store(t, s, strconv.Itoa(i), block(100_000, byte(i)))
		store(t, other, strconv.Itoa(i), block(2000, byte(i)))
	}
	size, before := vlogMappings(t, dir)
	if size == 0 {
		t.Skip("Badger has no value-log mapping here")
	}
	got, err := pageOut(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got != size {
		t.Fatalf("pageOut advised %d bytes, want %d: the mappings of %s's value logs", got, size, dir)
	}
	if n, err := pageOut(dir + "/"); err != nil || n != size {
		t.Fatalf("pageOut of the directory with a trailing slash: %d, %v", n, err)
	}
	_, after := vlogMappings(t, dir)
	t.Logf("value-log mappings: %d bytes, %d resident before the page-out, %d after", size, before, after)
	if before > 1<<20 && after > before/2 {
		t.Fatalf("resident bytes of the value logs: %d before, %d after a page-out", before, after)
	}
	if n, err := pageOut(filepath.Join(root, "none")); err != nil || n != 0 {
		t.Fatalf("pageOut of a directory with no mappings: %d, %v", n, err)
	}
}

// TestNoRoomForDataAtZero: a capacity whose data share is exactly zero is
// refused too.
func TestNoRoomForDataAtZero(t *testing.T) {
	share := func(c int64) int64 {
		vlog := min(max(c/16, 1<<20), 1<<30-1)
		return c - (2*vlog + 2*(8<<20) + 1<<20) - c/32
	}
	c := int64(16 << 20)
	for share(c) < 0 {
		c++
	}
	if share(c) != 0 {
		t.Skipf("no capacity leaves exactly 0 bytes of data in memory (the first with room leaves %d)", share(c))
	}
	if _, err := Open(Config{Capacity: c, InMemory: true}); err == nil || !strings.Contains(err.Error(), "no room for data") {
		t.Fatalf("capacity %d (0 bytes of data): %v, want a refusal", c, err)
	}
	mustOpen(t, Config{Capacity: c + 64, InMemory: true})
}

// TestCommitCountsTraffic: a commit counts each block's data and header
// towards the next page-out.
func TestCommitCountsTraffic(t *testing.T) {
	s, _ := bare(t, Config{Segments: 1, InMemory: true, QueueBytes: 1 << 30, TrimBytes: 1000 + headerSize}, 1<<30, true)
	s.commit([]put{{key: "a", b: block(999, 1)}})
	if len(s.kick) != 0 || s.traffic.Load() != 999+headerSize {
		t.Fatalf("traffic %d after a block of 999 bytes, kick %d", s.traffic.Load(), len(s.kick))
	}
	s.traffic.Store(0)
	s.commit([]put{{key: "b", b: block(1000, 2)}})
	if len(s.kick) != 1 {
		t.Fatalf("a block of 1000 bytes and its header (%d bytes of TrimBytes) did not wake maintenance", s.traffic.Load())
	}
}

// TestRewriteDeletesTheOldCopy: a block written again into a newer
// segment loses its copy in the older one, which a reopen would count
// again.
func TestRewriteDeletesTheOldCopy(t *testing.T) {
	s, _ := bare(t, Config{Segments: 4, InMemory: true, QueueBytes: 1 << 30}, 4000, true)
	s.commit([]put{{key: "k", b: block(100, 1)}, {key: "j", b: block(50, 1)}})
	s.commit([]put{{key: "filler", b: block(850, 2)}}) // closes segment 0
	s.commit([]put{{key: "k", b: block(100, 3)}, {key: "j", b: block(50, 3)}})
	checkInvariant(t, s)
	if s.index["k"].seg != 1 || s.index["j"].seg != 1 {
		t.Fatalf("the rewrites went to segments %d and %d, want 1", s.index["k"].seg, s.index["j"].seg)
	}
	for _, old := range []struct {
		key string
		len uint32
	}{{"k", 100}, {"j", 50}} {
		err := s.db.View(func(txn *badger.Txn) error {
			_, err := txn.Get(dbKey(meta{seg: 0, len: old.len}, old.key))
			return err
		})
		if !errors.Is(err, badger.ErrKeyNotFound) {
			t.Fatalf("the old copy of %s in segment 0: %v, want deleted", old.key, err)
		}
	}
	if s.bytes != 1000 || s.segBytes[0] != 850 || s.segBytes[1] != 150 {
		t.Fatalf("%d bytes, segments %v; want 1000, 850 and 150", s.bytes, s.segBytes)
	}
}

// TestSpaceLogsTransitions: stopping and resuming writes are logged once
// each, not on every write in between.
func TestSpaceLogsTransitions(t *testing.T) {
	dir := t.TempDir()
	s, rec := bare(t, Config{Dir: dir, Capacity: 1 << 40}, 1<<30, false)
	s.lowSpace(0, 0)
	s.lowSpace(0, 1<<41) // full
	s.lowSpace(0, 1<<41)
	s.lowSpace(0, 0) // room again
	s.lowSpace(0, 0)
	rec.mu.Lock()
	got := strings.Join(rec.recs, "; ")
	rec.mu.Unlock()
	if want := "WARN ssdstore: not caching on the SSD until there is room; INFO ssdstore: caching on the SSD again"; got != want {
		t.Fatalf("logs %q, want %q", got, want)
	}
}

// TestTrimQuiet: a page-out that works logs nothing.
func TestTrimQuiet(t *testing.T) {
	s, rec := bare(t, Config{Dir: t.TempDir(), TrimBytes: 1}, 1<<30, false)
	s.traffic.Store(1)
	s.trim()
	if w := rec.warnings(); len(w) != 0 {
		t.Fatalf("warnings: %q", w)
	}
}

// TestCheckTableLeavesNoTrace: checking a damaged table, whether Badger
// returns an error or panics on it, leaves the file as it was and no
// mapping or descriptor of it behind.
func TestCheckTableLeavesNoTrace(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cache")
	cfg := testConfig(dir)
	fill(t, cfg, 50)
	tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	if len(tables) == 0 {
		t.Fatal("no table written")
	}
	good, err := os.ReadFile(tables[0])
	if err != nil {
		t.Fatal(err)
	}
	for name, damaged := range map[string][]byte{
		"truncated":     good[:len(good)/2],
		"tail garbled":  append(append([]byte(nil), good[:len(good)-8]...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff),
		"one byte":      {1},
		"a garbled end": append(append([]byte(nil), good[:len(good)-64]...), make([]byte, 64)...),
	} {
		p := filepath.Join(t.TempDir(), "000001.sst")
		if err := os.WriteFile(p, damaged, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := checkTable(p); err == nil {
			t.Errorf("%s: a damaged table checked as good", name)
			continue
		}
		if fi, err := os.Stat(p); err != nil || fi.Size() != int64(len(damaged)) {
			t.Errorf("%s: the table is %v bytes after the check, was %d (%v)", name, fi.Size(), len(damaged), err)
		}
		maps, _ := os.ReadFile("/proc/self/maps")
		if strings.Contains(string(maps), p) {
			t.Errorf("%s: the table is still mapped after the check", name)
		}
		if fds := openOn(t, p); fds != 0 {
			t.Errorf("%s: %d descriptors of the table still open after the check", name, fds)
		}
	}
}

// openOn counts this process's open descriptors of the file at path.
func openOn(t *testing.T, path string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && target == path {
			n++
		}
	}
	return n
}

// quietFS is the root of a filesystem of its own (a tmpfs of 64 MiB, the
// mount detached at once and reached through a descriptor, so that none
// is left behind): its free space moves only with the test's own writes.
func quietFS(t *testing.T) string {
	t.Helper()
	mnt := t.TempDir()
	if err := syscall.Mount("none", mnt, "tmpfs", 0, "size=64m"); err != nil {
		t.Skipf("cannot mount a tmpfs (needs root): %v", err)
	}
	d, err := os.Open(mnt)
	unmountErr := syscall.Unmount(mnt, syscall.MNT_DETACH)
	if err != nil || unmountErr != nil {
		t.Fatal(err, unmountErr)
	}
	t.Cleanup(func() { d.Close() })
	return filepath.Join("/proc/self/fd", strconv.Itoa(int(d.Fd())))
}

// TestFreeSpaceFloorExact: Open refuses a directory with less than half
// of MinFree free, to the byte; a write is refused when it would leave
// less than MinFree free, to the byte.
func TestFreeSpaceFloorExact(t *testing.T) {
	root := quietFS(t)
	free, err := freeSpace(root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Config{Dir: filepath.Join(root, "a"), Capacity: 16 << 20, MinFree: 2*free + 2}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("%d bytes free under a MinFree of twice that and 2: %v, want ErrNoSpace", free, err)
	}
	if now, _ := freeSpace(root); now != free {
		t.Fatalf("the refused Open took %d bytes", free-now)
	}
	s := mustOpen(t, Config{Dir: filepath.Join(root, "b"), Capacity: 16 << 20, MinFree: 2 * free})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	dir := filepath.Join(root, "c")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	free, err = freeSpace(dir)
	if err != nil {
		t.Fatal(err)
	}
	const n = 10_000
	b, _ := bare(t, Config{Dir: dir, Capacity: 1 << 40, MinFree: free - n}, 1<<30, false)
	if low, _ := b.lowSpace(n, n); low {
		t.Errorf("a write of %d bytes leaving exactly MinFree free refused", n)
	}
	b.cfg.MinFree++
	if low, _ := b.lowSpace(n, n); !low {
		t.Errorf("a write of %d bytes leaving a byte under MinFree taken", n)
	}
}

// pageOutStore opens a store in a new directory that pages out only when
// a test calls pageOut, and commits 2 MB to its value log (half a file:
// none is finished, and so none synced, by Badger).
func pageOutStore(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "c")
	cfg := testConfig(dir)
	cfg.TrimBytes = 0
	cfg.GCInterval = time.Hour
	s := mustOpen(t, cfg)
	for i := range 20 {
		store(t, s, strconv.Itoa(i), block(100_000, byte(i)))
	}
	return dir
}

// inPageCache counts the bytes of the file at path in the page cache
// (mincore over a mapping of this test's own, never touched).
func inPageCache(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return 0
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	page := int64(os.Getpagesize())
	vec := make([]byte, (fi.Size()+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Skipf("mincore: %v", errno)
	}
	var n int64
	for _, v := range vec {
		n += int64(v & 1)
	}
	return n * page
}

// TestPageOutLeavesPageCache: pageOut writes the value logs back before
// it advises them, so that their pages, dirty until then, leave the page
// cache too, not only the process's resident set (the kernel reclaims no
// dirty page on MADV_PAGEOUT).
func TestPageOutLeavesPageCache(t *testing.T) {
	dir := pageOutStore(t)
	vlogs, _ := filepath.Glob(filepath.Join(dir, "*.vlog"))
	cached := func() (n int64) {
		for _, v := range vlogs {
			n += inPageCache(t, v)
		}
		return n
	}
	before := cached()
	if _, err := pageOut(dir); err != nil {
		t.Fatal(err)
	}
	after := cached()
	t.Logf("value logs in the page cache: %d bytes before the page-out, %d after", before, after)
	// Pages the process never mapped may stay; the 2 MB written through
	// the mapping must go.
	if before-after < 1<<20 {
		t.Errorf("value logs in the page cache: %d bytes before the page-out, %d after: the pages written stayed", before, after)
	}
}

// TestPageOutSparesOtherMappings: pageOut advises the value logs'
// mappings and nothing else: files the process mapped before the store
// opened and after, and Badger's other files, keep their resident pages.
func TestPageOutSparesOtherMappings(t *testing.T) {
	scratch := t.TempDir()
	const size = 1 << 20
	mapFile := func(name string) string {
		p := filepath.Join(scratch, name)
		if err := os.WriteFile(p, bytes.Repeat([]byte{1}, size), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Munmap(m); f.Close() })
		sum := 0
		for i := 0; i < size; i += os.Getpagesize() {
			sum += int(m[i]) // brings the page in
		}
		if sum != size/os.Getpagesize() {
			t.Fatalf("read %d from %s", sum, p)
		}
		return p
	}
	before := mapFile("before")
	dir := pageOutStore(t)
	after := mapFile("after")
	// Badger's other files (its memtable, its discard stats) are mapped
	// too, before the value log: they stay resident as well.
	others := func(path string) bool { return strings.HasPrefix(path, dir+"/") && !strings.HasSuffix(path, ".vlog") }
	_, badgerRSS := mappings(t, others)
	if _, err := pageOut(dir); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{before, after} {
		if _, rss := mappings(t, func(path string) bool { return path == p }); rss < size {
			t.Errorf("a mapping of %s, not the store's: %d of %d bytes resident after the store's page-out", filepath.Base(p), rss, size)
		}
	}
	if _, rss := mappings(t, others); rss < badgerRSS {
		t.Errorf("Badger's mappings other than value logs: %d bytes resident after the page-out, %d before", rss, badgerRSS)
	}
}
