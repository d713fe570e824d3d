// Package memstat measures the live heap, for tests that hold a
// structure's bytes per element to a bound.
package memstat

import "runtime"

// Heap returns the bytes of live heap after two collections (the second
// frees what the first's finalizers released).
func Heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
