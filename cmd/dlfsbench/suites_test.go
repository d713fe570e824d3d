package main

import (
	"slices"
	"strings"
	"testing"
)

func names(ss []suite) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.name)
	}
	return out
}

func TestSuiteNamesUnique(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range suites {
		if s.name == "" || s.name == "all" || strings.ContainsAny(s.name, ", ") {
			t.Errorf("suite name %q cannot be selected by -suites", s.name)
		}
		if seen[s.name] {
			t.Errorf("suite %q listed twice", s.name)
		}
		seen[s.name] = true
		if s.run == nil || s.doc == "" {
			t.Errorf("suite %q: no run function or no doc", s.name)
		}
	}
}

func TestSelectSuites(t *testing.T) {
	// The default set in the order make bench has always run it.
	bench := []string{"mount", "push", "clairvoyance", "untold", "cluster", "balance", "hosts", "zoo",
		"packed", "sealing", "tablechange", "allocation", "advice", "observe", "sharing", "passthrough", "simulate"}
	for _, tc := range []struct {
		name, spec string
		want       []string
	}{
		{"table order", "zoo,mount", []string{"mount", "zoo"}},
		{"exact names", "passthrough", []string{"passthrough"}},
		{"twice runs once", "mount,mount", []string{"mount"}},
		{"all is the default set", "all", bench},
		{"scale only by name", "scale", []string{"scale"}},
		{"all and scale", "scale,all", append(slices.Clone(bench), "scale")},
		{"spaces and empty items", " untold ,,push,", []string{"push", "untold"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := selectSuites(tc.spec)
			if err != nil {
				t.Fatalf("selectSuites(%q): %v", tc.spec, err)
			}
			if !slices.Equal(names(got), tc.want) {
				t.Errorf("selectSuites(%q) = %v, want %v", tc.spec, names(got), tc.want)
			}
		})
	}
}

func TestSelectSuitesUnknown(t *testing.T) {
	for _, spec := range []string{"mount,nosuch", "moun", "mounts", "", ","} {
		t.Run(spec, func(t *testing.T) {
			_, err := selectSuites(spec)
			if err == nil {
				t.Fatalf("selectSuites(%q) = nil error", spec)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("error is not one line: %q", msg)
			}
			for _, s := range suites {
				if !strings.Contains(msg, s.name) {
					t.Errorf("error %q does not name suite %q", msg, s.name)
				}
			}
		})
	}
}
