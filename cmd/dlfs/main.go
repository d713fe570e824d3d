// Command dlfs mounts a dataset directory as a cached, read-only FUSE
// filesystem for deep-learning training.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	root := newRootCmd()
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "dlfs:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "dlfs",
		Short: "A caching, clairvoyantly prefetching filesystem for training data",
		Long: `dlfs mounts a dataset directory (typically on a shared parallel filesystem)
as a read-only FUSE view whose reads are served from RAM and SSD caches.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newMountCmd(runMount), newUmountCmd(), newPackCmd(), newSimulateCmd(), newWarmupCmd(),
		newStatsCmd(), newDoctorCmd(), newVersionCmd())
	return root
}
