// Package fusecap asks the kernel, with a FUSE mount of its own, whether
// this machine and process can use FUSE passthrough, independently of
// dlfs's own check (fusefs.probePassthrough): a test of passthrough skips
// only where this says no, and fails where this says yes and dlfs turned
// passthrough off.
package fusecap

import (
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

var (
	once   sync.Once
	ok     bool
	reason string
)

// Passthrough reports whether the kernel offers FUSE passthrough to a
// mount made here and lets this process register a backing file; why
// says what is missing when it does not. The answer is computed once per
// process (a mount and an unmount, in a directory of its own).
// Safe for concurrent use; blocks for the mount.
func Passthrough() (bool, string) {
	once.Do(func() { ok, reason = probe() })
	return ok, reason
}

func probe() (bool, string) {
	dir, err := os.MkdirTemp("", "fusecap")
	if err != nil {
		return false, "no directory to mount on: " + err.Error()
	}
	defer os.Remove(dir)
	s, err := fuse.NewServer(fuse.NewDefaultRawFileSystem(), dir, &fuse.MountOptions{Name: "fusecap", FsName: "fusecap"})
	if err != nil {
		return false, "cannot mount FUSE here: " + err.Error()
	}
	go s.Serve()
	defer s.Unmount()
	if err := s.WaitMount(); err != nil {
		return false, "the FUSE mount did not come up: " + err.Error()
	}
	if s.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH == 0 {
		var u unix.Utsname
		_ = unix.Uname(&u)
		return false, fmt.Sprintf("the kernel (%s) does not offer FUSE passthrough", unix.ByteSliceToString(u.Release[:]))
	}
	fd, err := unix.MemfdCreate("fusecap", unix.MFD_CLOEXEC)
	if err != nil {
		return false, "memfd_create: " + err.Error()
	}
	defer unix.Close(fd)
	id, errno := s.RegisterBackingFd(&fuse.BackingMap{Fd: int32(fd)})
	switch {
	case errno == syscall.EPERM:
		return false, "registering a backing file needs CAP_SYS_ADMIN, which this process lacks"
	case errno != 0:
		return false, "the kernel refused a backing file: " + errno.Error()
	}
	s.UnregisterBackingFd(id)
	return true, ""
}
