package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/balance"
	"github.com/dlfs/dlfs/sampler"
	"github.com/dlfs/dlfs/test/datagen"
)

func TestJobPlans(t *testing.T) {
	src := t.TempDir()
	files, err := datagen.ImageFolder(filepath.Join(src, "train"), datagen.Spec{Classes: 3, Files: 30, MeanSize: 100, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, mnt := start(t, src, nil)
	ctl := filepath.Join(mnt, ".dlfs/control")
	write := func(line string) error { return os.WriteFile(ctl, []byte(line+"\n"), 0o644) }
	if err := write("job=j root=train seed=7 epoch=2 world=4 ranks=1,3 lookahead=2"); err != nil {
		t.Fatal(err)
	}
	// ImageFolder order: class by class, files sorted by name.
	var index []string
	for c := 0; c < 3; c++ {
		for _, f := range files {
			if strings.HasPrefix(f.Path, fmt.Sprintf("class_%03d/", c)) {
				index = append(index, "train/"+f.Path)
			}
		}
	}
	for _, rank := range []int{1, 3} {
		for _, epoch := range []int{2, 3} {
			b, err := os.ReadFile(filepath.Join(mnt, fmt.Sprintf(".dlfs/jobs/j/rank-%d/epoch-%d", rank, epoch)))
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, i := range (sampler.Distributed{N: 30, World: 4, Rank: rank, Shuffle: true, Seed: 7}).Epoch(epoch) {
				want = append(want, index[i])
			}
			if got := strings.TrimSpace(string(b)); got != strings.Join(want, "\n") {
				t.Errorf("rank %d epoch %d:\n%s\nwant\n%s", rank, epoch, got, strings.Join(want, "\n"))
			}
		}
	}
	for _, p := range []string{"jobs/j/rank-0/epoch-2", "jobs/j/rank-1/epoch-4", "jobs/j/rank-1/epoch-1", "jobs/nope"} {
		if _, err := os.Stat(filepath.Join(mnt, ".dlfs", p)); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want not-exist", p, err)
		}
	}
	// Bad lines fail with EINVAL and leave the job as it was.
	for _, bad := range []string{"job=j epoch=3 ranks=4", "job=j epoch=3 root=nope", "job=j seed=1", "job=j epoch=3 bogus=1", "end job=zzz"} {
		if err := write(bad); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%q: got %v, want EINVAL", bad, err)
		}
	}
	var st ControlStatus
	readJSON(t, ctl, &st)
	if j, ok := st.Jobs["j"]; !ok || j.Epoch != 2 || j.Samples != 30 || len(j.Ranks) != 2 {
		t.Errorf("job after bad lines: %+v", st.Jobs)
	}
	if !strings.Contains(st.LastError, "no such job") {
		t.Errorf("last_error %q", st.LastError)
	}
	// A new epoch moves the plan at once; end drops the job.
	if err := write("job=j epoch=5"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mnt, ".dlfs/jobs/j/rank-3/epoch-6")); err != nil {
		t.Errorf("epoch 6 after the update: %v", err)
	}
	if err := write("end job=j"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mnt, ".dlfs/jobs/j")); !os.IsNotExist(err) {
		t.Errorf("ended job still listed: %v", err)
	}
}

// pinnedNow says how the nodes' plans of epoch 0 stand, for a failure.
func pinnedNow(t *testing.T, mnts ...string) string {
	var out []string
	for _, mnt := range mnts {
		var st ControlStatus
		readJSON(t, filepath.Join(mnt, ".dlfs/control"), &st)
		p := st.Jobs["bj"].Plans["epoch-0"]
		out = append(out, fmt.Sprintf("layout %s pinned %v", p.Layout, p.Pinned))
	}
	return strings.Join(out, "; ")
}

