package ssdstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// The checks Open makes, for a caller that checks a configuration before
// opening anything (dlfs mount before it scans SOURCE, and dlfs doctor).

// layout divides capacity as Open does. Badger's files are sized from the
// capacity, so that they fit in it with the data: the value-log file
// being written, one being collected, two memtables and the discard file.
// Copies kept on eviction (half a segment) may pass the disk bound for a
// moment: data leaves room for them too.
func layout(capacity int64, inMemory bool) (vlogSize, memSize, dataCap int64) {
	vlogSize = min(max(capacity/16, 1<<20), 1<<30-1)
	memSize = min(max(capacity/32, 1<<20), 8<<20)
	if inMemory {
		memSize = 8 << 20 // values live in the tree: a memtable must take 1 MB ones
	}
	dataCap = capacity - (2*vlogSize + 2*memSize + 1<<20) - capacity/32
	return vlogSize, memSize, dataCap
}

func checkCapacity(capacity, dataCap int64) error {
	if capacity < MinCapacity {
		return fmt.Errorf("ssdstore: capacity %d bytes is below the least of 16 MiB", capacity)
	}
	if dataCap <= 0 {
		// In memory, two 8 MiB memtables take all of a small capacity;
		// with no room for data, maintenance would evict for ever.
		return fmt.Errorf("ssdstore: capacity %d bytes leaves no room for data beside Badger's files; give more", capacity)
	}
	return nil
}

// MinCapacity is the least Config.Capacity a store on disk takes.
const MinCapacity = 16 << 20

// CheckCapacity returns the error Open would give a store on disk of this
// capacity, or nil.
func CheckCapacity(capacity int64) error {
	_, _, dataCap := layout(capacity, false)
	return checkCapacity(capacity, dataCap)
}

// MinFree returns the free space Open needs on the directory's filesystem
// for a store of this capacity (with Config.MinFree at its default): below
// it, Open fails with ErrNoSpace.
func MinFree(capacity int64) int64 {
	vlogSize, memSize, _ := layout(capacity, false)
	return (2*vlogSize + 2*memSize + 16<<20) / 2
}

// Locked reports whether a store is open in dir, by this process or
// another. It creates nothing.
func Locked(dir string) (bool, error) {
	f, err := os.Open(filepath.Join(dir, "dlfs.lock"))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("ssdstore: %w", err)
	}
	defer f.Close()
	// A lock of a second descriptor conflicts with one this process
	// holds, too (flock locks belong to open files).
	switch err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); {
	case errors.Is(err, syscall.EWOULDBLOCK):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("ssdstore: lock %s: %w", dir, err)
	}
	return false, nil // closing f lets go of the lock
}
