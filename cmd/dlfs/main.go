// Command dlfs mounts a dataset directory as a cached, read-only FUSE
// filesystem for deep-learning training.
package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
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
			var ec exitCode
			if errors.As(err, &ec) { // a --daemon whose daemon failed: it said why
				code <- int(ec)
				return
			}
			printErrorAs(os.Stderr, err, errorFormat(root, os.Args[1:]))
			code <- 1
			return
		}
		code <- 0
	}()
	os.Exit(<-code)
}

// printError prints the error a command ended with, on one line: it may
// name what SOURCE or a peer chose, so it goes through printable.
func printError(w io.Writer, err error) { printErrorAs(w, err, "text") }

// printErrorAs is printError in format: with "json" (--log-format json)
// the line is a JSON record, as the daemon's log is, so that a log
// collector parses every line.
func printErrorAs(w io.Writer, err error, format string) {
	if format == "json" {
		slog.New(slog.NewJSONHandler(w, nil)).Error("exiting", "err", printable(err.Error()))
		return
	}
	fmt.Fprintln(w, "dlfs:", printable(err.Error()))
}

// errorFormat is the --log-format of the command args ran ("text" if it
// has none, or it was not parsed).
func errorFormat(root *cobra.Command, args []string) string {
	c, _, err := root.Find(args)
	if err != nil {
		return "text"
	}
	if f := c.Flags().Lookup("log-format"); f != nil && f.Value.String() == "json" {
		return "json"
	}
	return "text"
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
