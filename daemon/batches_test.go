package daemon

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dlfs/dlfs/access"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/test/datagen"
)

// TestInferredBatches: an inferred job whose reads have not shown the
// loader's batch size has no epoch-E.batches (listed or read) rather than
// one claiming a size; once its line gives batch=16, the file lists 16s.
// Before, every inferred line said batch=32.
func TestInferredBatches(t *testing.T) {
	src := t.TempDir()
	if _, err := datagen.ImageFolder(filepath.Join(src, "val"), datagen.Spec{Classes: 2, Files: 40, MeanSize: 100, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	n, mnt := start(t, src, nil)
	infer := func(line string) {
		t.Helper()
		cmds, err := control.Parse([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		if err := n.jobs.ApplyInferred(access.Cred{}, cmds[0].(control.Job)); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(mnt, ".dlfs/jobs/auto-1/rank-0")
	listed := func() []string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return names
	}
	infer("job=auto-1 root=val epoch=0 sampler=sequential")
	if names := listed(); slices.Contains(names, "epoch-0.batches") || !slices.Contains(names, "epoch-0") {
		t.Errorf("batch size unknown: %v listed", names)
	}
	if _, err := os.ReadFile(filepath.Join(dir, "epoch-0.batches")); !os.IsNotExist(err) {
		t.Errorf("batch size unknown: reading epoch-0.batches: %v, want not-exist", err)
	}
	infer("job=auto-1 root=val epoch=0 sampler=sequential batch=16 workers=2")
	b, err := os.ReadFile(filepath.Join(dir, "epoch-0.batches"))
	if want := "16\n16\n8\n"; err != nil || string(b) != want || !slices.Contains(listed(), "epoch-0.batches") {
		t.Errorf("batch=16: epoch-0.batches %q (%v), want %q; listed %s", b, err, want, strings.Join(listed(), " "))
	}
}
