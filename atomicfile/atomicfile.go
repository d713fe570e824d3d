// Package atomicfile writes a file whole or not at all, and removes the
// temporary files that a writer killed on the way left behind.
//
// # Writing
//
// Write fills a temporary file beside the target (prefix + random
// digits, os.CreateTemp's pattern), syncs it and renames it over the
// target: a reader sees the old file or the new one, never a part.
//
// # Leftovers
//
// A writer killed before its rename leaves its temporary file for ever:
// nothing else knows its name. Each temporary file is held under an
// exclusive flock(2) while it is written, and the kernel drops a dead
// process's locks; so RemoveStale removes exactly the temporary files of
// a prefix that no live writer holds, and never one being written, by
// this process or another. A writer whose new file was removed before it
// could lock it makes another.
package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Write writes path through fill: into a locked temporary file named
// prefix and random digits in path's directory, then synced and renamed
// over path. On error the temporary file is removed and path is left as
// it was. fill must not keep w.
func Write(path, prefix string, fill func(w io.Writer) error) error {
	f, err := create(filepath.Dir(path), prefix)
	if err != nil {
		return err
	}
	err = fill(f)
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		// Renamed before it is closed: until then, its lock keeps
		// RemoveStale off it.
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		f.Close()
		return err
	}
	return f.Close()
}

// create returns a new temporary file of prefix in dir, locked.
func create(dir, prefix string) (*os.File, error) {
	for range 100 {
		f, err := os.CreateTemp(dir, prefix+"*")
		if err != nil {
			return nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			f.Close()
			os.Remove(f.Name())
			return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		if same(f, f.Name()) {
			return f, nil
		}
		f.Close() // RemoveStale took it before the lock: make another
	}
	return nil, fmt.Errorf("create a temporary file %s* in %s: removed 100 times in a row", prefix, dir)
}

// same reports whether name is f's file.
func same(f *os.File, name string) bool {
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	ni, err := os.Lstat(name)
	return err == nil && os.SameFile(fi, ni)
}

// IsTemp reports whether name is a temporary file name of prefix.
func IsTemp(name, prefix string) bool {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok || rest == "" {
		return false
	}
	for _, c := range rest {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// RemoveStale removes the temporary files of prefix in dir that no
// writer holds, and returns their paths. It looks at regular files only,
// directly in dir, and follows no symbolic link. A missing dir holds
// none.
func RemoveStale(dir, prefix string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("remove leftover temporary files: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		if !e.Type().IsRegular() || !IsTemp(e.Name(), prefix) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		ok, err := removeIfFree(path)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			removed = append(removed, path)
		}
	}
	return removed, errors.Join(errs...)
}

// removeIfFree removes path if no writer holds its lock.
func removeIfFree(path string) (bool, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ENOENT) {
		return false, nil // its writer renamed or removed it
	}
	if err != nil {
		return false, fmt.Errorf("remove leftover %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil // being written
		}
		return false, fmt.Errorf("remove leftover %s: lock: %w", path, err)
	}
	if !same(f, path) {
		return false, nil // renamed meanwhile; the name is another file's now
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("remove leftover %s: %w", path, err)
	}
	return true, nil
}
