package ssdstore

// Tests of the blocks' file IDs: kept in the key, rebuilt on a reopen,
// asked about on eviction, and stores written before IDs still served.

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"unsafe"

	badger "github.com/dgraph-io/badger/v4"
)

// withID is b with ID id.
func withID(b Block, id uint64) Block {
	b.ID = id
	return b
}

// keysOf returns the keys in db, in order.
func keysOf(t *testing.T, db *badger.DB) [][]byte {
	t.Helper()
	keys, err := dbKeys(db)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// oldKey is a key as stores before IDs wrote it: 's', the segment, the
// data length and the block key (spelled out here, not through dbKey).
func oldKey(seg, n uint32, key string) []byte {
	k := []byte{'s'}
	k = binary.BigEndian.AppendUint32(k, seg)
	k = binary.BigEndian.AppendUint32(k, n)
	return append(k, key...)
}

// victims writes a block under each key of ms, at its meta, into s's
// Badger (not its index, as eviction leaves them), for keepPlanned.
func victims(t *testing.T, s *Store, ms map[string]meta) []keyMeta {
	t.Helper()
	var vs []keyMeta
	for k, m := range ms {
		b := block(int(m.len), byte(len(k)))
		if err := s.db.Update(func(txn *badger.Txn) error { return txn.Set(dbKey(m, k), encode(b)) }); err != nil {
			t.Fatal(err)
		}
		vs = append(vs, keyMeta{k, m})
	}
	return vs
}

// drain returns the Puts queued for s's writer (which does not run).
func drain(s *Store) []put {
	var ps []put
	for len(s.queue) > 0 {
		ps = append(ps, <-s.queue)
	}
	return ps
}

// TestIndexEntrySize: the ID costs the index nothing per block.
func TestIndexEntrySize(t *testing.T) {
	if n := unsafe.Sizeof(meta{}); n != 16 {
		t.Fatalf("an index entry is %d bytes, want 16", n)
	}
}

func TestIDKeyForm(t *testing.T) {
	k := dbKey(meta{seg: 7, len: 9, id: 1}, "")
	if len(k) != 17 || k[0] != 'i' {
		t.Fatalf("dbKey with an ID, empty key: %q", k)
	}
	if m, key, ok := parseKey(k); !ok || key != "" || m != (meta{seg: 7, len: 9, id: 1}) {
		t.Fatalf("parseKey(%x) = %+v, %q, %v", k, m, key, ok)
	}
	if _, _, ok := parseKey(k[:16]); ok {
		t.Fatal("a 16-byte key with an ID parsed")
	}
	zero := append(append([]byte{'i'}, make([]byte, 16)...), 'x')
	if _, _, ok := parseKey(zero); ok {
		t.Fatal("an 'i' key with ID 0 parsed: dbKey writes those under 's'")
	}
	if got := dbKey(meta{seg: 3, len: 5}, "a\x000"); !bytes.Equal(got, oldKey(3, 5, "a\x000")) {
		t.Fatalf("a block of unknown ID is keyed %q, want the old form %q", got, oldKey(3, 5, "a\x000"))
	}
}

func FuzzParseKey(f *testing.F) {
	f.Add(dbKey(meta{seg: 7, len: 9}, "a\x000"))
	f.Add(dbKey(meta{seg: 7, len: 9, id: 42}, "a\x000"))
	f.Add(append([]byte{'i'}, make([]byte, 17)...))
	f.Add([]byte("s"))
	f.Fuzz(func(t *testing.T, k []byte) {
		m, key, ok := parseKey(k)
		if !ok {
			return
		}
		if !bytes.Equal(dbKey(m, key), k) {
			t.Fatalf("dbKey(parseKey(%q)) = %q", k, dbKey(m, key))
		}
		if (k[0] == 'i') != (m.id != 0) {
			t.Fatalf("%q parsed to ID %d", k, m.id)
		}
	})
}

// TestKeepPlannedByID: eviction keeps blocks by their IDs' next use,
// never asks about ID 0, and the copies keep their IDs.
func TestKeepPlannedByID(t *testing.T) {
	next := map[uint64]int64{0: 0, 3: 1, 5: 5, 9: math.MaxInt64}
	asked := map[uint64]bool{}
	cfg := Config{Segments: 2, InMemory: true, QueueBytes: 1 << 30,
		NextUse: func(id uint64) int64 { asked[id] = true; return next[id] }}
	s, _ := bare(t, cfg, 4*300, true) // half a segment: 300 bytes
	s.keepPlanned(victims(t, s, map[string]meta{"unknown": {0, 150, 0}, "soon": {0, 150, 3}, "later": {0, 150, 5}, "never": {0, 150, 9}}))
	var kept []string
	for _, p := range drain(s) {
		if want := map[string]uint64{"soon": 3, "later": 5}[p.key]; p.b.ID != want || !p.keep {
			t.Errorf("%s copied with ID %d (keep %v), want %d", p.key, p.b.ID, p.keep, want)
		}
		kept = append(kept, p.key)
	}
	if strings.Join(kept, ",") != "soon,later" {
		t.Fatalf("kept %v, want soon and later", kept)
	}
	if asked[0] {
		t.Fatal("NextUse was asked about ID 0")
	}
}

// TestIDSurvivesReopen: a block's ID is in its key, so a reopened store
// still knows it; a block of unknown ID keeps the old key form.
func TestIDSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(testConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	store(t, s, "a\x000", withID(block(5000, 1), 42))
	store(t, s, "b\x000", block(6000, 2))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, testConfig(dir))
	checkInvariant(t, s)
	for key, id := range map[string]uint64{"a\x000": 42, "b\x000": 0} {
		s.mu.Lock()
		m := s.index[key]
		s.mu.Unlock()
		if m.id != id {
			t.Errorf("%q: indexed with ID %d after a reopen, want %d", key, m.id, id)
		}
		n := 5000 + 1000*int(key[0]-'a')
		if b, ok, err := s.Get(key, tagOf(n)); !ok || err != nil || b.ID != id {
			t.Errorf("Get %q after a reopen: ID %d, ok %v, err %v; want ID %d", key, b.ID, ok, err, id)
		}
	}
	forms := ""
	for _, k := range keysOf(t, s.db) {
		forms += string(k[0])
	}
	if forms != "is" {
		t.Errorf("key forms %q, want an 'i' key and an 's' key", forms)
	}
}

