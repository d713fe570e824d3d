package fusefs

import (
	"errors"
	"fmt"
	"os/exec"

	"golang.org/x/sys/unix"
)

// Unmount unmounts the FUSE mount at mp; lazy detaches it even while
// files are open there, and the kernel finishes once they close. A user
// who may not unmount (not root) goes through fusermount3, which unmounts
// the FUSE mounts of the calling user.
func Unmount(mp string, lazy bool) error {
	flags := 0
	if lazy {
		flags = unix.MNT_DETACH
	}
	err := unix.Unmount(mp, flags)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("%s is not mounted (%w)", mp, err)
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("%s is busy: a process has files open there (%w)", mp, err)
	case errors.Is(err, unix.EPERM):
		args := []string{"-u", mp}
		if lazy {
			args = []string{"-uz", mp}
		}
		if out, ferr := exec.Command("fusermount3", args...).CombinedOutput(); ferr != nil {
			return fmt.Errorf("unmount %s: %v: %s", mp, ferr, out)
		}
		return nil
	}
	return fmt.Errorf("unmount %s: %w", mp, err)
}
