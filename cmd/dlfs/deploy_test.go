package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestDeployFlags: every flag the deployment files give dlfs exists on
// the command they give it to.
func TestDeployFlags(t *testing.T) {
	root := newRootCmd()
	subs := map[string]*cobra.Command{}
	for _, c := range root.Commands() {
		subs[c.Name()] = c
	}
	files, err := filepath.Glob("../../deploy/*/*")
	if err != nil || len(files) < 3 {
		t.Fatalf("deploy files: %v %v", files, err)
	}
	checked := 0
	for _, path := range files {
		if strings.HasSuffix(path, ".json") {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var sub *cobra.Command
		if strings.HasSuffix(path, ".env") {
			sub = subs["mount"] // DLFS_FLAGS are mount's
		}
		afterDlfs := false
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			tokens := strings.FieldsFunc(line, func(r rune) bool { return strings.ContainsRune(" \t\"',[]", r) })
			for _, tok := range tokens {
				if i := strings.Index(tok, "=--"); i >= 0 {
					tok = tok[i+1:] // DLFS_FLAGS=--ram-cache
				}
				switch {
				case tok == "dlfs" || strings.HasSuffix(tok, "/dlfs"):
					afterDlfs = true
					continue
				case afterDlfs && subs[tok] != nil:
					sub, afterDlfs = subs[tok], false
					continue
				case strings.HasPrefix(tok, "--") && tok != "---":
					name, _, _ := strings.Cut(strings.TrimPrefix(tok, "--"), "=")
					if sub == nil {
						t.Errorf("%s: %s given to no dlfs command", path, tok)
					} else if sub.Flags().Lookup(name) == nil {
						t.Errorf("%s: dlfs %s has no flag --%s", path, sub.Name(), name)
					}
					checked++
				}
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d flags found in the deployment files", checked)
	}
}
