// Command stmtdel is a mutation tester that deletes statements: for each
// statement of a package's non-test files that a check or a release
// lives in (a call made for its effect, an early return, an if with its
// else, a defer, an assignment with =), it deletes that one statement,
// runs the package's tests, and reports whether they caught it.
//
//	go run ./test/stmtdel [flags] ./PKG
//
// gremlins, the other half of make mutate, changes operators; it never
// deletes a statement, so a dropped sum check or a missing release was
// never tried. This is that half (docs/mutation.md).
//
// # Mutants
//
// A mutant's bytes become spaces, its newlines kept, so every line keeps
// its number. The tree is never written: go test builds each mutant
// through -overlay, from a file under TMPDIR. Logging calls are not
// mutants. Files are those go build would compile here (build tags
// honoured); test files are never mutated.
//
// # Outcomes
//
// A statement that was a variable's only use (the check in "v, err :=
// f(); if err != nil {...}") leaves a mutant that does not build; it is
// tried again with "_ = err" in the statement's place.
//
// caught: the tests failed. escaped: they passed. timedout: they ran
// past -coefficient times the unmutated run (at least a minute), or
// -timeout. invalid: the mutant did not build (a deleted call was an
// import's only use; a function lost its only return on a path). The score is caught / (caught + escaped); with
// -threshold, stmtdel exits 1 below it. It exits 2 when it cannot run,
// or when the package's tests fail unmutated.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/build"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// Result is one mutant's outcome.
type Result struct {
	Mutant
	Outcome Outcome
	Seconds float64
}

// Report is what -json writes.
type Report struct {
	Package                            string
	Caught, Escaped, TimedOut, Invalid int
	Score                              float64 // percent; -1 with nothing caught or escaped
	BaselineSeconds, TimeoutSeconds    float64
	Results                            []Result
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("stmtdel", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kindList := fs.String("kinds", "call,return,if,defer,assign", "the statements to delete: call, return, if, defer, assign")
	coefficient := fs.Float64("coefficient", 20, "a mutant's tests may run this many times the unmutated run")
	timeout := fs.Duration("timeout", 0, "a mutant's tests may run this long (0: -coefficient decides)")
	threshold := fs.Float64("threshold", 0, "exit 1 when the score, in percent, is below this")
	workers := fs.Int("workers", 1, "mutants tested at once")
	jsonOut := fs.String("json", "", "write the report as JSON to this file")
	list := fs.Bool("list", false, "list the mutants and run nothing")
	only := fs.String("only", "", "run only the mutants at FILE:LINE (FILE as listed)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: stmtdel [flags] ./PKG\nDeletes PKG's statements one at a time and runs its tests against each (docs/mutation.md).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 || *workers < 1 || *coefficient <= 0 {
		fs.Usage()
		return 2
	}
	kinds, err := parseKinds(*kindList)
	if err != nil {
		fmt.Fprintln(stderr, "stmtdel:", err)
		return 2
	}
	pkg := fs.Arg(0)
	if !filepath.IsAbs(pkg) && !strings.HasPrefix(pkg, ".") {
		pkg = "./" + pkg // a directory, never an import path
	}
	mutants, srcs, err := findAll(pkg, kinds)
	if err != nil {
		fmt.Fprintln(stderr, "stmtdel:", err)
		return 2
	}
	if *only != "" {
		mutants = slices.DeleteFunc(mutants, func(m Mutant) bool { return fmt.Sprintf("%s:%d", m.File, m.Line) != *only })
		if len(mutants) == 0 {
			fmt.Fprintf(stderr, "stmtdel: no mutant at %s (see -list)\n", *only)
			return 2
		}
	}
	if *list {
		for _, m := range mutants {
			fmt.Fprintln(stdout, m)
		}
		return 0
	}

	r := &Runner{Dir: ".", Pkg: pkg, Timeout: 10 * time.Minute, Tmp: os.TempDir()}
	start := time.Now()
	out, text, err := r.Run(ctx, nil)
	base := time.Since(start)
	switch {
	case err != nil:
		fmt.Fprintln(stderr, "stmtdel:", err)
		return 2
	case out != Escaped:
		fmt.Fprintf(stderr, "stmtdel: %s's tests fail unmutated (%s); fix them first:\n%s", pkg, out, text)
		return 2
	}
	r.Timeout = max(time.Duration(*coefficient*float64(base)).Round(time.Second), time.Minute)
	if *timeout > 0 {
		r.Timeout = *timeout
	}
	fmt.Fprintf(stdout, "stmtdel %s: %d mutants; unmutated run %.1fs, timeout %s\n", pkg, len(mutants), base.Seconds(), r.Timeout)

	results := make([]Result, len(mutants))
	var mu sync.Mutex // serialises the lines printed
	var runErr error
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range *workers {
		wg.Go(func() {
			for i := range jobs {
				m := mutants[i]
				t0 := time.Now()
				out, text, err := r.Run(ctx, map[string][]byte{m.File: Apply(srcs[m.File], m)})
				if keep := Unused(text); out == Invalid && len(keep) > 0 {
					// The statement was a variable's only use: use it
					// in the statement's place and run again.
					out, _, err = r.Run(ctx, map[string][]byte{m.File: Apply(srcs[m.File], m, keep...)})
				}
				mu.Lock()
				if err != nil {
					runErr = firstErr(runErr, err)
				} else {
					results[i] = Result{Mutant: m, Outcome: out, Seconds: time.Since(t0).Seconds()}
					fmt.Fprintf(stdout, "%-8s %s\n", out, m)
				}
				mu.Unlock()
			}
		})
	}
feed:
	for i := range mutants {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if runErr == nil && ctx.Err() != nil {
		runErr = errors.New("stopped before every mutant ran")
	}
	if runErr != nil {
		fmt.Fprintln(stderr, "stmtdel:", runErr)
		return 2
	}

	rep := Report{Package: pkg, Results: results, BaselineSeconds: base.Seconds(), TimeoutSeconds: r.Timeout.Seconds()}
	for _, res := range results {
		switch res.Outcome {
		case Caught:
			rep.Caught++
		case Escaped:
			rep.Escaped++
		case TimedOut:
			rep.TimedOut++
		case Invalid:
			rep.Invalid++
		}
	}
	rep.Score = score(rep.Caught, rep.Escaped)
	fmt.Fprintf(stdout, "stmtdel %s: %d caught, %d escaped, %d timed out, %d did not build; score %s\n",
		pkg, rep.Caught, rep.Escaped, rep.TimedOut, rep.Invalid, fmtScore(rep.Score))
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintln(stderr, "stmtdel:", err)
			return 2
		}
	}
	if *threshold > 0 && rep.Score < *threshold {
		fmt.Fprintf(stderr, "stmtdel: %s scores %s, under %.0f%%\n", pkg, fmtScore(rep.Score), *threshold)
		return 1
	}
	return 0
}

