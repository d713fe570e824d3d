package ssdstore

import (
	"errors"
	"math"
	"sort"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// The maintenance goroutine: segment eviction (keeping the blocks a plan
// needs soonest), value-log GC and the page-out of Badger's mappings.

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
			s.bytes -= int64(m.len)
		}
	}
	delete(s.segBytes, oldest)
	s.evicted++
	s.mu.Unlock()
	s.keepPlanned(victims)
	s.dropMu.Lock()
	err := s.db.DropPrefix(segPrefixes(oldest)...)
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
	next := s.nextUse()
	if next == nil {
		return
	}
	type planned struct {
		keyMeta
		next int64
	}
	var keep []planned
	for _, v := range victims {
		if n := next(v); n != math.MaxInt64 {
			keep = append(keep, planned{v, n})
		}
	}
	sort.Slice(keep, func(i, j int) bool { return keep[i].next < keep[j].next })
	budget := s.dataCap / int64(s.cfg.Segments) / 2
	for _, k := range keep {
		if budget -= int64(k.m.len); budget < 0 {
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
		b, err := decode(v)
		if err != nil {
			continue
		}
		b.ID = k.m.id // the key holds it, not the value
		if s.put(k.key, b, true) == nil {
			s.mu.Lock()
			s.rewritten++
			s.mu.Unlock()
		}
	}
}

// nextUse is the oracle keepPlanned asks about a block: Config.NextUse
// by the block's ID (an unknown one is not planned); nil without one.
func (s *Store) nextUse() func(keyMeta) int64 {
	if s.cfg.NextUse == nil {
		return nil
	}
	return func(v keyMeta) int64 {
		if v.m.id == 0 {
			return math.MaxInt64
		}
		return s.cfg.NextUse(v.m.id)
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
