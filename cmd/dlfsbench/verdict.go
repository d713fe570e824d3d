package main

import (
	"fmt"
	"math"
)

// Every target line the bench prints ends in a verdict: "met" or "NOT met"
// for figures it measured, and "not measured" where a figure the target
// rests on could not be measured. Such a figure is NaN (notMeasured), so
// that every sum, ratio, min and max made from it is NaN too; an infinity
// is a ratio over a zero that a measured time or rate never is, and counts
// as not measured as well. A target that holds by construction is no
// target, and is not printed as one.

// notMeasured stands for a figure that could not be measured.
var notMeasured = math.NaN()

// measured reports whether every figure was measured: none is NaN or
// infinite.
func measured(figures ...float64) bool {
	for _, f := range figures {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return false
		}
	}
	return true
}

// verdict is the verdict on a target: ok says whether the figures meet it,
// which counts only if every figure it rests on was measured.
func verdict(ok bool, figure float64, more ...float64) string {
	if !measured(figure) || !measured(more...) {
		return "not measured"
	}
	if ok {
		return "met"
	}
	return "NOT met"
}

// atLeast is the verdict on the target got ≥ want.
func atLeast(got, want float64) string { return verdict(got >= want, got) }

// atMost is the verdict on the target got ≤ want.
func atMost(got, want float64) string { return verdict(got <= want, got) }

// show formats a figure with format, or says it was not measured.
func show(format string, v float64) string {
	if !measured(v) {
		return "not measured"
	}
	return fmt.Sprintf(format, v)
}

// perUnit is n over of, or notMeasured when of is not positive: a share of
// nothing, a rate over no time.
func perUnit(n, of float64) float64 {
	if !(of > 0) {
		return notMeasured
	}
	return n / of
}
