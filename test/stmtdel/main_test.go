package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A module whose tests catch some deletions and miss others.
var module = map[string]string{
	"go.mod": "module example.com/m\n\ngo 1.22\n",
	"p/p.go": `package p

import (
	"errors"
	"fmt"
	"strconv"
)

var ErrNeg = errors.New("negative")

// Check is tested: deleting its if or its return is caught.
func Check(n int) error {
	if n < 0 {
		return ErrNeg
	}
	return nil
}

var total int

// Add is not tested: deleting its update escapes.
func Add(n int) {
	total += n
}

// Count loops until i reaches 3: without its update it never ends.
func Count() int {
	i := 0
	for i < 3 {
		i = i + 1
	}
	return i
}

// Parse's check is err's only use: deleted, it is tried with _ = err.
func Parse(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, err
	}
	return n, nil
}

// Hello's call is fmt's only use: without it, it does not build.
func Hello() {
	fmt.Print("")
}
`,
	"p/p_test.go": `package p

import "testing"

func TestCheck(t *testing.T) {
	if Check(-1) != ErrNeg || Check(1) != nil {
		t.Fatal("Check")
	}
}

func TestCount(t *testing.T) {
	if Count() != 3 {
		t.Fatal("Count")
	}
	if _, err := Parse("x"); err == nil {
		t.Fatal("Parse")
	}
	Hello()
}
`,
}

func writeModule(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, src := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestRunOutcomes: each deletion in a small module gets the outcome its
// tests give it, the score counts caught and escaped only, -threshold
// fails a score under it, and the tree is never written.
func TestRunOutcomes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test on a dozen mutants")
	}
	dir := writeModule(t, module)
	t.Chdir(dir)
	report := filepath.Join(t.TempDir(), "report.json")
	var out, errs strings.Builder
	code := run(context.Background(), []string{"-timeout", "5s", "-threshold", "81", "-json", report, "p"}, &out, &errs)
	if code != 1 {
		t.Errorf("exit %d, want 1 (under the threshold); stderr: %s", code, errs.String())
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	got := map[string]Outcome{}
	for _, r := range rep.Results {
		got[r.Text] = r.Outcome
	}
	want := map[string]Outcome{
		"if n < 0 {":      Caught,
		"return ErrNeg":   Caught,
		"total += n":      Escaped,
		"i = i + 1":       TimedOut,
		"if err != nil {": Caught,
		"return 0, err":   Caught,
		"fmt.Print(\"\")": Invalid,
	}
	for text, o := range want {
		if got[text] != o {
			t.Errorf("deleting %q: %s, want %s", text, got[text], o)
		}
	}
	if len(rep.Results) != len(want) {
		t.Errorf("%d mutants, want %d: %v", len(rep.Results), len(want), rep.Results)
	}
	if rep.Caught != 4 || rep.Escaped != 1 || rep.TimedOut != 1 || rep.Invalid != 1 || rep.Score != 80 {
		t.Errorf("report: %d caught, %d escaped, %d timed out, %d invalid, score %.1f", rep.Caught, rep.Escaped, rep.TimedOut, rep.Invalid, rep.Score)
	}
	if !strings.Contains(out.String(), "4 caught, 1 escaped, 1 timed out, 1 did not build; score 80.0%") {
		t.Errorf("summary line missing:\n%s", out.String())
	}
	if src, _ := os.ReadFile(filepath.Join(dir, "p", "p.go")); string(src) != module["p/p.go"] {
		t.Error("the run wrote the tree's source")
	}
}

// TestRunRefuses: a package whose tests fail unmutated, bad flags and a
// directory without Go files end with exit 2 and a reason.
func TestRunRefuses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test")
	}
	files := map[string]string{"go.mod": module["go.mod"], "p/p.go": module["p/p.go"],
		"p/p_test.go": "package p\n\nimport \"testing\"\n\nfunc TestFails(t *testing.T) { t.Fatal(\"no\") }\n"}
	t.Chdir(writeModule(t, files))
	if err := os.Mkdir("empty", 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"p"}, "tests fail unmutated"},
		{[]string{"empty"}, "no Go files"},
		{[]string{"-kinds", "call,loop", "p"}, `"loop" is not a kind`},
		{[]string{"-only", "p/p.go:1", "p"}, "no mutant at p/p.go:1"},
		{[]string{}, "usage"},
	} {
		var out, errs strings.Builder
		if code := run(context.Background(), tc.args, &out, &errs); code != 2 || !strings.Contains(errs.String(), tc.want) {
			t.Errorf("stmtdel %v: exit %d, stderr %q; want 2 and %q", tc.args, code, errs.String(), tc.want)
		}
	}
}

// TestList: -list prints each mutant as FILE:LINE KIND: TEXT and runs
// nothing; -only keeps those at one line.
func TestList(t *testing.T) {
	t.Chdir(writeModule(t, module))
	var out, errs strings.Builder
	if code := run(context.Background(), []string{"-list", "-only", "p/p.go:14", "./p"}, &out, &errs); code != 0 {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	if out.String() != "p/p.go:14 return: return ErrNeg\n" {
		t.Errorf("listed %q", out.String())
	}
}
