package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
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
