package ssdstore

import (
	"fmt"
	"testing"
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
		if m.len < 0 || m.seg > s.cur {
			return fmt.Errorf("entry %q: %+v (current segment %d)", k, m, s.cur)
		}
		total += m.len
		segs[m.seg] += m.len
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

// checkInvariant fails t if s's invariant does not hold.
func checkInvariant(t testing.TB, s *Store) {
	t.Helper()
	if err := s.checkInvariant(); err != nil {
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
		"consistent":        {map[string]meta{"a": {0, 10}, "b": {1, 5}}, map[uint32]int64{0: 10, 1: 5, 2: 0}, 15, 2, true},
		"bytes off":         {map[string]meta{"a": {0, 10}}, map[uint32]int64{0: 10}, 11, 0, false},
		"segment off":       {map[string]meta{"a": {0, 10}, "b": {1, 5}}, map[uint32]int64{0: 15, 1: 0}, 15, 1, false},
		"segment uncounted": {map[string]meta{"a": {0, 10}}, map[uint32]int64{}, 10, 0, false},
		"past the current":  {map[string]meta{"a": {3, 10}}, map[uint32]int64{3: 10}, 10, 2, false},
	} {
		s := &Store{index: c.index, segBytes: c.segBytes, bytes: c.bytes, cur: c.cur}
		if err := s.checkInvariant(); (err == nil) != c.ok {
			t.Errorf("%s: %v", name, err)
		}
	}
}
