package main

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlfs/dlfs/control"
)

// Every workload that can be announced is announced by a line the control
// parser accepts, naming the sampler whose order the reader then follows:
// random for the shuffled ones, sequential for the one read in order, and
// extensions that match its files.
func TestZooJobsAnnounceWhatTheReaderReads(t *testing.T) {
	for _, w := range zooWorkloads {
		if w.sampler == "" {
			if w.why == "" {
				t.Errorf("%s: cannot be announced, and says not why", w.name)
			}
			continue
		}
		cmds, err := control.Parse([]byte(zooJob(w).Line() + "\n"))
		if err != nil {
			t.Errorf("%s: %v", w.name, err)
			continue
		}
		if len(cmds) != 1 {
			t.Errorf("%s: %d commands, want 1", w.name, len(cmds))
			continue
		}
		j, ok := cmds[0].(control.Job)
		if !ok {
			t.Errorf("%s: %T, want a job", w.name, cmds[0])
			continue
		}
		if want := map[bool]string{true: "sequential", false: "random"}[w.inOrder]; j.Sampler != want {
			t.Errorf("%s: sampler %q, want %q (in order: %v)", w.name, j.Sampler, want, w.inOrder)
		}
		if j.Name != "zoo" || j.Epoch != 0 || j.World != 1 || !slices.Equal(j.Ranks, []int{0}) || j.Lookahead != 1 {
			t.Errorf("%s: job %q epoch %d world %d ranks %v lookahead %d, want zoo, 0, 1, [0], 1", w.name, j.Name, j.Epoch, j.World, j.Ranks, j.Lookahead)
		}
		var want []string // torchvision's, which hold datagen's .jpg
		switch {
		case w.rows > 0:
			want = []string{".npy"} // dlfs shows each row as one
		case w.spec.Ext != "":
			want = []string{w.spec.Ext}
		}
		if !slices.Equal(j.Extensions, want) {
			t.Errorf("%s: extensions %v, want %v", w.name, j.Extensions, want)
		}
	}
}

func TestZooSerialModel(t *testing.T) {
	for _, c := range []struct {
		name     string
		files    int
		bytes    int64
		readSize int
		want     float64
	}{
		// issue 29's sequential scan: 6,144 calls of 128 KiB.
		{"24 x 32 MiB in 128 KiB", 24, 24 << 25, 128 << 10, 24*0.010 + 6144*0.001 + float64(24<<25)/400e6},
		{"24 x 32 MiB in 1 MiB", 24, 24 << 25, 1 << 20, 24*0.010 + 768*0.001 + float64(24<<25)/400e6},
		// a file a little over a read takes two calls
		{".npz in 1 MiB", 200, 200 * (1<<20 + 498), 1 << 20, 200*0.010 + 400*0.001 + float64(200*(1<<20+498))/400e6},
	} {
		if got := zooSerialModel(c.files, c.bytes, c.readSize); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: %.4f s, want %.4f", c.name, got, c.want)
		}
	}
	// The rule: never under the bandwidth bound, and halving the read size
	// adds one call latency per read of the larger size.
	const files, bytes = 24, int64(24 << 25)
	bound := float64(bytes) / 400e6
	for size := 4 << 10; size <= 32<<20; size *= 2 {
		small, large := zooSerialModel(files, bytes, size), zooSerialModel(files, bytes, 2*size)
		if large < bound {
			t.Errorf("reads of %d: %.3f s, under the bandwidth bound %.3f s", 2*size, large, bound)
		}
		if size*2 <= 32<<20 {
			calls := float64(bytes) / float64(2*size)
			if d := small - large; math.Abs(d-calls*zooReadLatency.Seconds()) > 1e-9 {
				t.Errorf("reads of %d against %d: %.4f s apart, want %.4f", size, 2*size, d, calls*zooReadLatency.Seconds())
			}
		}
	}
}

