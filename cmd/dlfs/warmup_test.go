package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlfs/dlfs/warmup"
)

// fakeControl is a control directory whose stats show the warm-up st.
func fakeControl(t *testing.T, st warmup.Status) string {
	t.Helper()
	ctl := t.TempDir()
	b, err := json.Marshal(map[string]any{"warmup": st})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ctl, "stats"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ctl, "control"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return ctl
}

// TestWarmNoCache: a warm-up on a mount whose caches hold nothing fails
// with one line and no progress, instead of showing 100% and exiting 0;
// one of paths holding no bytes says so and succeeds.
func TestWarmNoCache(t *testing.T) {
	var out strings.Builder
	err := warm(&out, fakeControl(t, warmup.Status{State: "done", Files: 3, Bytes: 3 << 20}), []string{""})
	if err == nil || !strings.Contains(err.Error(), "--ram-cache") || strings.Contains(err.Error(), "\n") || out.Len() > 0 {
		t.Errorf("no cache: %v, printed %q", err, out.String())
	}
	out.Reset()
	if err := warm(&out, fakeControl(t, warmup.Status{State: "done"}), []string{"empty"}); err != nil || !strings.Contains(out.String(), "nothing to warm") {
		t.Errorf("no bytes: %v, printed %q", err, out.String())
	}
	out.Reset()
	if err := warm(&out, fakeControl(t, warmup.Status{State: "done", Files: 3, Bytes: 3 << 20, FitBytes: 3 << 20, DoneBytes: 3 << 20, Seconds: 2}), []string{""}); err != nil ||
		strings.Count(out.String(), "100.0%") != 1 {
		t.Errorf("a done warm-up: %v, printed %q", err, out.String())
	}
}

// TestProgressETA: the progress line tells the time left at the present
// rate, and once over the time taken.
func TestProgressETA(t *testing.T) {
	st := warmup.Status{State: "running", FitBytes: 100 << 20, DoneBytes: 40 << 20, BytesPerSec: 1 << 20, DoneFiles: 40}
	if got := progress(st); !strings.HasSuffix(got, "40.0 MiB / 100.0 MiB, 1.0 MiB/s, 40 files, ETA 1m0s") {
		t.Errorf("running: %q", got)
	}
	st.BytesPerSec = 0
	if got := progress(st); !strings.HasSuffix(got, "ETA -") {
		t.Errorf("no rate yet: %q", got)
	}
	st.State, st.Seconds = "done", 75
	if got := progress(st); !strings.HasSuffix(got, "took 1m15s") {
		t.Errorf("done: %q", got)
	}
}
