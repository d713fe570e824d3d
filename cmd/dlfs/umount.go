package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/fusefs"
)

func newUmountCmd() *cobra.Command {
	var lazy bool
	cmd := &cobra.Command{
		Use:   "umount MOUNTPOINT",
		Short: "Unmount a dlfs mount, including a dead one left by a killed daemon",
		Long: `umount unmounts the dlfs mount at MOUNTPOINT, live or dead (its daemon
killed). It refuses anything else: a directory where nothing is mounted,
another filesystem's mount, or a symbolic link, which it never follows.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return umount(args[0], lazy)
		},
	}
	cmd.Flags().BoolVarP(&lazy, "lazy", "l", false, "detach now even if files are open; the kernel finishes later")
	return cmd
}

func umount(mp string, lazy bool) error {
	m, err := dlfsMountAt(mp)
	if err != nil {
		return err
	}
	// The mount point as mountinfo names it; fusefs.Unmount does not
	// follow a link there either (UMOUNT_NOFOLLOW), should one replace it
	// meanwhile.
	err = fusefs.Unmount(m.Point, lazy)
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("%s is busy: a process has files open there; stop it, or use --lazy", printable(mp))
	}
	if err != nil {
		return errors.New(printable(err.Error()))
	}
	return nil
}

// dlfsMountAt returns the mount on top at mp if it is a dlfs mount, and
// otherwise an error that says what is there. It reads mountinfo, not mp,
// so that a dead mount (whose every stat fails) is found too; mountinfo
// names mount points with links resolved, so a symbolic link at mp is
// never taken for the mount it points to.
func dlfsMountAt(mp string) (fusefs.MountInfo, error) {
	m, ok := fusefs.MountAt(mp)
	switch {
	case !ok:
		// Nothing is mounted at mp itself, so this lstat reaches no mount.
		if fi, err := os.Lstat(mp); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			target, _ := os.Readlink(mp)
			return m, fmt.Errorf("%s is a symbolic link (to %s), not a dlfs mount: dlfs umount follows no links; give the mount point itself", printable(mp), printable(target))
		}
		return m, fmt.Errorf("%s is not mounted (nothing is mounted there); give a dlfs mount's mount point (findmnt -t fuse.dlfs lists them)", printable(mp))
	case !isDlfs(m):
		return m, fmt.Errorf("%s is not a dlfs mount: it is a %s mount of %s; dlfs umount unmounts only dlfs mounts (use umount(8) for others)", printable(mp), printable(m.FSType), printable(m.Source))
	}
	return m, nil
}

// isDlfs reports whether m is a dlfs mount: the daemon mounts with the
// subtype dlfs (fstype fuse.dlfs) and the source "dlfs:SOURCE".
func isDlfs(m fusefs.MountInfo) bool {
	return m.FSType == "fuse.dlfs" || m.IsFUSE() && strings.HasPrefix(m.Source, "dlfs:")
}
