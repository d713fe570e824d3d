package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is dlfs's release, shared with the Python helper
// (python/dlfs/__init__.py's __version__, which pip installs; a test keeps
// them equal). A build may set it: -ldflags "-X main.version=...".
var version = "0.16.0"

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print dlfs's version, and the Python helper's it goes with",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			commit := ""
			if bi, ok := debug.ReadBuildInfo(); ok {
				for _, s := range bi.Settings {
					if s.Key == "vcs.revision" && len(s.Value) >= 12 {
						commit = " commit " + s.Value[:12]
					}
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "dlfs %s (%s %s/%s%s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH, commit)
			fmt.Fprintf(cmd.OutOrStdout(), "python helper: dlfs %s (pip install ./python; dlfs.__version__)\n", version)
			return nil
		},
	}
}
