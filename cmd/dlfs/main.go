// Command dlfs mounts a dataset directory as a cached, read-only FUSE
// filesystem for deep-learning training.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/dlfs/dlfs/daemon"
)

// The kernel hands a signal sent to the process to its main thread first,
// and a thread blocked in a call to a PFS that stopped answering never
// takes it (a FUSE or hard NFS wait is uninterruptible): SIGTERM would be
// lost. So the main thread does nothing but wait, and the command runs on
// the others.
func init() { runtime.LockOSThread() }

func main() {
	code := make(chan int)
	go func() {
		root := newRootCmd()
		if err := root.Execute(); err != nil {
			printError(os.Stderr, err)
			code <- 1
			return
		}
		code <- 0
	}()
	os.Exit(<-code)
}

// printError prints the error a command ended with, on one line: it may
// name what SOURCE or a peer chose, so it goes through printable.
func printError(w io.Writer, err error) {
	fmt.Fprintln(w, "dlfs:", printable(err.Error()))
}

func newRootCmd() *cobra.Command { return newRoot(runMount, os.LookupEnv) }

// newRoot builds the commands: mount runs with runMount's signature, and
// lookupEnv reads the DLFS_* settings (os.LookupEnv but in tests).
func newRoot(mount func(*cobra.Command, daemon.Config, *mountOptions) error, lookupEnv func(string) (string, bool)) *cobra.Command {
	root := &cobra.Command{
		Use:   "dlfs",
		Short: "A caching, clairvoyantly prefetching filesystem for training data",
		Long: `dlfs mounts a dataset directory (typically on a shared parallel filesystem)
as a read-only FUSE view whose reads are served from RAM and SSD caches.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       versionLine(),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	addConfig(root, lookupEnv)
	root.AddCommand(newMountCmd(mount), newUmountCmd(), newPackCmd(), newSimulateCmd(), newWarmupCmd(),
		newStatsCmd(), newRefreshCmd(), newDoctorCmd(), newVersionCmd())
	return root
}
