package ssdstore

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// pageOut asks the kernel to reclaim the pages of the value-log files under
// dir that this process has mapped, and returns the bytes of mappings it
// advised.
//
// Badger maps its value log and tables MAP_SHARED. Every page it writes or
// reads stays resident in this process's RSS until the kernel needs it,
// though it is only page cache for data that is already on the SSD. Left
// alone, the daemon's RSS would grow with the SSD tier, not the RAM tier.
// MADV_PAGEOUT is non-destructive (unlike MADV_DONTNEED it never discards
// data, even if a range was remapped in between), and clean pages it
// reclaims are simply read from the SSD again on the next hit. Dirty pages
// are not reclaimed, so each file is first written back with fdatasync on a
// descriptor of our own: Badger's locks are not taken, and its writer never
// waits for the disk.
func pageOut(dir string) (int64, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, fmt.Errorf("ssdstore: page out: %w", err)
	}
	defer f.Close()
	prefix := []byte(strings.TrimSuffix(dir, "/") + "/")
	var total int64
	var lastSynced string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Bytes()
		// "start-end perms offset dev inode   path"
		i := bytes.IndexByte(line, '/')
		if i < 0 || !bytes.HasPrefix(line[i:], prefix) || !bytes.HasSuffix(line, []byte(".vlog")) {
			continue // only value logs: tables and memtables are small and hot
		}
		rng, _, _ := bytes.Cut(line, []byte(" "))
		lo, hi, ok := bytes.Cut(rng, []byte("-"))
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(string(lo), 16, 64)
		end, err2 := strconv.ParseUint(string(hi), 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		if path := string(line[i:]); path != lastSynced {
			if fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
				_ = unix.Fdatasync(fd)
				unix.Close(fd)
			}
			lastSynced = path
		}
		// ENOMEM (unmapped meanwhile) and EINVAL (old kernel) are harmless.
		_, _, _ = unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_PAGEOUT)
		total += int64(end - start)
	}
	return total, sc.Err()
}
