package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Outcome is what a package's tests did with a mutant.
type Outcome string

// The outcomes. Only Caught and Escaped count in the score; a mutant
// that does not build (a deleted statement was a variable's only use, or
// a function's only return on some path) is no test's business.
const (
	Caught   Outcome = "caught"   // the tests failed
	Escaped  Outcome = "escaped"  // the tests passed
	TimedOut Outcome = "timedout" // the tests ran past the timeout
	Invalid  Outcome = "invalid"  // it did not build
)

// Runner runs one package's tests with a file's contents replaced. The
// tree is never written: the mutant goes to a file of Runner's own, and
// go test builds with it through -overlay, so that others working in the
// tree, or a run killed half-way, never meet a mutated source.
type Runner struct {
	Dir     string        // where go test runs (the module, or below it)
	Pkg     string        // the package, as go test takes it: ./integrity
	Timeout time.Duration // for one run of the tests, build included
	Tmp     string        // for the mutants' files and overlays
	Env     []string      // added to the environment of go test
}

// Run runs the tests with the files of replace (path: contents) in place
// of the tree's; none runs them as they are.
func (r *Runner) Run(ctx context.Context, replace map[string][]byte) (Outcome, string, error) {
	args := []string{"test", "-count=1", "-vet=off", "-timeout", r.Timeout.String()}
	if len(replace) > 0 {
		dir, err := os.MkdirTemp(r.Tmp, "mutant")
		if err != nil {
			return "", "", err
		}
		defer os.RemoveAll(dir)
		ov := struct{ Replace map[string]string }{map[string]string{}}
		for path, src := range replace {
			abs, err := filepath.Abs(path)
			if err != nil {
				return "", "", err
			}
			f := filepath.Join(dir, filepath.Base(path))
			if err := os.WriteFile(f, src, 0o644); err != nil {
				return "", "", err
			}
			ov.Replace[abs] = f
		}
		b, _ := json.Marshal(ov)
		overlay := filepath.Join(dir, "overlay.json")
		if err := os.WriteFile(overlay, b, 0o644); err != nil {
			return "", "", err
		}
		args = append(args, "-overlay", overlay)
	}
	args = append(args, r.Pkg)
	// go test's -timeout ends a hung test binary; this one, a minute
	// later, ends a go test that hangs itself (a test binary stuck on a
	// FUSE mount it serves), with every process it started.
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, r.Timeout+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = r.Dir
	cmd.Env = append(os.Environ(), r.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	text := out.String()
	var exit *exec.ExitError
	switch {
	case parent.Err() != nil:
		return "", text, parent.Err() // stopped: no outcome
	case ctx.Err() != nil:
		return TimedOut, text, nil
	case err == nil:
		return Escaped, text, nil
	case !errors.As(err, &exit):
		return "", text, fmt.Errorf("go test %s: %w", r.Pkg, err)
	case strings.Contains(text, "[build failed]") || strings.Contains(text, "[setup failed]"):
		return Invalid, text, nil
	case strings.Contains(text, "panic: test timed out after"):
		return TimedOut, text, nil
	}
	return Caught, text, nil
}
