package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/dlfs/dlfs/daemon"
)

func newRefreshCmd() *cobra.Command {
	var controlName string
	cmd := &cobra.Command{
		Use:   "refresh [MOUNTPOINT]",
		Short: "Rescan a mount's SOURCE now, and report what changed",
		Long: `refresh asks the dlfs mount at MOUNTPOINT (by default the one holding the
current directory) to rescan SOURCE, as writing "refresh" to
MOUNTPOINT/.dlfs/control does, waits for the rescan to end and reports the
paths it found added, removed and changed. Files that changed are dropped
from every cache tier. A rescan already running is followed by a new one,
which this command waits for. Interrupting it leaves the rescan running in
the daemon; dlfs stats --json shows catalog.refresh when it ends. Exits 1 if
the rescan failed (SOURCE unreadable, for one): the mount keeps serving
the catalog it had.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			mnt, err := controlMount(args, controlName)
			if err != nil {
				return err
			}
			return refresh(cmd.OutOrStdout(), mnt, filepath.Join(mnt, controlName))
		},
	}
	cmd.Flags().StringVar(&controlName, "control-name", ".dlfs", "name of the mount's control directory")
	return cmd
}

// controlMount returns the mount named, or the one holding the current
// directory, checking that it has a control file.
func controlMount(args []string, controlName string) (string, error) {
	if len(args) == 1 {
		if _, err := os.Stat(filepath.Join(args[0], controlName, "control")); err != nil {
			return "", fmt.Errorf("%s is not a dlfs mount (no %s/control there: %v); give the mountpoint of a running dlfs mount", args[0], controlName, unwrapPathErr(err))
		}
		return args[0], nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	mnt := findMount(wd, controlName)
	if mnt == "" {
		return "", fmt.Errorf("%s is not inside a dlfs mount; give the mountpoint", wd)
	}
	return mnt, nil
}

// refresh writes "refresh" to the control file, which returns once the
// rescan has ended, and reports it from stats.
func refresh(w io.Writer, mnt, ctl string) error {
	werr := os.WriteFile(filepath.Join(ctl, "control"), []byte("refresh\n"), 0)
	var st daemon.Stats
	b, err := os.ReadFile(filepath.Join(ctl, "stats"))
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	switch {
	case werr != nil && errors.Is(werr, syscall.EINTR):
		return fmt.Errorf("refresh %s: interrupted; the rescan goes on in the daemon (dlfs stats --json shows catalog.refresh)", mnt)
	case werr != nil && err == nil && st.Catalog.Refresh.Error != "":
		return fmt.Errorf("refresh %s: %s; the mount keeps the catalog it had", mnt, st.Catalog.Refresh.Error)
	case werr != nil:
		return fmt.Errorf("refresh %s: %w", mnt, unwrapPathErr(werr))
	case err != nil:
		return fmt.Errorf("refresh %s: the rescan ended, but reading its figures failed: %w", mnt, err)
	}
	c := st.Catalog
	r := c.Refresh
	fmt.Fprintf(w, "refreshed %s in %.1fs: %d added, %d removed, %d changed; now %s files, %s dirs, %s\n", printable(mnt), r.Seconds,
		r.Added, r.Removed, r.Changed, fmtCount(float64(c.Files)), fmtCount(float64(c.Dirs)), human(c.Bytes))
	if c.UnreadableEntries > 0 {
		fmt.Fprintf(w, "%d directories or entries could not be read (they keep what the scan before found); first: %s\n", c.UnreadableEntries, strings.Join(printables(c.Unreadable), ", "))
	}
	return nil
}
