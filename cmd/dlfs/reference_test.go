package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"github.com/spf13/pflag"
)

// The command reference in docs/reference is written from the cobra
// commands themselves, so it cannot drift from them: `make docs` rewrites
// it (this test with -update-reference), and TestReferenceCurrent fails
// when a command, flag or help text changed and the files were not
// rewritten. `make man` writes man pages the same way (-man DIR); they
// are not committed.
var (
	updateReference = flag.Bool("update-reference", false, "rewrite docs/reference from the commands (make docs)")
	manDir          = flag.String("man", "", "write man pages of the commands into this directory (make man)")
)

const referenceDir = "../../docs/reference"

// hostDefaults are the flags whose default is computed from the machine
// they run on: the reference names the rule, not this machine's figure,
// so that it reads the same wherever it is generated. "0" prints no
// default, for a flag whose usage names its rule itself.
var hostDefaults = map[string]string{
	"max-files":   "0",
	"loader-cpus": "the node's cores",
}

// referenceRoot is the command tree as a user meets it: with the
// completion command, --version and --help that cobra adds when it runs,
// no DLFS_* variables, and the defaults of hostDefaults named.
func referenceRoot(t *testing.T) *cobra.Command {
	t.Helper()
	root := newRoot(runMount, func(string) (string, bool) { return "", false })
	root.InitDefaultCompletionCmd()
	root.InitDefaultVersionFlag()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.DisableAutoGenTag = true // no date: the files stay the same until the commands change
		c.InitDefaultHelpFlag()
		for _, fs := range []*pflag.FlagSet{c.LocalFlags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) {
				if d, ok := hostDefaults[f.Name]; ok {
					f.DefValue = d
				}
			})
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return root
}

// generateReference writes the Markdown reference into dir and returns
// its files by name.
func generateReference(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	if err := doc.GenMarkdownTree(referenceRoot(t), dir); err != nil {
		t.Fatalf("generating the reference: %v", err)
	}
	return readReference(t, dir)
}

// readReference reads the generated files of dir: dlfs*.md.
func readReference(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "dlfs*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(name)] = b
	}
	return files
}

// TestReferenceCurrent fails when docs/reference differs from what the
// commands generate now. Run `make docs` to rewrite it.
func TestReferenceCurrent(t *testing.T) {
	want := generateReference(t, t.TempDir())
	if len(want) < 10 {
		t.Fatalf("the commands generated %d reference files; want one per command", len(want))
	}
	host := strconv.Itoa(defaultMaxFiles())
	for name, b := range want {
		if bytes.Contains(b, []byte(host)) {
			t.Errorf("%s holds this machine's --max-files default %s: name its rule in hostDefaults", name, host)
		}
	}
	if *updateReference {
		old := readReference(t, referenceDir)
		for name := range old {
			if _, ok := want[name]; !ok {
				if err := os.Remove(filepath.Join(referenceDir, name)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := os.MkdirAll(referenceDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range want {
			if err := os.WriteFile(filepath.Join(referenceDir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if *manDir != "" {
		if err := os.MkdirAll(*manDir, 0o755); err != nil {
			t.Fatal(err)
		}
		header := &doc.GenManHeader{Title: "DLFS", Section: "1", Source: "dlfs " + version, Manual: "dlfs manual"}
		if err := doc.GenManTree(referenceRoot(t), header, *manDir); err != nil {
			t.Fatalf("generating man pages: %v", err)
		}
	}
	got := readReference(t, referenceDir)
	var stale []string
	for name, b := range want {
		if !bytes.Equal(got[name], b) {
			stale = append(stale, name)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			stale = append(stale, name+" (no such command)")
		}
	}
	sort.Strings(stale)
	if len(stale) > 0 {
		t.Errorf("docs/reference differs from the commands in %s: run make docs", strings.Join(stale, ", "))
	}
}
