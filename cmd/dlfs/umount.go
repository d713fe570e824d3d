package main

import (
	"errors"
	"fmt"
	"os/exec"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

func newUmountCmd() *cobra.Command {
	var lazy bool
	cmd := &cobra.Command{
		Use:   "umount MOUNTPOINT",
		Short: "Unmount a dlfs mount, including a dead one left by a killed daemon",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return umount(args[0], lazy)
		},
	}
	cmd.Flags().BoolVarP(&lazy, "lazy", "l", false, "detach now even if files are open; the kernel finishes later")
	return cmd
}

func umount(mp string, lazy bool) error {
	flags := 0
	if lazy {
		flags = unix.MNT_DETACH
	}
	err := unix.Unmount(mp, flags)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("%s is not mounted", mp)
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("%s is busy: a process has files open there; stop it, or use --lazy", mp)
	case errors.Is(err, unix.EPERM):
		// Not root: fusermount3 unmounts FUSE mounts of the calling user.
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
