package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestVersionMatchesHelper: the daemon and the Python helper that pip
// installs carry one version.
func TestVersionMatchesHelper(t *testing.T) {
	b, err := os.ReadFile("../../python/dlfs/__init__.py")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^__version__ = "([^"]+)"`).FindSubmatch(b)
	if m == nil {
		t.Fatal("python/dlfs/__init__.py has no __version__")
	}
	if string(m[1]) != version {
		t.Errorf("the helper is %s, the daemon %s: bump both", m[1], version)
	}
	p, err := os.ReadFile("../../python/pyproject.toml")
	if err != nil || !strings.Contains(string(p), `version = {attr = "dlfs.__version__"}`) {
		t.Errorf("pyproject.toml must take its version from dlfs.__version__ (%v)", err)
	}
}

// TestVersionFlag: "dlfs --version" prints the version line, as "dlfs
// version" does.
func TestVersionFlag(t *testing.T) {
	var out strings.Builder
	root := newRootCmd()
	root.SetOut(&out)
	root.SetArgs([]string{"--version"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != versionLine()+"\n" || !strings.HasPrefix(got, "dlfs "+version+" (go") {
		t.Errorf("dlfs --version printed %q", got)
	}
}

// TestBuildInfo: the registry a mount serves has dlfs_build_info 1 with
// the version.
func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(buildInfo())
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != "dlfs_build_info" || mfs[0].Metric[0].GetGauge().GetValue() != 1 {
		t.Fatalf("gathered %v, %v", mfs, err)
	}
	labels := map[string]string{}
	for _, l := range mfs[0].Metric[0].Label {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["version"] != version || labels["goversion"] == "" {
		t.Errorf("dlfs_build_info labels: %v", labels)
	}
}