// firstErr keeps the first error.
func firstErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// score is caught / (caught + escaped) in percent, or -1 when both are 0.
func score(caught, escaped int) float64 {
	if caught+escaped == 0 {
		return -1
	}
	return 100 * float64(caught) / float64(caught+escaped)
}

func fmtScore(s float64) string {
	if s < 0 {
		return "none (no mutant caught or escaped)"
	}
	return fmt.Sprintf("%.1f%%", s)
}

func parseKinds(s string) (map[Kind]bool, error) {
	kinds := map[Kind]bool{}
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(Kinds, Kind(k)) {
			return nil, fmt.Errorf("-kinds: %q is not a kind; want some of %v", k, Kinds)
		}
		kinds[Kind(k)] = true
	}
	return kinds, nil
}

// findAll lists the mutants of the package in dir, file by file, with
// each file's source.
func findAll(dir string, kinds map[Kind]bool) ([]Mutant, map[string][]byte, error) {
	p, err := build.Default.ImportDir(dir, 0)
	if err != nil {
		var none *build.NoGoError
		if errors.As(err, &none) {
			return nil, nil, fmt.Errorf("%s: no Go files to mutate", dir)
		}
		return nil, nil, fmt.Errorf("%s: %w", dir, err)
	}
	var all []Mutant
	srcs := map[string][]byte{}
	for _, name := range p.GoFiles {
		path := filepath.Join(dir, name)
		src, err := os.ReadFile(path)
		if err != nil {
			return nil, nil, err
		}
		ms, err := Find(path, src, kinds)
		if err != nil {
			return nil, nil, err
		}
		srcs[path] = src
		all = append(all, ms...)
	}
	return all, srcs, nil
}
