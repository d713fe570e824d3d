package packed

import (
	"container/list"
	"sync"

	"github.com/dlfs/dlfs/seqfile"
	"github.com/dlfs/dlfs/source"
)

// Records the memo keeps: a record larger than maxMemoRecord is streamed
// through its checksum on every partial read instead; the memo holds at
// most memoBytes of verified records (part of the daemon's 256 MiB of
// headroom).
const (
	maxMemoRecord = 16 << 20
	memoBytes     = 32 << 20
)

// recordMemo keeps the payloads of the records most recently read in part
// and verified whole, so that reading a large record block by block reads
// it once. Entries are keyed by the open shard and the record's offset: a
// new index opens new shards, so nothing of an older pack is ever found.
// Safe for concurrent use; a load runs outside the lock, and two readers
// missing together may both load.
type recordMemo struct {
	mu sync.Mutex
	// mu guards the following.
	// INVARIANT: bytes == sum of len(data) over items, and bytes <= memoBytes
	// (the tests check it: checkInvariant).
	items map[memoKey]*list.Element
	lru   list.List // front: most recently used; values are *memoItem
	bytes int64
}

type memoKey struct {
	h   *source.Handle
	off int64
}

type memoItem struct {
	key  memoKey
	data []byte
}

// get returns e's verified payload, loading it with load on a miss.
func (m *recordMemo) get(h *source.Handle, e seqfile.Entry, load func() ([]byte, error)) ([]byte, error) {
	k := memoKey{h, e.Offset}
	m.mu.Lock()
	if el, ok := m.items[k]; ok {
		m.lru.MoveToFront(el)
		b := el.Value.(*memoItem).data
		m.mu.Unlock()
		return b, nil
	}
	m.mu.Unlock()
	b, err := load()
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.items == nil {
		m.items = map[memoKey]*list.Element{}
	}
	if _, ok := m.items[k]; ok {
		return b, nil
	}
	for m.bytes+int64(len(b)) > memoBytes && m.lru.Len() > 0 {
		old := m.lru.Remove(m.lru.Back()).(*memoItem)
		delete(m.items, old.key)
		m.bytes -= int64(len(old.data))
	}
	m.items[k] = m.lru.PushFront(&memoItem{k, b})
	m.bytes += int64(len(b))
	return b, nil
}
