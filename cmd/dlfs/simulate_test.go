package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSimulate runs the command as a user would, with --json and --out:
// the object has the documented keys and the files are there.
func TestSimulate(t *testing.T) {
	out := t.TempDir()
	cmd := newRootCmd()
	var stdout bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetArgs([]string{"simulate", "--nodes", "4,16", "--batch", "64", "--samples", "20000", "--epochs", "3",
		"--cache-ratio", "0.5", "--json", "--out", out})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	var res struct {
		Imbalance map[string]float64 `json:"imbalance_pct"`
		Network   map[string]float64 `json:"network_fraction"`
		Configs   []map[string]any   `json:"configs"`
		PFS       []map[string]any   `json:"pfs_samples"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	for _, k := range []string{"median", "p25", "p75", "p90"} {
		if _, ok := res.Imbalance[k]; !ok {
			t.Errorf("imbalance_pct has no %q: %v", k, res.Imbalance)
		}
	}
	if res.Network["stock"] <= res.Network["locality"] || len(res.Configs) != 2 || len(res.PFS) != 3 {
		t.Errorf("network %v, %d configs, %d PFS epochs", res.Network, len(res.Configs), len(res.PFS))
	}
	for _, f := range []string{"imbalance", "network", "epoch_time", "pfs"} {
		for _, ext := range []string{".csv", ".svg", ".png"} {
			if st, err := os.Stat(filepath.Join(out, f+ext)); err != nil || st.Size() == 0 {
				t.Errorf("%s%s: %v", f, ext, err)
			}
		}
	}
}

func TestSimulateBadInput(t *testing.T) {
	for _, args := range [][]string{
		{"--nodes", "0"}, {"--batch", "-1"}, {"--cache-ratio", "2"}, {"--samples", "0"}, {"--pfs-rate", "-5"},
	} {
		cmd := newRootCmd()
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs(append([]string{"simulate"}, args...))
		err := cmd.Execute()
		if err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v, want a one-line error", args, err)
		}
	}
}
