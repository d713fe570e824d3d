package ssdstore

import (
	"os"
	"syscall"
)

// The free-space floor and the disk bound: what the filesystem has left,
// and what the store's files occupy.

// lowSpace reports whether a write of n bytes, fresh of them new to the
// store, would take the filesystem's free space under MinFree (low), or
// the store's files past Capacity (full: maintenance then evicts and
// collects). It logs when that starts and ends.
func (s *Store) lowSpace(n, fresh int64) (low, full bool) {
	if s.cfg.InMemory {
		return false, false
	}
	free, err := freeSpace(s.cfg.Dir)
	low = err == nil && free-n < s.cfg.MinFree
	disk := diskUsage(s.cfg.Dir)
	full = disk+fresh > s.cfg.Capacity
	if full {
		s.room.Store(fresh) // maintenance makes room for it
	} else {
		s.room.Store(0)
	}
	if was := s.low.Swap(low || full); was != (low || full) {
		if low || full {
			s.log.Warn("ssdstore: not caching on the SSD until there is room", "free_mib", free>>20, "floor_mib", s.cfg.MinFree>>20,
				"disk_mib", disk>>20, "capacity_mib", s.cfg.Capacity>>20)
		} else {
			s.log.Info("ssdstore: caching on the SSD again", "free_mib", free>>20)
		}
	}
	return low, full
}

// overDisk reports whether the store's files, with the room a dropped
// write asked for, exceed Capacity.
func (s *Store) overDisk() bool {
	return !s.cfg.InMemory && diskUsage(s.cfg.Dir)+s.room.Load() > s.cfg.Capacity
}

// freeSpace returns the bytes an unprivileged writer may still use on
// dir's filesystem.
func freeSpace(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// diskUsage returns the bytes the files directly in dir occupy on disk.
func diskUsage(dir string) int64 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
	}
	return n
}
