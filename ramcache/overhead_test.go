package ramcache

import (
	"testing"
	"unsafe"
)

// The per-entry overhead counted against the capacity covers an item and
// a map slot (a key and a pointer), so that it keeps up when item grows.
func TestOverheadCoversItem(t *testing.T) {
	if need := unsafe.Sizeof(item{}) + unsafe.Sizeof(uint64(0)) + unsafe.Sizeof(&item{}); overhead < int64(need) {
		t.Errorf("overhead %d bytes per entry, but an item and its map slot take %d", overhead, need)
	}
}
