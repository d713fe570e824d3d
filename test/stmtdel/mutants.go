package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"slices"
	"strings"
)

// Kind is what a mutant deletes.
type Kind string

// The statements a mutant deletes, one at a time.
const (
	Call   Kind = "call"   // a call made for its effect: a check, a release, a notification
	Return Kind = "return" // a return that is not a function's last statement: an early exit, often of an error
	If     Kind = "if"     // an if statement with its else: a check and what it does
	Defer  Kind = "defer"  // a deferred call: a release, an unlock, a close
	Assign Kind = "assign" // an assignment with = or op=: a state update (:= declares, and is kept)
)

// Kinds lists every kind, in the order the usage names them.
var Kinds = []Kind{Call, Return, If, Defer, Assign}

// Mutant is one statement to delete.
type Mutant struct {
	File       string // the file's path, as given to Find
	Line       int    // where the statement starts
	Kind       Kind
	Start, End int    // the statement's bytes in the file
	Text       string // the statement's first line, trimmed
}

func (m Mutant) String() string {
	return fmt.Sprintf("%s:%d %s: %s", m.File, m.Line, m.Kind, m.Text)
}

// Find lists the statements of src (the file at path) that a mutant may
// delete, of the kinds in kinds, in the order they appear. A statement
// inside another one (a call inside an if's body) is a mutant of its own.
// Logging calls are left out: no test should depend on a log line, so
// deleting one would only count an escape that means nothing.
func Find(path string, src []byte, kinds map[Kind]bool) ([]Mutant, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []Mutant
	add := func(s ast.Stmt, k Kind) {
		if !kinds[k] {
			return
		}
		start, end := fset.Position(s.Pos()), fset.Position(s.End())
		line, _, _ := strings.Cut(string(src[start.Offset:end.Offset]), "\n")
		out = append(out, Mutant{File: path, Line: start.Line, Kind: k, Start: start.Offset, End: end.Offset, Text: strings.TrimSpace(line)})
	}
	// list visits a statement list; body is true for a function's body,
	// whose last return cannot go (the function would not compile).
	list := func(stmts []ast.Stmt, body bool) {
		for i, s := range stmts {
			switch s := s.(type) {
			case *ast.ExprStmt:
				if c, ok := s.X.(*ast.CallExpr); ok && !isLogCall(c) {
					add(s, Call)
				}
			case *ast.ReturnStmt:
				if !body || i < len(stmts)-1 {
					add(s, Return)
				}
			case *ast.IfStmt:
				add(s, If)
			case *ast.DeferStmt:
				if !isLogCall(s.Call) {
					add(s, Defer)
				}
			case *ast.AssignStmt:
				if s.Tok != token.DEFINE && !allBlank(s.Lhs) {
					add(s, Assign)
				}
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			if n.Body != nil {
				list(n.Body.List, true)
				inner(n.Body, list)
			}
			return false
		case *ast.FuncLit:
			list(n.Body.List, true)
			inner(n.Body, list)
			return false
		}
		return true
	})
	slices.SortFunc(out, func(a, b Mutant) int { return a.Start - b.Start })
	return out, nil
}

// inner visits the statement lists nested in body (blocks, cases,
// function literals), each once.
func inner(body *ast.BlockStmt, list func([]ast.Stmt, bool)) {
	for _, s := range body.List {
		ast.Inspect(s, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncLit:
				list(n.Body.List, true)
				inner(n.Body, list)
				return false
			case *ast.BlockStmt:
				list(n.List, false)
			case *ast.CaseClause:
				list(n.Body, false)
			case *ast.CommClause:
				list(n.Body, false)
			}
			return true
		})
	}
}

// isLogCall reports whether c is a call of a logger's method (x.Debug,
// x.Info, x.Warn, x.Error, their Context forms and Log, where x's name
// starts with "log" or ends with "logger"), or of a function in package
// log or slog.
func isLogCall(c *ast.CallExpr) bool {
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	if id, ok := sel.X.(*ast.Ident); ok && (id.Name == "log" || id.Name == "slog") {
		return true
	}
	switch strings.TrimSuffix(sel.Sel.Name, "Context") {
	case "Debug", "Info", "Warn", "Error", "Log", "LogAttrs":
	default:
		return false
	}
	name := strings.ToLower(exprName(sel.X))
	return strings.HasPrefix(name, "log") || strings.HasSuffix(name, "logger") // not catalog
}

// exprName is the last name in x: "log" for c.log, s.cfg.Logger().
func exprName(x ast.Expr) string {
	switch x := x.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		return x.Sel.Name
	case *ast.CallExpr:
		return exprName(x.Fun)
	case *ast.ParenExpr:
		return exprName(x.X)
	}
	return ""
}

func allBlank(xs []ast.Expr) bool {
	for _, x := range xs {
		if id, ok := x.(*ast.Ident); !ok || id.Name != "_" {
			return false
		}
	}
	return true
}

// Apply returns src with m's statement deleted: its bytes become spaces,
// its newlines stay, so that every other line keeps its number and a
// failing test's line points into the original. Each of keep, a
// variable the statement was the only use of, is used in its place
// ("_ = err"), so that deleting the check in
//
//	v, err := f()
//	if err != nil { return err }
//
// still builds.
func Apply(src []byte, m Mutant, keep ...string) []byte {
	var uses string
	for _, k := range keep {
		uses += "_ = " + k + "; "
	}
	out := make([]byte, 0, len(src)+len(uses))
	out = append(append(out, src[:m.Start]...), uses...)
	for _, c := range src[m.Start:m.End] {
		if c != '\n' {
			c = ' '
		}
		out = append(out, c)
	}
	return append(out, src[m.End:]...)
}

// unusedRE matches the compiler's complaint about a variable whose only
// use a mutant deleted.
var unusedRE = regexp.MustCompile(`(?m): declared and not used: ([\pL_][\pL\pN_]*)$`)

// Unused returns the variables go test's output says are declared and not
// used, each once.
func Unused(output string) []string {
	var names []string
	for _, m := range unusedRE.FindAllStringSubmatch(output, -1) {
		if !slices.Contains(names, m[1]) {
			names = append(names, m[1])
		}
	}
	return names
}
