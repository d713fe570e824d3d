package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/fusefs"
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
	err := fusefs.Unmount(mp, lazy)
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("%s is busy: a process has files open there; stop it, or use --lazy", mp)
	}
	return err
}
