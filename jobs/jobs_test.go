package jobs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dlfs/dlfs/balance"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
)

func registry(t *testing.T, files map[string]string) *Registry {
	t.Helper()
	root := t.TempDir()
	for p, data := range files {
		full := filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cat, err := catalog.Open(context.Background(), catalog.DefaultConfig(root))
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{Snapshot: cat.Snapshot, ReadFile: func(e *catalog.Entry) ([]byte, error) {
		return os.ReadFile(filepath.Join(root, e.Path()))
	}})
}

func apply(r *Registry, line string) error {
	cmds, err := control.Parse([]byte(line))
	if err != nil {
		return err
	}
	return r.Apply(cmds[0].(control.Job))
}

func TestListDataset(t *testing.T) {
	r := registry(t, map[string]string{
		"d/a.bin": "a", "d/b.bin": "b", "d/sub/c.bin": "c",
		"lists/train.txt": "b.bin\n\nsub/c.bin\na.bin\n",
		"lists/bad.txt":   "a.bin\nnope.bin\n",
	})
	if err := apply(r, "job=l root=d dataset=list:lists/train.txt sampler=sequential epoch=0"); err != nil {
		t.Fatal(err)
	}
	j := r.Get("l")
	var got []string
	for _, i := range j.Order(0, 0) {
		got = append(got, j.Samples[i].Path())
	}
	if strings.Join(got, ",") != "d/b.bin,d/sub/c.bin,d/a.bin" {
		t.Errorf("order %v", got)
	}
	for line, want := range map[string]string{
		"job=x root=d dataset=list:lists/bad.txt epoch=0":  `line 2: "nope.bin"`,
		"job=x root=d dataset=list:lists/none.txt epoch=0": "no such file",
		"job=x root=nope epoch=0":                          "not a directory",
		"job=x root=d epoch=0":                             "holds no samples",
	} {
		err := apply(r, line)
		if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, control.ErrSyntax) {
			t.Errorf("%q: got %v, want an ErrSyntax containing %q", line, err, want)
		}
	}
	if r.Get("x") != nil {
		t.Error("a rejected line registered a job")
	}
}

func TestRankEpochs(t *testing.T) {
	r := registry(t, map[string]string{"c/1.jpg": "1", "c/2.jpg": "2", "c/3.jpg": "3", "c/4.jpg": "4"})
	for _, line := range []string{"job=j epoch=0 world=2 rank=0", "job=j epoch=0 world=2 rank=1", "job=j epoch=1 world=2 rank=0"} {
		if err := apply(r, line); err != nil {
			t.Fatal(err)
		}
	}
	j := r.Get("j")
	if j.RankEpoch[0] != 1 || j.RankEpoch[1] != 0 {
		t.Errorf("rank epochs %v: want rank 0 at 1, rank 1 still at 0", j.RankEpoch)
	}
	if !j.Planned(1, 1) || j.Planned(0, 0) || !j.Planned(0, 2) {
		t.Error("Planned disagrees with the rank epochs")
	}
	if err := apply(r, "job=j epoch=5 ranks=0,1"); err != nil || r.Get("j").RankEpoch[1] != 5 {
		t.Errorf("ranks= should move every rank: %v %v", err, r.Get("j").RankEpoch)
	}
}

func TestReindexAfterRefresh(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{"c/1.jpg", "c/2.jpg"} {
		os.MkdirAll(filepath.Join(root, filepath.Dir(f)), 0o755)
		os.WriteFile(filepath.Join(root, f), []byte("x"), 0o644)
	}
	cat, err := catalog.Open(context.Background(), catalog.DefaultConfig(root))
	if err != nil {
		t.Fatal(err)
	}
	r := New(Config{Snapshot: cat.Snapshot})
	if err := apply(r, "job=j epoch=0 sampler=sequential"); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "c/3.jpg"), []byte("x"), 0o644)
	if _, err := cat.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.Reindex()
	if n := r.Get("j").N(); n != 3 {
		t.Errorf("after a refresh that added a file, the job has %d samples, want 3", n)
	}
	// A second job over the same dataset shares the index; one over another
	// extension list does not.
	if err := apply(r, "job=k epoch=0"); err != nil {
		t.Fatal(err)
	}
	if err := apply(r, "job=m epoch=0 extensions=.jpg"); err != nil {
		t.Fatal(err)
	}
	if j, k, m := r.Get("j"), r.Get("k"), r.Get("m"); &j.Samples[0] != &k.Samples[0] || &j.Samples[0] == &m.Samples[0] {
		t.Error("jobs over one dataset and snapshot should share its index, and only they")
	}
	os.RemoveAll(filepath.Join(root, "c"))
	cat.Refresh(context.Background())
	r.Reindex()
	if r.Get("j") != nil {
		t.Error("a job whose root vanished was kept")
	}
}