// TestOldStoreServes: a store written before IDs (keys of the old form
// only) opens, serves its blocks with ID 0, and a block written again
// with an ID moves to the new form.
func TestOldStoreServes(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(testConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	err = s.db.Update(func(txn *badger.Txn) error {
		if err := txn.Set(oldKey(0, 5000, "a\x000"), encode(block(5000, 1))); err != nil {
			return err
		}
		return txn.Set(oldKey(1, 6000, "a\x001"), encode(block(6000, 2)))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, testConfig(dir))
	checkInvariant(t, s)
	if st := s.Stats(); st.Entries != 2 || st.Bytes != 11000 {
		t.Fatalf("an old store opened with %+v, want 2 entries of 11000 bytes", st)
	}
	for i, n := range []int{5000, 6000} {
		key := "a\x00" + string(rune('0'+i))
		b, ok, err := s.Get(key, tagOf(n))
		if !ok || err != nil || b.ID != 0 || !bytes.Equal(b.Data, block(n, byte(i+1)).Data) {
			t.Fatalf("Get %q from an old store: ok %v, err %v, ID %d", key, ok, err, b.ID)
		}
	}
	store(t, s, "a\x002", withID(block(7000, 3), 9))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, testConfig(dir))
	if b, ok, _ := s.Get("a\x002", tagOf(7000)); !ok || b.ID != 9 {
		t.Fatalf("a block written with ID 9 into an old store: ok %v, ID %d", ok, b.ID)
	}
}

// TestEvictDropsBothForms: a segment's drop takes its keys of either form.
func TestEvictDropsBothForms(t *testing.T) {
	s, _ := bare(t, Config{Segments: 4, InMemory: true}, 20, true)
	for _, e := range []struct {
		key string
		m   meta
	}{{"old", meta{seg: 0, len: 10}}, {"new", meta{seg: 0, len: 10, id: 5}}, {"next", meta{seg: 1, len: 10, id: 5}}} {
		if err := s.db.Update(func(txn *badger.Txn) error { return txn.Set(dbKey(e.m, e.key), encode(block(10, 1))) }); err != nil {
			t.Fatal(err)
		}
		s.index[e.key] = e.m
		s.segBytes[e.m.seg] += 10
		s.bytes += 10
	}
	s.cur = 1
	checkInvariant(t, s)
	if !s.evictOldest(false) {
		t.Fatal("nothing evicted at 30 bytes of 20")
	}
	checkInvariant(t, s)
	checkPersisted(t, s)
	if keys := keysOf(t, s.db); len(keys) != 1 || !bytes.Equal(keys[0], dbKey(meta{seg: 1, len: 10, id: 5}, "next")) {
		t.Fatalf("after dropping segment 0 Badger holds %q, want segment 1's key alone", keys)
	}
}

// TestRewriteUnderAnotherID: a block written again into the same segment
// under another ID (or length) loses its old key, which a reopen would
// count again; a reopen that finds two keys anyway counts the newer.
func TestRewriteUnderAnotherID(t *testing.T) {
	s, _ := bare(t, Config{Segments: 4, InMemory: true, QueueBytes: 1 << 30}, 4000, true)
	s.commit([]put{{key: "k", b: block(100, 1)}})
	s.commit([]put{{key: "k", b: withID(block(100, 1), 7)}})
	checkInvariant(t, s)
	checkPersisted(t, s)
	if keys := keysOf(t, s.db); len(keys) != 1 || keys[0][0] != 'i' {
		t.Fatalf("after a rewrite with an ID Badger holds %q, want the 'i' key alone", keys)
	}
	// Two keys for "j", as a store that left the old one behind has.
	err := s.db.Update(func(txn *badger.Txn) error {
		if err := txn.Set(dbKey(meta{seg: 1, len: 50, id: 3}, "j"), encode(block(50, 2))); err != nil {
			return err
		}
		return txn.Set(dbKey(meta{seg: 0, len: 40}, "j"), encode(block(40, 2)))
	})
	if err != nil {
		t.Fatal(err)
	}
	again, _ := bare(t, s.cfg, s.dataCap, false)
	again.db = s.db
	if err := again.load(); err != nil {
		t.Fatal(err)
	}
	checkInvariant(t, again)
	checkPersisted(t, again)
	if m := again.index["j"]; m != (meta{seg: 1, len: 50, id: 3}) || again.bytes != 150 {
		t.Fatalf("reloaded j as %+v, %d bytes in all; want segment 1's key, 150 bytes", m, again.bytes)
	}
	if m := again.index["k"]; m.id != 7 {
		t.Fatalf("reloaded k with ID %d, want 7", m.id)
	}
}

// TestAgingKeepsID: a block rewritten on a hit from an aging segment
// keeps its ID, and Get returns it.
func TestAgingKeepsID(t *testing.T) {
	s, _ := bare(t, Config{Segments: 4, InMemory: true, QueueBytes: 1 << 30}, 4000, true)
	s.commit([]put{{key: "k", b: withID(block(100, 1), 7)}})
	s.cur = 3
	b, ok, err := s.Get("k", tagOf(100))
	if !ok || err != nil || b.ID != 7 {
		t.Fatalf("Get: ok %v, err %v, ID %d; want ID 7", ok, err, b.ID)
	}
	if len(s.queue) != 1 {
		t.Fatalf("%d rewrites queued, want 1", len(s.queue))
	}
	if p := <-s.queue; !p.keep || p.b.ID != 7 {
		t.Fatalf("the rewrite: keep %v, ID %d; want a copy with ID 7", p.keep, p.b.ID)
	}
}

// TestCheckPersisted: the check finds an index entry whose key (ID
// included) is not in Badger.
func TestCheckPersisted(t *testing.T) {
	s, _ := bare(t, Config{Segments: 4, InMemory: true, QueueBytes: 1 << 30}, 4000, true)
	s.commit([]put{{key: "k", b: withID(block(100, 1), 7)}})
	checkPersisted(t, s)
	m := s.index["k"]
	m.id = 8
	s.index["k"] = m
	if err := s.checkPersisted(); err == nil || !strings.Contains(err.Error(), "not in Badger") {
		t.Fatalf("an index entry with another ID than its key's: %v", err)
	}
}
