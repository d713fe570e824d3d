package main

import (
	"errors"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/dlfs/dlfs/test/mountproc"
)

func TestVerdict(t *testing.T) {
	inf := math.Inf(1)
	for _, c := range []struct {
		name string
		got  string
		want string
	}{
		{"at least, above", atLeast(1.3, 1.2), "met"},
		{"at least, equal", atLeast(1.2, 1.2), "met"},
		{"at least, below", atLeast(1.1, 1.2), "NOT met"},
		{"at most, below", atMost(0.1, 0.15), "met"},
		{"at most, equal", atMost(0.15, 0.15), "met"},
		{"at most, above", atMost(0.2, 0.15), "NOT met"},
		{"at least, NaN", atLeast(notMeasured, 1.2), "not measured"},
		{"at most, NaN", atMost(notMeasured, 0.15), "not measured"},
		{"at least, +Inf", atLeast(inf, 1.2), "not measured"},
		{"at most, -Inf", atMost(math.Inf(-1), 0.7), "not measured"},
		// ok says met, but a figure it rests on was not measured.
		{"ok with a NaN figure", verdict(true, 0, notMeasured), "not measured"},
		{"ok with an infinite figure", verdict(true, inf), "not measured"},
		{"ok, every figure measured", verdict(true, 0, 1, 2), "met"},
		{"not ok, every figure measured", verdict(false, 0, 1), "NOT met"},
	} {
		if c.got != c.want {
			t.Errorf("%s: %q, want %q", c.name, c.got, c.want)
		}
	}
}

// TestNotMeasuredPropagates is the rule the suites rely on: a figure made
// from one not measured (a sum, a ratio, min, max, slices.Min) is not
// measured either, so no verdict over it can say met.
func TestNotMeasuredPropagates(t *testing.T) {
	x := notMeasured
	for name, v := range map[string]float64{
		"sum": 3 + x, "ratio over": 3 / x, "ratio of": x / 3, "min": min(math.Inf(1), x, 2), "max": max(0.0, x),
		"per unit of nothing": perUnit(5, 0), "per unit of a negative": perUnit(5, -1), "per unit of NaN": perUnit(5, x),
	} {
		if measured(v) {
			t.Errorf("%s: %v counts as measured", name, v)
		}
		if got := atLeast(v, -1e300); got != "not measured" {
			t.Errorf("%s: atLeast = %q", name, got)
		}
	}
	if perUnit(6, 3) != 2 {
		t.Errorf("perUnit(6, 3) = %v", perUnit(6, 3))
	}
	if got := show("%.2f×", 1.5); got != "1.50×" {
		t.Errorf("show = %q", got)
	}
	if got := show("%.2f×", notMeasured); got != "not measured" {
		t.Errorf("show(NaN) = %q", got)
	}
}

// TestAllocationTargets: the allocation suite's two targets, over rounds
// where nothing was measured, are "not measured", never met.
func TestAllocationTargets(t *testing.T) {
	pred := 100.0
	warm := []standinEpoch{{Start: 1, End: 3, Samples: 64, Predicted: &pred}} // in the warm window only
	if r, _ := allocRate(warm); measured(r) {
		t.Errorf("a rate over no epoch after the warm window: %v, want not measured", r)
	}
	if e, s, n := allocAccuracy(warm); measured(e) || measured(s) || n != 0 {
		t.Errorf("prediction error over no epoch: %v, %v, %d; want not measured", e, s, n)
	}
	// Epochs after the window with no prediction: no error measured.
	late := []standinEpoch{{Start: allocWarm + 1, First: allocWarm + 1.5, End: allocWarm + 3, Samples: 64}}
	if e, _, _ := allocAccuracy(late); measured(e) {
		t.Errorf("prediction error with no prediction: %v", e)
	}
	// The worst error over jobs, one of which measured none.
	worst := 0.0
	late[0].Predicted = &pred
	for _, eps := range [][]standinEpoch{late, warm} {
		e, _, _ := allocAccuracy(eps)
		worst = max(worst, e)
	}
	if got := atMost(worst, 0.15); got != "not measured" {
		t.Errorf("prediction target with a job unmeasured: %q", got)
	}
	// An even-mode aggregate rate of 0: the gain is no figure.
	if got := atLeast(perUnit(500, 0+0+0), 1.2); got != "not measured" {
		t.Errorf("gain over an even rate of 0: %q", got)
	}
	// A measured round.
	r, w := allocRate(late)
	if r != 64/2.0 || w != 0 {
		t.Errorf("allocRate = %v, %d; want 32 samples/s", r, w)
	}
	if e, s, n := allocAccuracy(late); math.Abs(e-(100-32)/32.0) > 1e-12 || s != 0.25 || n != 1 {
		t.Errorf("allocAccuracy = %v, %v, %d", e, s, n)
	}
}

