package integration

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlfs/dlfs/test/conformance"
)

// TestPackMount: dlfs pack, then dlfs mount over the pack, shows SOURCE
// byte for byte; ImageFolder over the mount equals ImageFolder over
// SOURCE; --verify passes; packing again does nothing.
func TestPackMount(t *testing.T) {
	src := t.TempDir()
	dataset(t, src, 150)
	conformance.OddTree(t, filepath.Join(src, "class_odd"))
	out := filepath.Join(t.TempDir(), "packed")
	code, stdout, stderr := runCmd(t, bin.dlfs, "pack", src, out, "--shards", "4", "--workers", "4")
	if code != 0 || !strings.Contains(stdout, "packed") {
		t.Fatalf("dlfs pack: exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, _ = runCmd(t, bin.dlfs, "pack", src, out)
	if code != 0 || !strings.Contains(stdout, "nothing to do") {
		t.Errorf("dlfs pack again: exit %d, %q", code, stdout)
	}
	code, stdout, stderr = runCmd(t, bin.dlfs, "pack", "--verify", out, src)
	if code != 0 || !strings.Contains(stdout, "matches") {
		t.Errorf("dlfs pack --verify: exit %d\n%s%s", code, stdout, stderr)
	}
	d := startDlfs(t, out)
	conformance.Tree(t, src, d.Mnt)
	want, got := imageFolder(t, src), imageFolder(t, d.Mnt)
	if len(want.Samples) < 150 || string(mustJSON(got)) != string(mustJSON(want)) {
		t.Errorf("ImageFolder over the packed mount differs from SOURCE (%d and %d samples)", len(got.Samples), len(want.Samples))
	}
	if st := dlfsStats(t, d.Mnt); num(st, "pfs", "opens") > 6 {
		t.Errorf("%v opens of the pack: want the index and each shard once", num(st, "pfs", "opens"))
	}
}

// TestPackBadInput: bad arguments and a verify against another tree fail
// with one line naming the problem.
func TestPackBadInput(t *testing.T) {
	src := t.TempDir()
	dataset(t, src, 10)
	out := filepath.Join(t.TempDir(), "packed")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"pack", filepath.Join(src, "nope"), out}, "not a directory"},
		{[]string{"pack", src, out, "--shards", "0"}, "--shards"},
		{[]string{"pack", "--verify", src, src}, "index.seqidx"},
	} {
		code, _, stderr := runCmd(t, bin.dlfs, c.args...)
		if code == 0 || !strings.Contains(stderr, c.want) || strings.Count(strings.TrimSpace(stderr), "\n") > 0 {
			t.Errorf("dlfs %v: exit %d, stderr %q, want one line with %q", c.args, code, stderr, c.want)
		}
	}
}
