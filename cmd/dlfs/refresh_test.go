package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlfs/dlfs/daemon"
)

// TestRefreshReport: dlfs refresh writes "refresh" to the control file
// and reports the rescan from stats; a failed one fails with the rescan's
// error.
func TestRefreshReport(t *testing.T) {
	var st daemon.Stats
	st.Catalog.Files, st.Catalog.Dirs, st.Catalog.Bytes = 1200, 3, 5<<20
	st.Catalog.Refresh.Added, st.Catalog.Refresh.Changed, st.Catalog.Refresh.Seconds = 2, 1, 0.25
	mnt := fakeMount(t, st)
	ctl := filepath.Join(mnt, ".dlfs")
	if err := os.WriteFile(filepath.Join(ctl, "control"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	root := newRootCmd()
	root.SetOut(&out)
	root.SetArgs([]string{"refresh", mnt})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(ctl, "control")); string(b) != "refresh\n" {
		t.Errorf("wrote %q to the control file", b)
	}
	if want := "refreshed " + mnt + " in 0.2s: 2 added, 0 removed, 1 changed; now 1,200 files, 3 dirs, 5.0 MiB\n"; out.String() != want {
		t.Errorf("printed %q, want %q", out.String(), want)
	}

	st.Catalog.Refresh.Error = "scan /data: permission denied"
	b, _ := json.Marshal(st)
	if err := os.WriteFile(filepath.Join(ctl, "stats"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(ctl, "control")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(ctl, "control"), 0o755); err != nil { // the write fails
		t.Fatal(err)
	}
	if err := refresh(&out, mnt, ctl); err == nil || !strings.Contains(err.Error(), "permission denied; the mount keeps the catalog it had") {
		t.Errorf("a failed rescan: %v", err)
	}
	root = newRootCmd()
	root.SetArgs([]string{"refresh", t.TempDir()})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "is not a dlfs mount") {
		t.Errorf("refresh of a plain directory: %v", err)
	}
}
