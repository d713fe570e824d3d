package ssdstore

import (
	"fmt"
	"testing"

	badger "github.com/dgraph-io/badger/v4"
)

// checkInvariant checks the INVARIANT of Store's fields under mu: bytes
// is the sum of the indexed lengths, segBytes[s] the sum of those in
// segment s (a segment missing from segBytes holds none), and no entry
// lies in a segment past the current one.
func (s *Store) checkInvariant() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var total int64
	segs := map[uint32]int64{}
	for k, m := range s.index {
		if m.seg > s.cur {
			return fmt.Errorf("entry %q: %+v (current segment %d)", k, m, s.cur)
		}
		total += int64(m.len)
		segs[m.seg] += int64(m.len)
	}
	if total != s.bytes {
		return fmt.Errorf("bytes %d, the index holds %d", s.bytes, total)
	}
	for seg, n := range s.segBytes {
		if n != segs[seg] {
			return fmt.Errorf("segment %d counts %d bytes, its entries hold %d", seg, n, segs[seg])
		}
	}
	for seg, n := range segs {
		if _, ok := s.segBytes[seg]; !ok && n != 0 {
			return fmt.Errorf("segment %d holds %d bytes and is not counted", seg, n)
		}
	}
	return nil
}

// checkPersisted checks that every index entry's key, ID and length
// included, is in Badger: what a reopen rebuilds the index from. Writers
// put a key in Badger before the index, and take it out of the index
// before Badger, so this holds under mu at any time; but a read of every
// key under mu among the writes of TestCapacityReclaimsDisk made it miss
// its disk bound (4 runs of 4), so the tests check it at rest.
func (s *Store) checkPersisted() error {
	s.closeMu.RLock() // before mu, as Puts take them
	defer s.closeMu.RUnlock()
	if s.closed {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	keys, err := dbKeys(s.db)
	if err != nil {
		return err
	}
	stored := make(map[string]bool, len(keys))
	for _, k := range keys {
		stored[string(k)] = true
	}
	for k, m := range s.index {
		if !stored[string(dbKey(m, k))] {
			return fmt.Errorf("entry %q %+v: its key %q is not in Badger", k, m, dbKey(m, k))
		}
	}
	return nil
}

// dbKeys returns the keys in db, in order.
func dbKeys(db *badger.DB) ([][]byte, error) {
	var keys [][]byte
	err := db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.PrefetchValues = false
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			keys = append(keys, it.Item().KeyCopy(nil))
		}
		return nil
	})
	return keys, err
}

// checkInvariant fails t if s's invariant does not hold.
func checkInvariant(t testing.TB, s *Store) {
	t.Helper()
	if err := s.checkInvariant(); err != nil {
		t.Fatalf("INVARIANT broken: %v", err)
	}
}

// checkPersisted fails t if an entry of s's index is not in Badger.
func checkPersisted(t testing.TB, s *Store) {
	t.Helper()
	if err := s.checkPersisted(); err != nil {
		t.Fatalf("INVARIANT broken: %v", err)
	}
}

// checkClosed checks s after Close: the invariant, and every queued
// Put's bytes released.
func checkClosed(t testing.TB, s *Store) {
	t.Helper()
	checkInvariant(t, s)
	if n := s.pending.Load(); n != 0 {
		t.Fatalf("INVARIANT broken: %d bytes still pending after Close", n)
	}
}

// TestCheckInvariant: the check finds each way the counts can go wrong.
func TestCheckInvariant(t *testing.T) {
	for name, c := range map[string]struct {
		index    map[string]meta
		segBytes map[uint32]int64
		bytes    int64
		cur      uint32
		ok       bool
	}{
		"consistent":        {map[string]meta{"a": {0, 10, 7}, "b": {1, 5, 0}}, map[uint32]int64{0: 10, 1: 5, 2: 0}, 15, 2, true},
		"bytes off":         {map[string]meta{"a": {0, 10, 0}}, map[uint32]int64{0: 10}, 11, 0, false},
		"segment off":       {map[string]meta{"a": {0, 10, 0}, "b": {1, 5, 0}}, map[uint32]int64{0: 15, 1: 0}, 15, 1, false},
		"segment uncounted": {map[string]meta{"a": {0, 10, 0}}, map[uint32]int64{}, 10, 0, false},
		"past the current":  {map[string]meta{"a": {3, 10, 0}}, map[uint32]int64{3: 10}, 10, 2, false},
	} {
		s := &Store{index: c.index, segBytes: c.segBytes, bytes: c.bytes, cur: c.cur}
		if err := s.checkInvariant(); (err == nil) != c.ok {
			t.Errorf("%s: %v", name, err)
		}
	}
}
