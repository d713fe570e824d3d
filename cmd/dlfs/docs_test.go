package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// The README is a short entry point: what dlfs is, a quick start, links.
// Everything else lives in docs/ (issue 30, point 5).
const (
	readmePath     = "../../README.md"
	docsDir        = "../../docs"
	readmeMaxLines = 320
)

// TestReadmeShort fails when the README grows past readmeMaxLines: move
// the new text into docs/ and link it.
func TestReadmeShort(t *testing.T) {
	b, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(b, []byte("\n")); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, more than %d: move the detail into docs/ and link it", n, readmeMaxLines)
	}
	for _, want := range []string{"docs/install.md", "docs/operating.md", "docs/sizing.md", "docs/design.md", "docs/reference/dlfs.md", "make demo", "make test", "dlfs mount", "dlfs stats"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("README.md does not mention %s", want)
		}
	}
}

// markdownFiles are the README and every Markdown file under docs/.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files := []string{readmePath}
	err := filepath.WalkDir(docsDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

var linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// mdDoc is what the link check needs of a Markdown file: its links and
// the anchors its headings make.
type mdDoc struct {
	links   []string // with their line numbers: "12:docs/x.md#y"
	anchors map[string]bool
}

// parseMarkdown reads the links and heading anchors of a Markdown file,
// outside fenced code blocks.
func parseMarkdown(t *testing.T, path string) mdDoc {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc := mdDoc{anchors: map[string]bool{}}
	seen := map[string]int{}
	fenced := false
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		if h := strings.TrimLeft(line, "#"); len(h) < len(line) && strings.HasPrefix(h, " ") {
			a := headingAnchor(h)
			if k := seen[a]; k > 0 {
				doc.anchors[fmt.Sprintf("%s-%d", a, k)] = true
			} else {
				doc.anchors[a] = true
			}
			seen[a]++
		}
		for _, m := range linkRE.FindAllStringSubmatch(stripCode(line), -1) {
			doc.links = append(doc.links, fmt.Sprintf("%d:%s", n, m[1]))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return doc
}

// stripCode drops inline code spans, where a "](" is no link.
func stripCode(line string) string {
	parts := strings.Split(line, "`")
	var b strings.Builder
	for i, p := range parts {
		if i%2 == 0 {
			b.WriteString(p)
		}
	}
	return b.String()
}

// headingAnchor is the id GitHub gives a heading: lower case, letters,
// digits, '-' and '_' kept, spaces made '-', everything else dropped.
func headingAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// TestDocLinks fails on a relative link in README.md or docs/ that names
// a file that does not exist, or a heading its file does not have.
func TestDocLinks(t *testing.T) {
	docs := map[string]mdDoc{}
	parsed := func(p string) mdDoc {
		p = filepath.Clean(p)
		if d, ok := docs[p]; ok {
			return d
		}
		docs[p] = parseMarkdown(t, p)
		return docs[p]
	}
	for _, file := range markdownFiles(t) {
		for _, l := range parsed(file).links {
			lineNo, target, _ := strings.Cut(l, ":")
			if u, err := url.Parse(target); err == nil && u.Scheme != "" {
				continue // http(s), mailto: not checked here
			}
			path, frag, _ := strings.Cut(target, "#")
			dest := filepath.Clean(file)
			if path != "" {
				dest = filepath.Join(filepath.Dir(file), path)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s:%s: link to %s: no such file", file, lineNo, target)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(dest, ".md") && !parsed(dest).anchors[frag] {
				t.Errorf("%s:%s: link to %s: %s has no heading #%s", file, lineNo, target, dest, frag)
			}
		}
	}
}

// proseDocs is the text of docs/*.md (not the generated reference):
// where every command, flag and pseudo-file is explained.
func proseDocs(t *testing.T) string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(docsDir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
	}
	return all.String()
}

// TestDocsCoverCommands fails when a command, a flag that is not hidden,
// or a file of the control directory is not explained in docs/ (the
// generated reference lists them all, but says little).
func TestDocsCoverCommands(t *testing.T) {
	text := proseDocs(t)
	root := referenceRoot(t)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Name() == "completion" || c.Hidden {
			return
		}
		if c.HasParent() && !strings.Contains(text, c.CommandPath()) {
			t.Errorf("docs/ never names the command %q", c.CommandPath())
		}
		c.NonInheritedFlags().VisitAll(func(f *pflag.Flag) {
			if f.Hidden || f.Name == "help" {
				return
			}
			if !regexp.MustCompile(`(^|[^\w-])--` + regexp.QuoteMeta(f.Name) + `([^\w-]|$)`).MatchString(text) {
				t.Errorf("docs/ never explains %s --%s", c.CommandPath(), f.Name)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	for _, f := range []string{".dlfs/stats", ".dlfs/stats.prom", ".dlfs/accesslog", ".dlfs/control",
		".dlfs/jobs/JOB/rank-R/epoch-E", ".dlfs/jobs/JOB/rank-R/epoch-E.batches", ".dlfs/jobs/JOB/rank-R/advice"} {
		if !strings.Contains(text, "`"+f+"`") {
			t.Errorf("docs/ never explains the control file %s", f)
		}
	}
}