// TestReads: Reads visits exactly what each rank's plan reads.
func TestReads(t *testing.T) {
	for _, line := range []string{
		"epoch=3 world=3 seed=9",
		"epoch=0 world=4 seed=1 drop_last=true",
		"epoch=1 world=2 sampler=random seed=5",
		"epoch=0 world=2 sampler=sequential",
	} {
		cmds, err := control.Parse([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		spec := cmds[0].(control.Job).Merge(control.DefaultJob())
		const n = 101
		got := map[[2]int]int{}
		Reads(spec, n, spec.Epoch, 2, func(r, i int) { got[[2]int{r, i}]++ })
		want := map[[2]int]int{}
		for e := spec.Epoch; e < spec.Epoch+2; e++ {
			for r := 0; r < spec.World; r++ {
				for _, i := range ReadOrder(spec, n, r, e) {
					want[[2]int{r, i}]++
				}
			}
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d (rank, sample) pairs, want %d", line, len(got), len(want))
		}
		for k, c := range want {
			if got[k] != c {
				t.Fatalf("%s: rank %d reads sample %d %d times, want %d", line, k[0], k[1], got[k], c)
			}
		}
	}
}

// balanceRegistry is a registry over n files in 5 classes whose layout
// puts rank r on node r % nodes and sample i on node i % nodes (or none,
// for every fifth sample, when partial).
func balanceRegistry(t *testing.T, n, nodes int, partial bool) *Registry {
	t.Helper()
	files := map[string]string{}
	for i := 0; i < n; i++ {
		files[fmt.Sprintf("c%d/%04d.jpg", i%5, i)] = "x"
	}
	r := registry(t, files)
	r.cfg.Layout = func(j *Job) Layout {
		rn := make([]int, j.Spec.World)
		for i := range rn {
			rn[i] = i % nodes
		}
		return Layout{RankNode: rn, Cached: n / 2, Owner: func(i int) int {
			if partial && i%5 == 0 {
				return -1
			}
			return i % nodes
		}}
	}
	return r
}

// TestBalancedPlans: under balance=locality every global batch of every
// epoch is torch's, as a multiset, every rank's batches have their stock
// sizes, and most reads are on the rank's own node; under solar the
// global batches hold too; one node gives exactly the stock order.
func TestBalancedPlans(t *testing.T) {
	const n, world, batch = 500, 3, 8
	for _, c := range []struct {
		line    string
		nodes   int
		partial bool
	}{
		{"job=j epoch=0 world=3 ranks=0,1,2 batch=8 balance=locality", 3, false},
		{"job=j epoch=0 world=3 ranks=0,1,2 batch=8 balance=locality", 3, true},
		{"job=j epoch=0 world=3 ranks=0,1,2 batch=8 balance=solar", 3, true},
		{"job=j epoch=0 world=3 ranks=0,1,2 batch=8 balance=locality drop_last=true", 3, false},
		{"job=j epoch=0 world=3 ranks=0,1,2 batch=8 balance=locality epochorder=true lookahead=4", 3, true},
	} {
		t.Run(c.line, func(t *testing.T) {
			r := balanceRegistry(t, n, c.nodes, c.partial)
			if err := apply(r, c.line); err != nil {
				t.Fatal(err)
			}
			j := r.Get("j")
			d := Distributed(j.Spec, j.N())
			local, total := 0, 0
			for e := 0; e < 2; e++ {
				j.mu.Lock()
				perm := j.permutationLocked(e, n/2)
				j.mu.Unlock()
				global := balance.GlobalBatches(d.Global(perm), batch, world)
				offsets := make([]int, world)
				for k, gb := range global {
					var got []int
					for rk := 0; rk < world; rk++ {
						size := j.Batches(rk, e)[k]
						if j.Spec.Balance == "locality" && size != balance.StockSizes(len(gb), world)[rk] {
							t.Fatalf("epoch %d batch %d rank %d: %d samples, stock %d", e, k, rk, size, balance.StockSizes(len(gb), world)[rk])
						}
						part := j.Order(rk, e)[offsets[rk] : offsets[rk]+size]
						offsets[rk] += size
						for _, i := range part {
							got = append(got, int(i))
							if int(i)%c.nodes == rk%c.nodes && !(c.partial && i%5 == 0) {
								local++
							}
							total++
						}
					}
					want := slices.Clone(gb)
					slices.Sort(got)
					slices.Sort(want)
					if !slices.Equal(got, want) {
						t.Fatalf("epoch %d global batch %d is not torch's", e, k)
					}
				}
			}
			t.Logf("%.0f%% of reads on the rank's own node", 100*float64(local)/float64(total))
			if float64(local) < 0.6*float64(total) {
				t.Errorf("only %d of %d reads local", local, total)
			}
		})
	}
	// One node caching everything: the stock order, exactly.
	r := registry(t, map[string]string{"c/1.jpg": "1", "c/2.jpg": "2", "c/3.jpg": "3", "c/4.jpg": "4", "d/5.jpg": "5"})
	if err := apply(r, "job=j epoch=0 world=2 ranks=0,1 batch=2 balance=locality"); err != nil {
		t.Fatal(err)
	}
	j := r.Get("j")
	for rk := 0; rk < 2; rk++ {
		if got, want := j.Order(rk, 0), narrow(ReadOrder(j.Spec, j.N(), rk, 0)); !slices.Equal(got, want) {
			t.Errorf("rank %d on one node: %v, stock %v", rk, got, want)
		}
	}
}

// TestPinnedPlans: a plan follows the layout until a local rank is in its
// epoch with every rank's node known; from then on it stays, across
// layout changes and across job lines that move another local rank on.
func TestPinnedPlans(t *testing.T) {
	const n = 120
	files := map[string]string{}
	for i := 0; i < n; i++ {
		files[fmt.Sprintf("c/%04d.jpg", i)] = "x"
	}
	r := registry(t, files)
	var (
		id       uint64 = 1
		rankNode        = []int{0, 0, -1} // rank 2's node not gossiped yet
		shift           = 0
	)
	r.cfg.Layout = func(j *Job) Layout {
		return Layout{RankNode: slices.Clone(rankNode), Cached: n, ID: id, Owner: func(i int) int { return (i + shift) % 2 }}
	}
	if err := apply(r, "job=j epoch=0 world=3 ranks=0,1 batch=4 balance=locality"); err != nil {
		t.Fatal(err)
	}
	plan := func(e int) PlanStats {
		t.Helper()
		st, ok := r.Get("j").Plan(e)
		if !ok {
			t.Fatal("no plan under balance=")
		}
		return st
	}
	if st := plan(0); st.Pinned || st.Layout != "0000000000000001" {
		t.Fatalf("incomplete layout: plan %+v, want unpinned under layout 1", st)
	}
	id, rankNode[2] = 2, 1
	if st := plan(0); !st.Pinned || st.Layout != "0000000000000002" {
		t.Fatalf("complete layout: plan %+v, want pinned under layout 2", st)
	}
	before := slices.Clone(r.Get("j").Order(0, 0))
	id, shift = 3, 1 // every sample moves to the other node
	if st := plan(0); st.Layout != "0000000000000002" || !slices.Equal(r.Get("j").Order(0, 0), before) {
		t.Fatalf("pinned plan changed with the layout: %+v", st)
	}
	if st := plan(1); st.Pinned || st.Layout != "0000000000000003" {
		t.Fatalf("next epoch: %+v, want unpinned under layout 3", st)
	}
	// Rank 0 moves to epoch 1; rank 1, still in epoch 0, keeps its plan.
	if err := apply(r, "job=j epoch=1 rank=0"); err != nil {
		t.Fatal(err)
	}
	if st := plan(0); st.Layout != "0000000000000002" || !slices.Equal(r.Get("j").Order(0, 0), before) {
		t.Fatalf("rank 0's move re-planned epoch 0 under rank 1: %+v", st)
	}
	if st := plan(1); !st.Pinned || st.Layout != "0000000000000003" {
		t.Fatalf("epoch 1 with rank 0 in it: %+v, want pinned under layout 3", st)
	}
	if st := plan(1); st.Reads != int64(n) || st.Local+st.PFS > st.Reads || st.MinBatch != 4 || st.MaxBatch != 4 {
		t.Errorf("epoch 1 figures %+v: want %d reads in batches of 4", st, n)
	}
	// A line that changes the plans (another seed) drops the pinned ones:
	// epoch 0, which rank 1 is still in, is planned again, under the
	// layout of now.
	id = 4
	if err := apply(r, "job=j seed=7 epoch=1 rank=0"); err != nil {
		t.Fatal(err)
	}
	if st := plan(0); st.Layout != "0000000000000004" {
		t.Errorf("after seed=7, epoch 0 kept its pinned plan: %+v", st)
	}
}

// TestInferredShape: an inferred job whose line leaves batch= or
// workers= out is planned with InferredBatch and InferredWorkers (the
// prefetcher's window) but does not claim them: Batches says nothing and
// the status names them unknown, until a line gives them. An announced
// job's line that leaves them out takes the documented defaults, and
// they are its. Before, package readers wrote batch=32 workers=4 into
// every inferred line, so a loader reading batches of 16 was shown 32.
func TestInferredShape(t *testing.T) {
	files := map[string]string{}
	for i := 0; i < 40; i++ {
		files[fmt.Sprintf("val/c%d/%02d.jpg", i%2, i)] = "x"
	}
	r := registry(t, files)
	parse := func(line string) control.Job {
		cmds, err := control.Parse([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		return cmds[0].(control.Job)
	}
	for _, c := range []struct {
		name, line  string
		inferred    bool
		batch, wkrs int
		unknown     string
		batches     string
		roots       []string
	}{
		{"inferred, shape not shown", "job=v root=val epoch=0 sampler=sequential", true, InferredBatch, InferredWorkers, "batch,workers", "", nil},
		{"inferred, workers shown", "job=v root=val epoch=0 sampler=sequential workers=2", true, InferredBatch, 2, "batch", "", nil},
		{"inferred, both shown", "job=v root=val epoch=0 sampler=sequential batch=16 workers=2", true, 16, 2, "", "16,16,8", nil},
		{"announced, defaults", "job=v root=val epoch=0 sampler=sequential", false, 1, 0, "", strings.Repeat("1,", 39) + "1", []string{"val"}},
	} {
		var err error
		if c.inferred {
			err = r.ApplyInferred(RootOwner.Cred, parse(c.line))
		} else {
			err = r.Apply(parse(c.line))
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		j := r.Get("v")
		st := r.Statuses()["v"]
		var sizes []string
		for _, n := range j.Batches(0, 0) {
			sizes = append(sizes, fmt.Sprint(n))
		}
		wantStatus := [2]int{c.batch, c.wkrs}
		if !j.BatchKnown() {
			wantStatus[0] = 0
		}
		if !j.WorkersKnown() {
			wantStatus[1] = 0
		}
		if j.Spec.Batch != c.batch || j.Spec.Workers != c.wkrs || strings.Join(st.Unknown, ",") != c.unknown ||
			[2]int{st.Batch, st.Workers} != wantStatus || strings.Join(sizes, ",") != c.batches {
			t.Errorf("%s: planned with batch %d workers %d; status batch %d workers %d unknown %v; batches %v",
				c.name, j.Spec.Batch, j.Spec.Workers, st.Batch, st.Workers, st.Unknown, sizes)
		}
		if got := r.AnnouncedRoots(0); !slices.Equal(got, c.roots) {
			t.Errorf("%s: announced roots %v, want %v", c.name, got, c.roots)
		}
		if err := r.End("v"); err != nil {
			t.Fatal(err)
		}
	}
	// An announcement that takes over an inferred job whose shape was
	// not known does not inherit the assumed one.
	if err := r.ApplyInferred(RootOwner.Cred, parse("job=v root=val epoch=0 sampler=sequential")); err != nil {
		t.Fatal(err)
	}
	if err := r.Apply(parse("job=v epoch=1")); err != nil {
		t.Fatal(err)
	}
	if j := r.Get("v"); !j.BatchKnown() || j.Spec.Batch != 1 || j.Spec.Workers != 0 {
		t.Errorf("announced over an inferred job: batch %d (known %v) workers %d, want the defaults 1 and 0", j.Spec.Batch, j.BatchKnown(), j.Spec.Workers)
	}
}