// TestBalancedPair: two nodes, one rank each, announce a job with
// balance=locality. Once gossip has settled, the plan files of the two
// ranks split every global batch of torch's exactly, each rank's batches
// keep their stock sizes, and most of each rank's samples are its own
// node's.
func TestBalancedPair(t *testing.T) {
	src := t.TempDir()
	if _, err := datagen.ImageFolder(src, datagen.Spec{Classes: 4, Files: 120, MeanSize: 2000, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	a, mntA, b, mntB := startPair(t, src)
	const line = "job=bj root=. seed=5 epoch=0 world=2 batch=8 balance=locality"
	for i, mnt := range []string{mntA, mntB} {
		if err := os.WriteFile(filepath.Join(mnt, ".dlfs/control"), []byte(fmt.Sprintf("%s rank=%d\n", line, i)), 0); err != nil {
			t.Fatal(err)
		}
	}
	j := a.jobs.Get("bj")
	d := sampler.Distributed{N: j.N(), World: 2, Shuffle: true, Seed: 5}
	global := balance.GlobalBatches(d.Global(0), 8, 2)
	read := func(mnt string, rank int) (paths []string, sizes []int) {
		base := filepath.Join(mnt, fmt.Sprintf(".dlfs/jobs/bj/rank-%d/epoch-0", rank))
		p, _ := os.ReadFile(base)
		s, _ := os.ReadFile(base + ".batches")
		paths = strings.Fields(string(p))
		for _, f := range strings.Fields(string(s)) {
			var n int
			fmt.Sscan(f, &n)
			sizes = append(sizes, n)
		}
		return paths, sizes
	}
	agree := func() string {
		pa, sa := read(mntA, 0)
		pb, sb := read(mntB, 1)
		if len(sa) != len(global) || len(sb) != len(global) {
			return fmt.Sprintf("%d and %d batches, want %d", len(sa), len(sb), len(global))
		}
		offA, offB := 0, 0
		for k, gb := range global {
			stock := balance.StockSizes(len(gb), 2)
			if sa[k] != stock[0] || sb[k] != stock[1] {
				return fmt.Sprintf("batch %d: sizes %d, %d; stock %v", k, sa[k], sb[k], stock)
			}
			got := append(slices.Clone(pa[offA:offA+sa[k]]), pb[offB:offB+sb[k]]...)
			offA, offB = offA+sa[k], offB+sb[k]
			var want []string
			for _, i := range gb {
				want = append(want, j.Samples[i].Path())
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				return fmt.Sprintf("global batch %d differs from torch's", k)
			}
		}
		return ""
	}
	deadline := time.Now().Add(20 * time.Second)
	for why := agree(); why != ""; why = agree() {
		if time.Now().After(deadline) {
			t.Fatalf("the two ranks' plans never split torch's global batches: %s; %s", why, pinnedNow(t, mntA, mntB))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Both pin epoch 0's plan under the same layout, and say so in the
	// control status and the stats.
	pinned := func() string {
		var ids []string
		for _, mnt := range []string{mntA, mntB} {
			var st ControlStatus
			readJSON(t, filepath.Join(mnt, ".dlfs/control"), &st)
			p, ok := st.Jobs["bj"].Plans["epoch-0"]
			if !ok || !p.Pinned {
				return fmt.Sprintf("%s: epoch 0's plan %+v not pinned", mnt, p)
			}
			ids = append(ids, p.Layout)
		}
		if ids[0] != ids[1] {
			return fmt.Sprintf("layouts %v differ", ids)
		}
		return ""
	}
	for why := pinned(); why != ""; why = pinned() {
		if time.Now().After(deadline) {
			t.Fatal(why)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if why := agree(); why != "" {
		t.Fatalf("pinned plans: %s", why)
	}
	var stats Stats
	readJSON(t, filepath.Join(mntA, ".dlfs/stats"), &stats)
	if p := stats.Plans["bj"]["epoch-0"]; p.Reads != int64(j.N()) || p.Local < p.Reads/2 || p.MaxBatch != 8 || p.Moved == 0 {
		t.Errorf("stats of epoch 0's plan: %+v", p)
	} else {
		t.Logf("epoch 0's plan: %+v", p)
	}
	prom, err := os.ReadFile(filepath.Join(mntA, ".dlfs/stats.prom"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{`dlfs_plan_reads{dlfs_job="bj",epoch="0",where="local"}`, `dlfs_plan_moved_samples{dlfs_job="bj",epoch="0"}`,
		`dlfs_plan_imbalance_ratio{dlfs_job="bj",epoch="0",quantile="0.9"}`, `dlfs_plan_batch_size{bound="max",dlfs_job="bj",epoch="0"} 8`} {
		if !strings.Contains(string(prom), m) {
			t.Errorf("stats.prom has no %s", m)
		}
	}
	// Most of rank 0's samples are node a's own.
	pa, _ := read(mntA, 0)
	own := 0
	for _, p := range pa {
		if ownerName(b, p) == "a" { // b's view: a owns it
			own++
		}
	}
	t.Logf("rank 0 trains on %d of its %d samples from its own node", own, len(pa))
	if own < len(pa)*2/3 {
		t.Errorf("rank 0 trains on %d of %d samples from its own node", own, len(pa))
	}
}
