package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestRecordIO: a RecordIO file written as im2rec writes it (by a script
// following its layout, a split record included) mounts as LABEL/ID.jpg
// with the image bytes, and ImageFolder finds the labels as classes.
func TestRecordIO(t *testing.T) {
	src := t.TempDir()
	out, err := exec.Command("/usr/bin/python3", "write_recordio.py", filepath.Join(src, "train"), "60", "5").Output()
	if err != nil {
		t.Fatalf("write_recordio.py: %v", err)
	}
	var want map[string]string
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatal(err)
	}
	d := startDlfs(t, src)
	got := map[string]string{}
	err = filepath.WalkDir(d.Mnt, func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(d.Mnt, p)
		sum := sha256.Sum256(b)
		got[rel] = hex.EncodeToString(sum[:])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 60 || string(mustJSON(got)) != string(mustJSON(want)) {
		t.Errorf("the mount shows %d images; first differences:", len(got))
		n := 0
		for p, w := range want {
			if got[p] != w && n < 5 {
				t.Errorf("  %s: %q, want %q", p, got[p], w)
				n++
			}
		}
	}
	idx := imageFolder(t, d.Mnt)
	if strings.Join(idx.Classes, ",") != "0,1,2,3,4" || len(idx.Samples) != 60 {
		t.Errorf("ImageFolder over the RecordIO mount: classes %v, %d samples", idx.Classes, len(idx.Samples))
	}

	// Without the .idx the records are walked; with an .idx that does not
	// match, it is ignored. The tree is the same either way.
	for _, idxText := range []string{"", "0\t0\n1\t40\n"} {
		other := t.TempDir()
		rec, _ := os.ReadFile(filepath.Join(src, "train.rec"))
		os.WriteFile(filepath.Join(other, "train.rec"), rec, 0o644)
		if idxText != "" {
			os.WriteFile(filepath.Join(other, "train.idx"), []byte(idxText), 0o644)
		}
		o := startDlfs(t, other)
		again := imageFolder(t, o.Mnt)
		if string(mustJSON(again)) != string(mustJSON(idx)) {
			t.Errorf("with .idx %q the mount differs from the one listed by a good .idx", idxText)
		}
	}
}

// TestHDF5: an HDF5 file written by h5py mounts as .npy files, one per
// row, that numpy loads equal to the HDF5 rows (dtype, shape, values; a
// big-endian and a chunked dataset included).
func TestHDF5(t *testing.T) {
	src := t.TempDir()
	h5 := filepath.Join(src, "data.h5")
	if out, err := exec.Command("/usr/bin/python3", "hdf5_check.py", "write", h5).CombinedOutput(); err != nil {
		t.Fatalf("hdf5_check.py write: %v\n%s(make test installs python3-h5py)", err, out)
	}
	d := startDlfs(t, src)
	out, err := exec.Command("/usr/bin/python3", "hdf5_check.py", "check", h5, d.Mnt).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "58" {
		t.Fatalf("hdf5_check.py check: %v\n%s", err, out)
	}

	// The same file cut in half refuses to mount, naming it.
	cut := t.TempDir()
	b, err := os.ReadFile(h5)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cut, "cut.h5"), b[:len(b)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin.dlfs, "mount", cut, t.TempDir())
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil || !strings.Contains(stderr.String(), "cut.h5") ||
		strings.Count(strings.TrimSpace(stderr.String()), "\n") > 0 {
		t.Errorf("mounting a truncated HDF5 file: %v, stderr %q", err, stderr.String())
	}
}
