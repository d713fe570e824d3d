package packed

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/dlfs/dlfs/seqfile"
	"github.com/dlfs/dlfs/source"
)

// checkInvariant checks recordMemo's INVARIANT under mu: bytes is the sum
// of the items' lengths and at most memoBytes, and the map and the LRU
// list hold the same items, each under its own key.
func (m *recordMemo) checkInvariant() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lru.Len() != len(m.items) {
		return fmt.Errorf("%d items in the list, %d in the map", m.lru.Len(), len(m.items))
	}
	var sum int64
	for el := m.lru.Front(); el != nil; el = el.Next() {
		it := el.Value.(*memoItem)
		if m.items[it.key] != el {
			return fmt.Errorf("the item at %d is not in the map under its key", it.key.off)
		}
		sum += int64(len(it.data))
	}
	if sum != m.bytes || m.bytes > memoBytes {
		return fmt.Errorf("bytes %d, items hold %d, bound %d", m.bytes, sum, memoBytes)
	}
	return nil
}

func checkMemo(t testing.TB, m *recordMemo) {
	t.Helper()
	if err := m.checkInvariant(); err != nil {
		t.Fatalf("INVARIANT broken: %v", err)
	}
}

// TestRecordMemo: hits return what was loaded without loading again, a
// failed load keeps nothing, and the least recently used records go to
// keep the memo within memoBytes; the invariant holds after each call,
// and under concurrent calls.
func TestRecordMemo(t *testing.T) {
	var m recordMemo
	h := new(source.Handle)
	loads := 0
	get := func(off int64, n int) []byte {
		t.Helper()
		b, err := m.get(h, seqfile.Entry{Offset: off}, func() ([]byte, error) {
			loads++
			return make([]byte, n), nil
		})
		if err != nil || len(b) != n {
			t.Fatalf("get %d: %d bytes, %v", off, len(b), err)
		}
		checkMemo(t, &m)
		return b
	}
	const rec = maxMemoRecord // two fill the memo
	get(0, rec)
	get(0, rec)
	if loads != 1 {
		t.Fatalf("%d loads of one record", loads)
	}
	if _, err := m.get(h, seqfile.Entry{Offset: 1}, func() ([]byte, error) { return nil, errors.New("bad") }); err == nil {
		t.Fatal("a failed load returned no error")
	}
	checkMemo(t, &m)
	get(rec, rec) // the memo is full
	get(0, rec)   // 0 is the most recent now
	get(2*rec, 1) // rec goes
	if loads != 3 || m.bytes != rec+1 {
		t.Fatalf("%d loads, %d bytes", loads, m.bytes)
	}
	get(0, rec)
	if loads != 3 {
		t.Fatal("the most recently used record was evicted")
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				off := int64(3*rec + (i*j)%7)
				if _, err := m.get(h, seqfile.Entry{Offset: off}, func() ([]byte, error) { return make([]byte, 1<<20+j), nil }); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	checkMemo(t, &m)
}
