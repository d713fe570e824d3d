package control

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Report carries one rank's loader figures, written by the Python helper
// (dlfs.DataLoader) every few seconds, for package allocator:
//
//	report job=NAME rank=R epoch=E batch=B workers=W prefetch=P
//	       step=S wait=S decode=S cpu=S samples=N pid=PID start=S length=N
//
//	step     mean seconds the training loop held a batch (its model step)
//	wait     mean seconds it waited for the next batch
//	decode   mean seconds a worker spent per sample (__getitem__: read and decode)
//	cpu      mean CPU seconds a worker spent per sample
//	samples  how many samples the means cover
//	start    seconds from an epoch's start to its first batch (the workers
//	         starting), for the last epoch that started in the interval
//	length   samples in an epoch
//
// workers is the DataLoader's num_workers (0: the main process loads),
// prefetch its prefetch_factor (default 2), pid its main process (its
// workers' reads are its). prefetch, pid, start and length are optional. Every figure must be finite
// and within the limits below, or the whole write is refused (EINVAL).
type Report struct {
	Job      string
	Rank     int
	Epoch    int
	Batch    int
	Workers  int
	Prefetch int
	Step     float64
	Wait     float64
	Decode   float64
	CPU      float64
	Samples  int
	Pid      int     // 0: not given
	Start    float64 // 0: not given
	Length   int     // 0: not given
}

func (Report) command() {}

// Limits on report figures: beyond them a figure is a bug, not a
// measurement.
const (
	MaxReportWorkers  = 1024
	MaxReportPrefetch = 1024
	MaxReportBatch    = 1 << 20
	MaxReportSeconds  = 1e5 // per batch or per sample
	MaxReportSamples  = 1 << 40
	MaxPid            = 1 << 22 // Linux's pid_max limit
)

// reportKeys are the keys of a report line; optional marks those that may
// be left out.
var (
	reportKeys = []string{"job", "rank", "epoch", "batch", "workers", "prefetch", "step", "wait", "decode", "cpu", "samples", "pid", "start", "length"}
	optional   = map[string]bool{"prefetch": true, "pid": true, "start": true, "length": true}
)

func parseReport(fields []string) (Report, error) {
	r := Report{Prefetch: 2}
	seen := map[string]bool{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return r, fmt.Errorf("%w: report: %q is not key=value", ErrSyntax, clip(f))
		}
		if seen[k] {
			return r, fmt.Errorf("%w: report: %s given twice", ErrSyntax, clip(k))
		}
		seen[k] = true
		var err error
		switch k {
		case "job":
			err = checkName(v)
			r.Job = v
		case "rank":
			r.Rank, err = parseInt(v, 0, MaxWorld-1)
		case "epoch":
			r.Epoch, err = parseInt(v, 0, MaxEpoch)
		case "batch":
			r.Batch, err = parseInt(v, 1, MaxReportBatch)
		case "workers":
			r.Workers, err = parseInt(v, 0, MaxReportWorkers)
		case "prefetch":
			r.Prefetch, err = parseInt(v, 1, MaxReportPrefetch)
		case "step":
			r.Step, err = parseSeconds(v)
		case "wait":
			r.Wait, err = parseSeconds(v)
		case "decode":
			r.Decode, err = parseSeconds(v)
		case "cpu":
			r.CPU, err = parseSeconds(v)
		case "samples":
			r.Samples, err = parseInt(v, 1, MaxReportSamples)
		case "pid":
			r.Pid, err = parseInt(v, 1, MaxPid)
		case "start":
			r.Start, err = parseSeconds(v)
		case "length":
			r.Length, err = parseInt(v, 1, MaxReportSamples)
		default:
			return r, fmt.Errorf("%w: report: unknown key %q; known: %s", ErrSyntax, clip(k), strings.Join(reportKeys, ", "))
		}
		if err != nil {
			return r, fmt.Errorf("%w: report: %s=%q: %v", ErrSyntax, k, clip(v), err)
		}
	}
	var required []string
	for _, k := range reportKeys {
		if !optional[k] {
			required = append(required, k)
		}
	}
	for _, k := range required {
		if !seen[k] {
			return r, fmt.Errorf("%w: report: %s= is missing; a report needs %s", ErrSyntax, k, strings.Join(required, ", "))
		}
	}
	return r, nil
}

// parseSeconds parses a non-negative, finite number of seconds up to
// MaxReportSeconds.
func parseSeconds(s string) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("want a number of seconds")
	}
	if v < 0 || v > MaxReportSeconds {
		return 0, fmt.Errorf("want seconds between 0 and %g", float64(MaxReportSeconds))
	}
	return v, nil
}

// Line renders r as the report line that parses back to it.
func (r Report) Line() string {
	line := fmt.Sprintf("report job=%s rank=%d epoch=%d batch=%d workers=%d prefetch=%d step=%g wait=%g decode=%g cpu=%g samples=%d",
		r.Job, r.Rank, r.Epoch, r.Batch, r.Workers, r.Prefetch, r.Step, r.Wait, r.Decode, r.CPU, r.Samples)
	if r.Pid > 0 {
		line += fmt.Sprintf(" pid=%d", r.Pid)
	}
	if r.Start > 0 {
		line += fmt.Sprintf(" start=%g", r.Start)
	}
	if r.Length > 0 {
		line += fmt.Sprintf(" length=%d", r.Length)
	}
	return line
}
