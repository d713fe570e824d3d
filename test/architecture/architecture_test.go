// Package architecture checks that the packages keep to the layers
// docs/architecture.md draws: a package imports from its own layer and
// those below, never from one above.
package architecture

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const (
	module  = "github.com/dlfs/dlfs"
	docPath = "../../docs/architecture.md"
)

// layer is a row of the table in docs/architecture.md.
type layer struct {
	n       int
	name    string
	entries []string // package paths relative to the module; each holds the packages under it too
}

var (
	rowRE   = regexp.MustCompile(`^\|\s*(\d+)\s*\|\s*([^|]*?)\s*\|([^|]*)\|\s*$`)
	entryRE = regexp.MustCompile("`([^`]+)`")
)

// parseLayers reads the layer table: rows "| N | name | `pkg`, ... |",
// numbered 1, 2, ... from the bottom.
func parseLayers(doc []byte) ([]layer, error) {
	var out []layer
	seen := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(doc))
	for sc.Scan() {
		m := rowRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		if n != len(out)+1 {
			return nil, fmt.Errorf("layer %q is numbered %d, want %d", m[2], n, len(out)+1)
		}
		l := layer{n: n, name: m[2]}
		for _, e := range entryRE.FindAllStringSubmatch(m[3], -1) {
			if prev, ok := seen[e[1]]; ok {
				return nil, fmt.Errorf("%s is in layers %d and %d", e[1], prev, n)
			}
			seen[e[1]] = n
			l.entries = append(l.entries, e[1])
		}
		if len(l.entries) == 0 {
			return nil, fmt.Errorf("layer %d (%s) names no package", n, l.name)
		}
		out = append(out, l)
	}
	return out, sc.Err()
}

// layerOf returns the layer of pkg (relative to the module) and the entry
// that put it there: the longest entry that is pkg or a directory above
// it. ok is false if none is.
func layerOf(layers []layer, pkg string) (l layer, entry string, ok bool) {
	for _, cand := range layers {
		for _, e := range cand.entries {
			if (pkg == e || strings.HasPrefix(pkg, e+"/")) && len(e) > len(entry) {
				l, entry, ok = cand, e, true
			}
		}
	}
	return l, entry, ok
}

// check returns what breaks the layering of graph (package → the module's
// packages its non-test files import, all relative to the module): a
// package with no layer, an import from a higher layer, an entry that
// names no package.
func check(layers []layer, graph map[string][]string) []string {
	var bad []string
	used := map[string]bool{}
	pkgs := make([]string, 0, len(graph))
	for p := range graph {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	for _, p := range pkgs {
		lp, e, ok := layerOf(layers, p)
		if !ok {
			bad = append(bad, fmt.Sprintf("%s has no layer: give it one in docs/architecture.md", p))
			continue
		}
		used[e] = true
		for _, imp := range graph[p] {
			if li, _, ok := layerOf(layers, imp); ok && li.n > lp.n {
				bad = append(bad, fmt.Sprintf("%s (layer %d, %s) imports %s (layer %d, %s)", p, lp.n, lp.name, imp, li.n, li.name))
			}
		}
	}
	for _, l := range layers {
		for _, e := range l.entries {
			if !used[e] {
				bad = append(bad, fmt.Sprintf("layer %d (%s) names %s, which holds no package", l.n, l.name, e))
			}
		}
	}
	return bad
}

// importGraph lists the module's packages and what their non-test files
// import of the module, under the build tags given.
func importGraph(t *testing.T, root string, tags string) map[string][]string {
	t.Helper()
	args := []string{"list", "-f", `{{.ImportPath}} {{join .Imports " "}}`}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.Command("go", append(args, "./...")...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	rel := func(p string) (string, bool) {
		r, ok := strings.CutPrefix(p, module+"/")
		return r, ok
	}
	graph := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		p, ok := rel(f[0])
		if !ok {
			continue // the module's root holds no package
		}
		graph[p] = nil
		for _, imp := range f[1:] {
			if r, ok := rel(imp); ok {
				graph[p] = append(graph[p], r)
			}
		}
	}
	return graph
}

// TestArchitectureLayers: no package imports from a layer above its own,
// with the layers read from docs/architecture.md, under the default tags
// and under nohdf5 (the static build's).
func TestArchitectureLayers(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
	doc, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := parseLayers(doc)
	if err != nil {
		t.Fatalf("%s: %v", docPath, err)
	}
	if len(layers) < 5 {
		t.Fatalf("%s: %d layers read from its table, want its whole table", docPath, len(layers))
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, tags := range []string{"", "nohdf5"} {
		graph := importGraph(t, root, tags)
		if len(graph) < 20 {
			t.Fatalf("tags %q: go list found %d packages", tags, len(graph))
		}
		for _, b := range check(layers, graph) {
			t.Errorf("tags %q: %s", tags, b)
		}
	}
}

// TestCheck: check finds each kind of break in a small graph, and passes
// one that keeps to its layers.
func TestCheck(t *testing.T) {
	layers, err := parseLayers([]byte(strings.Join([]string{
		"| layer | name | packages |",
		"|---:|---|---|",
		"| 1 | base | `util`, `loader/runs` |",
		"| 2 | middle | `loader` |",
		"| 3 | top | `cmd` |",
	}, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		graph map[string][]string
		want  []string
	}{
		{"keeps to its layers", map[string][]string{
			"util": nil, "loader/runs": {"util"}, "loader": {"loader/runs", "util"}, "cmd/x": {"loader"}, "cmd/x/y": {"cmd/x"},
		}, nil},
		{"imports from above", map[string][]string{
			"util": {"loader"}, "loader/runs": {"cmd/x"}, "loader": nil, "cmd/x": nil,
		}, []string{
			"loader/runs (layer 1, base) imports cmd/x (layer 3, top)",
			"util (layer 1, base) imports loader (layer 2, middle)",
		}},
		{"no layer", map[string][]string{
			"util": nil, "loader/runs": nil, "loader": nil, "cmd/x": nil, "other": {"util"},
		}, []string{"other has no layer: give it one in docs/architecture.md"}},
		{"a stale entry", map[string][]string{
			"util": nil, "loader": nil, "cmd/x": nil,
		}, []string{"layer 1 (base) names loader/runs, which holds no package"}},
		{"an entry is not a prefix of a longer name", map[string][]string{
			"util": nil, "loader/runs": nil, "loader": nil, "cmd/x": nil, "utility": nil,
		}, []string{"utility has no layer: give it one in docs/architecture.md"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := check(layers, tc.graph)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestParseLayersRejects: a table that skips a number, repeats a package
// or has an empty row is an error, not a weaker check.
func TestParseLayersRejects(t *testing.T) {
	for name, doc := range map[string]string{
		"skips a number":    "| 1 | a | `x` |\n| 3 | b | `y` |",
		"repeats a package": "| 1 | a | `x` |\n| 2 | b | `x` |",
		"an empty row":      "| 1 | a | `x` |\n| 2 | b | none |",
	} {
		if _, err := parseLayers([]byte(doc)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
