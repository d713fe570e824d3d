package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

const sample = `package p

import (
	"log/slog"
	"sync"
)

type T struct {
	mu  sync.Mutex
	n   int
	log *slog.Logger
}

func (t *T) Add(d int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if d < 0 {
		t.log.Warn("negative", "d", d)
		return errNeg
	}
	x := t.n
	t.n = x + d
	_ = x
	slog.Info("added")
	defer t.log.Debug("done")
	switch d {
	case 1:
		t.n += 10
	}
	f := func() int {
		t.n++
		return t.n
	}
	f()
	return nil
}

func wait(c chan int) {
	select {
	case <-c:
		release()
	}
	return
}
`

// TestFind: each kind is found where it is, in the order of the source;
// logging calls, declarations, blank assignments and a function's last
// return are not mutants.
func TestFind(t *testing.T) {
	all := map[Kind]bool{Call: true, Return: true, If: true, Defer: true, Assign: true}
	ms, err := Find("p.go", []byte(sample), all)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, fmt.Sprintf("%d %s %s", m.Line, m.Kind, m.Text))
	}
	want := []string{
		"15 call t.mu.Lock()",
		"16 defer defer t.mu.Unlock()",
		"17 if if d < 0 {",
		"19 return return errNeg",
		"22 assign t.n = x + d",
		"28 assign t.n += 10",
		"34 call f()",
		"41 call release()",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("mutants:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Only the kinds asked for.
	ms, err = Find("p.go", []byte(sample), map[Kind]bool{Defer: true, Return: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Kind != Defer || ms[1].Kind != Return {
		t.Errorf("defer and return only: %v", ms)
	}
	if _, err := Find("bad.go", []byte("package p\nfunc {"), all); err == nil {
		t.Error("a file that does not parse gave no error")
	}
}

// TestApply: the statement is gone, every other byte and every line
// number stays, and the result still parses.
func TestApply(t *testing.T) {
	src := []byte(sample)
	ms, err := Find("p.go", src, map[Kind]bool{If: true})
	if err != nil || len(ms) != 1 {
		t.Fatalf("%v, %v", ms, err)
	}
	out := Apply(src, ms[0])
	if bytes.Contains(out, []byte("d < 0")) || bytes.Contains(out, []byte("errNeg")) {
		t.Errorf("the if is still there:\n%s", out)
	}
	if len(out) != len(src) || bytes.Count(out, []byte("\n")) != bytes.Count(src, []byte("\n")) {
		t.Errorf("the mutant has %d bytes and %d lines, the source %d and %d", len(out), bytes.Count(out, []byte("\n")), len(src), bytes.Count(src, []byte("\n")))
	}
	if !bytes.Equal(out[:ms[0].Start], src[:ms[0].Start]) || !bytes.Equal(out[ms[0].End:], src[ms[0].End:]) {
		t.Error("bytes outside the statement changed")
	}
	if string(src) != sample {
		t.Error("Apply changed its input")
	}
	if _, err := parser.ParseFile(token.NewFileSet(), "p.go", out, 0); err != nil {
		t.Errorf("the mutant does not parse: %v", err)
	}
}

// TestIsLogCall: loggers' methods and the log and slog packages' calls
// are logging; an Error method on something else is not.
func TestIsLogCall(t *testing.T) {
	for src, want := range map[string]bool{
		`c.log.Warn("x")`:              true,
		`n.cfg.Logger.Info("x")`:       true,
		`s.logger().DebugContext(c)`:   true,
		`slog.Info("x")`:               true,
		`log.Printf("x")`:              true,
		`t.Error("x")`:                 false,
		`conn.Close()`:                 false,
		`release()`:                    false,
		`n.catalog.Error(1)`:           false,
		`h.auditLogger.Info("x")`:      true,
		`blog.Post()`:                  false,
		`(c.log).Error("x", "e", err)`: true,
	} {
		x, err := parser.ParseExpr(src)
		if err != nil {
			t.Fatal(err)
		}
		c, ok := x.(*ast.CallExpr)
		if !ok {
			t.Fatalf("%s is not a call", src)
		}
		if got := isLogCall(c); got != want {
			t.Errorf("isLogCall(%s) = %v, want %v", src, got, want)
		}
	}
}

// TestApplyKeeps: with variables to keep, the deleted statement's place
// uses them, lines stay where they were, and the result parses.
func TestApplyKeeps(t *testing.T) {
	src := []byte("package p\n\nfunc f() error {\n\tv, err := g()\n\tif err != nil {\n\t\treturn err\n\t}\n\treturn use(v)\n}\n")
	ms, err := Find("p.go", src, map[Kind]bool{If: true})
	if err != nil || len(ms) != 1 {
		t.Fatalf("%v, %v", ms, err)
	}
	out := string(Apply(src, ms[0], "err", "v"))
	if want := "\t_ = err; _ = v; "; !strings.Contains(out, "\n"+want) || strings.Contains(out, "return err") {
		t.Errorf("mutant:\n%s", out)
	}
	if strings.Count(out, "\n") != bytes.Count(src, []byte("\n")) || !strings.Contains(out, "\n\treturn use(v)\n}\n") {
		t.Errorf("lines moved:\n%s", out)
	}
	if _, err := parser.ParseFile(token.NewFileSet(), "p.go", out, 0); err != nil {
		t.Errorf("the mutant does not parse: %v", err)
	}
}

// TestUnused: the compiler's "declared and not used" lines give the
// names, each once; other errors give none.
func TestUnused(t *testing.T) {
	out := "# example.com/m/p\np/p.go:9:5: declared and not used: err\np/p.go:12:2: declared and not used: n\n" +
		"p/p.go:20:2: declared and not used: err\np/p.go:3:2: \"fmt\" imported and not used\nFAIL\texample.com/m/p [build failed]\n"
	if got := Unused(out); strings.Join(got, " ") != "err n" {
		t.Errorf("Unused = %q, want err and n", got)
	}
	if got := Unused("p/p.go:3:2: \"fmt\" imported and not used\n"); len(got) != 0 {
		t.Errorf("Unused of an import error = %q", got)
	}
}
