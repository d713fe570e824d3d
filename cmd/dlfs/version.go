package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
)

// version is dlfs's release, shared with the Python helper
// (python/dlfs/__init__.py's __version__, which pip installs; a test keeps
// them equal). A build may set it: -ldflags "-X main.version=...".
var version = "0.16.0"

// revision is the commit the binary was built from (its first 12 hex
// digits), or "" when the build did not record one.
func revision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return s.Value[:12]
			}
		}
	}
	return ""
}

// versionLine is what "dlfs version" and "dlfs --version" print first.
func versionLine() string {
	commit := ""
	if r := revision(); r != "" {
		commit = " commit " + r
	}
	return fmt.Sprintf("dlfs %s (%s %s/%s%s)", version, runtime.Version(), runtime.GOOS, runtime.GOARCH, commit)
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print dlfs's version, and the Python helper's it goes with",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), versionLine())
			fmt.Fprintf(cmd.OutOrStdout(), "python helper: dlfs %s (pip install ./python; dlfs.__version__)\n", version)
			return nil
		},
	}
}

// buildInfo is the dlfs_build_info gauge: always 1, with the version, the
// commit and the Go release as labels, so that dashboards can tell which
// nodes run which build.
func buildInfo() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "dlfs_build_info",
		Help:        "Always 1; the labels name the running build: version, revision (commit) and goversion.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision(), "goversion": runtime.Version()},
	})
	g.Set(1)
	return g
}