func TestZooVerdicts(t *testing.T) {
	shuffled := zooWorkload{name: "shuffled", readers: 2, readSize: 1 << 20, sampler: "random", target: 1}
	scan := zooWorkload{name: "scan", readers: 1, readSize: 128 << 10, inOrder: true, sampler: "sequential", target: 2}
	rows5 := zooWorkload{name: "rows", readers: 1, readSize: 128 << 10, why: "rows", target: 1}
	nan := notMeasured
	row := func(w zooWorkload, reader zooReader, seconds, pfs, opens, calls float64) zooRow {
		return zooRow{w: w, reader: reader, files: 10, dataset: 1000, seconds: seconds, pfsBytes: pfs, opens: opens, calls: calls, cpu: nan}
	}
	rows := []zooRow{
		row(shuffled, zooDirect, 2, 1000, 10, 100),
		row(shuffled, zooUntold, 2.1, 1005, 10, 100),  // 0.95x: NOT met; PFS met
		row(shuffled, zooAnnounced, 1, 1000, 20, 100), // 2 opens per file: NOT met
		row(shuffled, zooPageCache, 0.1, nan, nan, nan),
		row(scan, zooDirect, 10, 1000, 10, 1000),
		row(scan, zooUntold, 4, 1020, 10, 100), // 2.5x: met; 1.02x the bytes: NOT met
		row(scan, zooAnnounced, nan, nan, nan, nan),
		row(rows5, zooDirect, 3, 1000, 10, 100),
		row(rows5, zooUntold, 3, 1000, 10, 100),
		{w: rows5, reader: zooAnnounced, files: 10, dataset: 1000, seconds: nan, pfsBytes: nan, opens: nan, calls: nan, cpu: nan, note: "cannot be announced: rows"},
	}
	got := zooVerdicts(rows, zooLater{second: 1.3, dlfs: 0.9, floor: 1, dataset: 1000})
	want := []string{
		"shuffled, epoch 0 with no control line: 0.95x direct (target at least 1.0x): NOT met",
		"scan, epoch 0 with no control line: 2.50x direct (target at least 2.0x): met; the bandwidth bound",
		"rows, epoch 0 with no control line: 1.00x direct (target at least 1.0x): met",
		"shuffled, dlfs, no control line: PFS bytes 1.005x the dataset, 1.00 opens per file (target at most 1.01x and 1): met",
		"shuffled, dlfs, announced: PFS bytes 1.000x the dataset, 2.00 opens per file (target at most 1.01x and 1): NOT met",
		"scan, dlfs, no control line: PFS bytes 1.020x the dataset, 1.00 opens per file (target at most 1.01x and 1): NOT met",
		"scan, dlfs, announced: PFS bytes not measured the dataset, not measured opens per file (target at most 1.01x and 1): not measured",
		"rows, dlfs, no control line: PFS bytes 1.000x the dataset, 1.00 opens per file (target at most 1.01x and 1): met",
		"later epochs of the 32 MiB samples from dlfs's RAM tier, the second pass: 0.77x the FUSE floor (target at least 0.8x): NOT met",
		"later epochs of the 32 MiB samples from dlfs's RAM tier, the third pass: 1.11x the FUSE floor (target at least 0.8x): met",
	}
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("line %d:\n got %s\nwant %s", i, got[i], want[i])
		}
	}
	// The scan's line gives its bound: 1000 bytes at 400 MB/s, and direct's
	// calls of 10 ms each.
	if !strings.Contains(got[1], "direct, whose one reader made 1000 read calls of 128 KiB, 10.00 ms each") {
		t.Errorf("the scan's line: %s", got[1])
	}
	// A missing time is not measured, not met.
	rows[1].seconds = nan
	if got := zooVerdicts(rows, zooLater{second: 1.2, dlfs: 1.2, floor: 1}); !strings.HasSuffix(got[0], "not measured") || !strings.HasSuffix(got[len(got)-1], ": met") {
		t.Errorf("with no time for shuffled and dlfs 0.83x the floor: %q and %q", got[0], got[len(got)-1])
	}
}

// The HDF5 dataset: one file of the workload's rows in data/, a hard link
// to it alone at the top of another directory, made once and kept; and
// the h5py reader reads every row once.
func TestZooHDF5Dataset(t *testing.T) {
	if err := exec.Command("/usr/bin/python3", "-c", "import h5py").Run(); err != nil {
		t.Skipf("no h5py for /usr/bin/python3 (make deps installs python3-h5py): %v", err)
	}
	o := options{dir: t.TempDir()}
	w := zooWorkload{name: "h5", key: "h5", rows: 8, rowBytes: 70 << 10, readers: 1, readSize: 70 << 10}
	d, err := zooDataset(o, w)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.files, []string{"data/rows.h5"}) || d.bytes < 8*70<<10 {
		t.Fatalf("files %v, %d bytes; want data/rows.h5 of at least %d", d.files, d.bytes, 8*70<<10)
	}
	h5 := filepath.Join(d.dir, d.files[0])
	fi, err := os.Stat(h5)
	if err != nil {
		t.Fatal(err)
	}
	li, err := os.Stat(filepath.Join(d.rowDir, "rows.h5"))
	if err != nil || !os.SameFile(fi, li) {
		t.Fatalf("the top-level link: %v, same file %v", err, err == nil && os.SameFile(fi, li))
	}
	old := time.Unix(1, 0)
	if err := os.Chtimes(h5, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := zooDataset(o, w); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(h5); err != nil || !fi.ModTime().Equal(old) {
		t.Errorf("the second call rewrote the file (%v)", err)
	}
	s, err := zooRead(w, d, d.dir, nil)
	if err != nil || !(s > 0) {
		t.Errorf("h5py read: %v s, %v", s, err)
	}
	w.rows = 9 // another shape: rewritten
	if _, err := zooDataset(o, w); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(h5); err != nil || fi.ModTime().Equal(old) {
		t.Errorf("a file of another shape was kept (%v)", err)
	}
	fi, err1 := os.Stat(h5)
	li, err2 := os.Stat(filepath.Join(d.rowDir, "rows.h5"))
	if err1 != nil || err2 != nil || !os.SameFile(fi, li) {
		t.Errorf("the top-level link does not follow the rewritten file (%v, %v)", err1, err2)
	}
	if _, err := zooRead(w, d, d.dir, nil); err != nil {
		t.Errorf("h5py read after the rewrite: %v", err)
	}
}