func TestVmRSS(t *testing.T) {
	good := "Name:\tdlfs\nVmPeak:\t  9000 kB\nVmRSS:\t    1234 kB\nThreads:\t4\n"
	if n, err := vmRSS("status", []byte(good)); err != nil || n != 1234<<10 {
		t.Fatalf("vmRSS = %d, %v; want %d", n, err, 1234<<10)
	}
	for name, b := range map[string]string{
		"no line":   "Name:\tkthreadd\nThreads:\t1\n",
		"not a num": "VmRSS:\t   lots kB\n",
		"zero":      "VmRSS:\t   0 kB\n",
		"no unit":   "VmRSS:\t   12\n",
		"empty":     "",
	} {
		if n, err := vmRSS("status", []byte(b)); err == nil {
			t.Errorf("%s: %d bytes, want an error", name, n)
		}
	}
}

// TestRSSOfExitedProcess: the RSS of a process that is gone is an error,
// not 0 bytes (which made the bytes per file negative, and "met").
func TestRSSOfExitedProcess(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip(err)
	}
	if n, err := rss(&mountproc.Proc{Cmd: cmd}); err == nil {
		t.Fatalf("rss of an exited process = %d, want an error", n)
	}
	self := &mountproc.Proc{Cmd: &exec.Cmd{Process: &os.Process{Pid: os.Getpid()}}}
	if n, err := rss(self); err != nil || n <= 0 {
		t.Fatalf("rss of this process = %d, %v", n, err)
	}
}

// TestWarmThenEpoch: a failed read of the PFS counter at any of its three
// points fails the measurement, whatever the steps between do.
func TestWarmThenEpoch(t *testing.T) {
	boom := errors.New("counter dump missing")
	for fail := 0; fail < 3; fail++ {
		calls := 0
		counter := func() (int64, error) {
			calls++
			if calls-1 == fail {
				return 0, boom
			}
			return int64(calls) * 1000, nil
		}
		_, err := warmThenEpoch(counter, func() error { return nil }, func() (float64, error) { return 1, nil })
		if !errors.Is(err, boom) {
			t.Errorf("counter read %d failed: %v, want the failure", fail, err)
		}
	}
	calls := 0
	counter := func() (int64, error) { calls++; return int64(calls*calls) * 100, nil } // 100, 400, 900
	w, err := warmThenEpoch(counter, func() error { return nil }, func() (float64, error) { return 2.5, nil })
	if err != nil || w.warmPFS != 300 || w.epochPFS != 500 || w.epochSecs != 2.5 {
		t.Fatalf("warmThenEpoch = %+v, %v; want 300 and 500 PFS bytes, 2.5 s", w, err)
	}
	stepErr := errors.New("warmup failed")
	if _, err := warmThenEpoch(counter, func() error { return stepErr }, func() (float64, error) { return 1, nil }); !errors.Is(err, stepErr) {
		t.Fatalf("a failed warm-up: %v", err)
	}
	if _, err := warmThenEpoch(counter, func() error { return nil }, func() (float64, error) { return 0, stepErr }); !errors.Is(err, stepErr) {
		t.Fatalf("a failed epoch: %v", err)
	}
}

// TestNoVerdictWithoutFigures: every verdict the suites print goes through
// atLeast, atMost or verdict with its figures: no bare "met" anywhere.
func TestNoVerdictWithoutFigures(t *testing.T) {
	files, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		name := f.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") || name == "verdict.go" {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), `"met"`) || strings.Contains(string(b), `"NOT met"`) {
			t.Errorf("%s prints a verdict of its own; use verdict, atLeast or atMost", name)
		}
	}
}
