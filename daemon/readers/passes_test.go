package readers

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
	"github.com/dlfs/dlfs/sampler"
)

// dataTree is an ImageFolder of classes × per[dir] files under each dir
// in a real catalog, with each one's files in index order.
func dataTree(t *testing.T, classes int, per map[string]int) (*catalog.Snapshot, map[string][]*catalog.Entry) {
	src := t.TempDir()
	for dir, per := range per {
		for c := 0; c < classes; c++ {
			for i := 0; i < per; i++ {
				p := filepath.Join(src, dir, fmt.Sprintf("c%02d", c), fmt.Sprintf("%04d.jpg", i))
				os.MkdirAll(filepath.Dir(p), 0o755)
				os.WriteFile(p, []byte("x"), 0o644)
			}
		}
	}
	cat, err := catalog.Open(context.Background(), catalog.DefaultConfig(src))
	if err != nil {
		t.Fatal(err)
	}
	snap := cat.Snapshot()
	out := map[string][]*catalog.Entry{}
	for dir := range per {
		idx, err := folder.Build(snap, dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range idx.Samples {
			out[dir] = append(out[dir], s.Entry)
		}
	}
	return snap, out
}

// loaderRead is a DataLoader's first read of a sample: its index in the
// dataset and the worker process that read it.
type loaderRead struct{ i, pid int }

// loaderOrder is the order in which a DataLoader whose workers are procs
// reads order in batches of batch: batch k goes to worker k % workers, and
// the workers read side by side (loaderReads), each batch in order.
func loaderOrder(order []int, batch int, procs []int) []loaderRead {
	var out []loaderRead
	w := len(procs)
	round := w * batch
	for start := 0; start < len(order); start += round {
		for i := 0; i < batch; i++ {
			for k := 0; k < w; k++ {
				if j := start + k*batch + i; j < len(order) && j < start+round {
					out = append(out, loaderRead{order[j], procs[k]})
				}
			}
		}
	}
	return out
}

// settle waits until the judge has judged every first read of a file
// observed so far (want of them).
func settle(t *testing.T, tr *Tracker, want int64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d first reads judged", want), func() bool { return tr.settled.Load() >= want })
}

// linesFor returns the lines inferred for jobs over root, in order.
func (f *fakeJobs) linesFor(root string) []control.Job {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []control.Job
	for _, l := range f.lines {
		if l.Root == root {
			out = append(out, l)
		}
	}
	return out
}

func (f *fakeJobs) wasEnded(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Contains(f.ended, name)
}

// TestValidationPass: a training script reads a shuffled epoch of train/
// with two workers in batches of 8, then a validation pass over val/
// (shuffle=False) with two new workers in batches of 16, twice. All its
// workers are its own stream. Whatever the training is (announced by a
// job line, inferred from its torch order, or a shuffle no one can
// predict), the validation pass gets an inferred sequential job of its
// own within its first batches, whose line gives the loader's batch size
// and workers, and which moves to epoch 1 at the second pass; the
// training's job, announced or inferred, is left alone. Before, an
// announced job stopped all inference for its user, and an inferred
// training job was dropped at the validation pass's first reads, which
// then waited out the cooldown in a stream whose recent files mixed both
// directories.
func TestValidationPass(t *testing.T) {
	const classes, trainPer, valPer = 4, 100, 50
	for _, c := range []struct {
		name     string
		training string // "announced", "random" or "torch"
		// unseen is how many of the first pass's last reads dlfs never
		// sees (served by the page cache, or lost from the stream's ring
		// before the judge came): the job still moves to epoch 1 when
		// the second pass starts, from idle, not from near the end.
		unseen int
	}{
		{"announced training", "announced", 0},
		{"unpredictable shuffle", "random", 0},
		{"inferred torch order", "torch", 0},
		{"the first pass's end unseen", "announced", 60},
	} {
		t.Run(c.name, func(t *testing.T) {
			snap, files := dataTree(t, classes, map[string]int{"train": trainPer, "val": valPer})
			procs := map[int][2]string{100: {"1", "python3\x00train.py"}}
			for pid := 101; pid <= 108; pid++ {
				procs[pid] = [2]string{"100", "python3\x00train.py"}
			}
			js := &fakeJobs{ahead: map[string]int{}}
			if c.training == "announced" {
				js.announcedRoots = map[uint32][]string{0: {"train"}}
			}
			tr := tracker(t, snap, fakeProc(t, procs), js)
			observed := int64(0)
			// read observes reads in steps of 8 files, each judged before
			// the next; after each step, after says whether to stop.
			read := func(dir string, reads []loaderRead, waited bool, after func(n int) bool) {
				for k, r := range reads {
					tr.Observe(uint32(r.pid), files[dir][r.i], 0, waited, "pfs", time.Millisecond)
					observed++
					if (k+1)%8 == 0 || k == len(reads)-1 {
						settle(t, tr, observed)
						if after != nil && after(k+1) {
							return
						}
					}
				}
			}
			nTrain, nVal := len(files["train"]), len(files["val"])
			valOrder := make([]int, nVal)
			for i := range valOrder {
				valOrder[i] = i
			}
			for epoch := 0; epoch < 2; epoch++ {
				var order []int
				if c.training == "torch" {
					order = sampler.Distributed{N: nTrain, World: 1, Shuffle: true, Seed: 0}.Epoch(epoch)
				} else {
					order = rand.New(rand.NewPCG(uint64(epoch), 7)).Perm(nTrain)
				}
				// An announced job's reads are served by its prefetch.
				read("train", loaderOrder(order, 8, []int{101 + 4*epoch, 102 + 4*epoch}), c.training != "announced", nil)
				if c.training == "torch" && epoch == 0 {
					waitFor(t, "the training's inferred job", func() bool { return len(js.linesFor("train")) > 0 })
				}
				at := -1 // val files read when the val job was inferred
				valReads := loaderOrder(valOrder, 16, []int{103 + 4*epoch, 104 + 4*epoch})
				if epoch == 0 {
					valReads = valReads[:len(valReads)-c.unseen]
				}
				read("val", valReads, true, func(n int) bool {
					if at < 0 && len(js.linesFor("val")) > 0 {
						at = n
					}
					return false
				})
				if epoch == 0 && (at < 0 || at > 48) {
					t.Fatalf("the validation pass's job was inferred after %d of its %d files (-1: never); streams %+v", at, nVal, tr.Streams())
				}
			}
			val := js.linesFor("val")
			first, last := val[0], val[len(val)-1]
			if first.Sampler != "sequential" || last.Epoch != 1 || js.wasEnded(first.Name) {
				t.Errorf("val job: first %+v, last %+v, ended %v", first, last, js.ended)
			}
			if last.Batch != 16 || last.Workers != 2 || !last.Set["batch"] || !last.Set["workers"] {
				t.Errorf("val job's loader: batch %d workers %d (set %v), want 16 and 2", last.Batch, last.Workers, last.Set)
			}
			train := js.linesFor("train")
			switch c.training {
			case "announced", "random":
				if len(train) != 0 {
					t.Errorf("inferred over train: %+v", train)
				}
			case "torch":
				if len(train) == 0 || train[len(train)-1].Epoch != 1 || js.wasEnded(train[0].Name) || train[0].Name == first.Name {
					t.Errorf("training job: %+v, ended %v", train, js.ended)
				}
				if l := train[len(train)-1]; l.Batch != 8 || l.Workers != 2 {
					t.Errorf("training job's loader: batch %d workers %d, want 8 and 2", l.Batch, l.Workers)
				}
			}
		})
	}
}

func TestNewPass(t *testing.T) {
	_, files := dataTree(t, 4, map[string]int{"train": 10, "val": 10, "test": 10})
	at := func(dir string, is ...int) []fileRead {
		var out []fileRead
		for _, i := range is {
			out = append(out, fileRead{e: files[dir][i]})
		}
		return out
	}
	cat := func(parts ...[]fileRead) []fileRead { return slices.Concat(parts...) }
	for _, c := range []struct {
		name  string
		rs    []fileRead
		moved int // files in the pass; 0: not moved
	}{
		{"nothing", nil, 0},
		{"one directory", at("train", 0, 13, 27, 5, 38), 0},
		{"train, then val", cat(at("train", 3, 17, 29, 8), at("val", 0, 1, 2)), 3},
		{"train and test, then val", cat(at("train", 3, 17), at("test", 4, 5), at("val", 0, 1)), 2},
		{"train, val, test, then val again", cat(at("train", 3), at("val", 0), at("test", 5), at("val", 1)), 0},
		{"classes in turn (one directory's branches)", cat(at("train", 0, 1, 2), at("train", 10, 11)), 2},
		{"shuffled classes", at("train", 0, 12, 25, 37, 1, 13, 26, 38, 2), 0},
		{"back to a class read before", at("train", 0, 12, 1, 13, 2), 0},
	} {
		pass, moved := newPass(c.rs)
		if moved != (c.moved > 0) || moved && len(pass) != c.moved || !moved && len(pass) != len(c.rs) {
			t.Errorf("%s: %d files, moved %v; want %d", c.name, len(pass), moved, c.moved)
		}
	}
}

// TestLanes: a stream keeps one inferred job per dataset it reads in
// turn, at most maxLanes: a third gives up the one read least recently. A
// job its stream stops reading falls back to fetching MinAhead ahead; a
// job its user then announces over its files ends it; and nothing is
// inferred over a directory that holds an announced job's files.
func TestLanes(t *testing.T) {
	snap, files := dataTree(t, 4, map[string]int{"train": 50, "val": 50, "test": 50})
	js := &fakeJobs{ahead: map[string]int{}, announcedRoots: map[uint32][]string{}}
	const history = 32
	tr := trackerWith(t, snap, fakeProc(t, map[int][2]string{100: {"1", "python3"}}), js, func(c *Config) { c.History = history })
	observed := int64(0)
	scan := func(dir string, from, to int) {
		for i := from; i < to; i++ {
			tr.Observe(100, files[dir][i], 0, true, "pfs", time.Millisecond)
			observed++
			if observed%8 == 0 {
				settle(t, tr, observed)
			}
		}
		settle(t, tr, observed)
	}
	name := func(root string) string {
		if l := js.linesFor(root); len(l) > 0 {
			return l[0].Name
		}
		return ""
	}
	ahead := func(root string) int {
		name := name(root)
		js.mu.Lock()
		defer js.mu.Unlock()
		return js.ahead[name]
	}
	scan("train", 0, 150)
	if a := ahead("train"); a <= MinAhead {
		t.Fatalf("the train job, confirmed by %d reads, may fetch %d ahead", 150, a)
	}
	scan("val", 0, history+8)
	if name("train") == "" || name("val") == "" || js.wasEnded(name("train")) {
		t.Fatalf("jobs %+v, ended %v", js.lines, js.ended)
	}
	if a := ahead("train"); a != MinAhead {
		t.Errorf("the train job, which its stream stopped reading %d files ago, may fetch %d ahead", history+8, a)
	}
	scan("test", 0, 40)
	if name("test") == "" || !js.wasEnded(name("train")) || js.wasEnded(name("val")) {
		t.Errorf("after a third dataset: jobs %+v, ended %v", js.lines, js.ended)
	}
	if st, _ := tr.Stream(100); st.Job != name("test") || len(st.Jobs) != maxLanes || st.Root != "test" {
		t.Errorf("stream %+v", st)
	}
	// The user announces a job over val/: the inferred one ends at the next judgement.
	js.mu.Lock()
	js.announcedRoots[0] = []string{"val"}
	js.mu.Unlock()
	scan("test", 40, 48)
	if !js.wasEnded(name("val")) {
		t.Errorf("the val job lives on under an announced one: ended %v", js.ended)
	}
	// An announced job over the whole mount: nothing more is inferred.
	n, _ := js.count()
	js.mu.Lock()
	js.announcedRoots[0] = []string{"."}
	js.mu.Unlock()
	scan("train", 0, 40)
	if m, _ := js.count(); m != n {
		t.Errorf("inferred under a job announced over the mount: %+v", js.lines[n:])
	}
}

// TestWindow: a read may land as far from the furthest as the job's
// loader has in flight, when its shape is known, though that is more
// than a quarter of the epoch.
func TestWindow(t *testing.T) {
	shaped := control.DefaultJob()
	shaped.Batch, shaped.Workers = 16, 2
	shaped.Set = map[string]bool{"batch": true, "workers": true}
	for _, c := range []struct {
		length int
		line   control.Job
		want   int
	}{
		{200, control.DefaultJob(), 50},
		{200, shaped, 80},
		{100000, shaped, 2048},
		{1 << 30, control.DefaultJob(), maxWindow},
		{0, control.DefaultJob(), 1},
	} {
		if got := window(c.length, c.line); got != c.want {
			t.Errorf("window(%d, batch %d workers %d): %d, want %d", c.length, c.line.Batch, c.line.Workers, got, c.want)
		}
	}
}
