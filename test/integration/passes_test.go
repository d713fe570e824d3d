package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// passScript trains two epochs over MNT/train (batches of 8, two
// workers), each followed by a validation pass over MNT/val (shuffle=False,
// batches of 16, two workers), as a training script does. With
// "announced" it announces the training job each epoch and shuffles with
// DistributedSampler(seed=7); otherwise it shuffles with torch's default
// RandomSampler, which no one can predict. After each validation pass it
// prints "pass E TRAIN VAL JSON": the files each loader read and the jobs'
// prefetch figures from .dlfs/stats; then it drops the page cache, so that
// the next epoch's reads reach dlfs.
const passScript = `
import json, os, sys, zlib, torch, torchvision
mnt, mode = sys.argv[1], sys.argv[2]
def load(p):
    with open(p, "rb") as f:
        return zlib.crc32(f.read())
train = torchvision.datasets.ImageFolder(os.path.join(mnt, "train"), loader=load)
val = torchvision.datasets.ImageFolder(os.path.join(mnt, "val"), loader=load)
for epoch in range(2):
    if mode == "announced":
        with open(os.path.join(mnt, ".dlfs", "control"), "w") as f:
            f.write("job=train root=train seed=7 epoch=%d batch=8 workers=2\n" % epoch)
        sampler = torch.utils.data.DistributedSampler(train, num_replicas=1, rank=0, shuffle=True, seed=7)
        sampler.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(train, batch_size=8, sampler=sampler, num_workers=2)
    else:
        loader = torch.utils.data.DataLoader(train, batch_size=8, shuffle=True, num_workers=2)
    n = sum(len(crcs) for crcs, _ in loader)
    m = sum(len(crcs) for crcs, _ in torch.utils.data.DataLoader(val, batch_size=16, shuffle=False, num_workers=2))
    with open(os.path.join(mnt, ".dlfs", "stats")) as f:
        jobs = json.load(f).get("jobs", {})
    print("pass %d %d %d %s" % (epoch, n, m, json.dumps(jobs)), flush=True)
    os.system("sync; echo 3 > /proc/sys/vm/drop_caches")
`

// TestValidationPassPrefetched runs a training script that follows each
// epoch over train/ with a validation pass over val/ (shuffle=False, a
// SequentialSampler), over a mount of a slow PFS, with the training
// announced and without. Either way the validation pass gets an inferred
// sequential job of its own within its first batches, which prefetches
// most of the pass (the hits of its first pass), moves to epoch 1 at the
// second pass, and shows the loader's real batch size, 16, in its status
// and its .batches file; the announced training job stays announced, and
// nothing is inferred over train/. Before, nothing was inferred for a user
// with an announced job, and an unannounced script's validation pass was
// judged together with its shuffled epoch: random.
func TestValidationPassPrefetched(t *testing.T) {
	for _, mode := range []string{"announced", "not announced"} {
		t.Run(mode, func(t *testing.T) {
			src := t.TempDir()
			dataset(t, filepath.Join(src, "train"), 300)
			nVal := len(dataset(t, filepath.Join(src, "val"), 200))
			pfs := startPFS(t, src, "-open-latency", "3ms", "-read-latency", "300us")
			d := startDlfs(t, pfs.Mnt, "--ram-cache", "256MiB")
			arg := "announced"
			if mode != "announced" {
				arg = "none"
			}
			out := runHeld(t, exec.Command("/usr/bin/python3", "-c", passScript+held, d.Mnt, arg))
			// The jobs' prefetch figures after each validation pass.
			var passes []map[string]map[string]map[string]any
			for _, line := range strings.Split(out, "\n") {
				var e, n, m int
				if _, err := fmt.Sscanf(line, "pass %d %d %d", &e, &n, &m); err != nil {
					continue
				}
				if n != 300 || m != nVal {
					t.Fatalf("epoch %d read %d training and %d validation samples:\n%s", e, n, m, out)
				}
				var jobs map[string]map[string]map[string]any
				if err := json.Unmarshal([]byte(strings.SplitN(line, " ", 5)[4]), &jobs); err != nil {
					t.Fatalf("%v: %s", err, line)
				}
				passes = append(passes, jobs)
			}
			if len(passes) != 2 {
				t.Fatalf("%d passes:\n%s", len(passes), out)
			}
			var status struct {
				Jobs map[string]struct {
					Inferred   bool           `json:"inferred"`
					Sampler    string         `json:"sampler"`
					Root       string         `json:"root"`
					Batch      int            `json:"batch"`
					Workers    int            `json:"workers"`
					Unknown    []string       `json:"unknown"`
					RankEpochs map[string]int `json:"rank_epochs"`
				} `json:"jobs"`
			}
			b, err := os.ReadFile(filepath.Join(d.Mnt, ".dlfs/control"))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &status); err != nil {
				t.Fatal(err)
			}
			valJob := ""
			for name, j := range status.Jobs {
				switch {
				case j.Root == "val":
					valJob = name
				case j.Root == "train" && j.Inferred:
					t.Errorf("a job inferred over train: %s %+v", name, j)
				}
			}
			if valJob == "" {
				t.Fatalf("no job over val/: %s\nstreams %v\nthe script's output:\n%s\ndlfs's log:\n%s", b, dlfsStats(t, d.Mnt)["streams"], out, d.Stderr)
			}
			v := status.Jobs[valJob]
			if !v.Inferred || v.Sampler != "sequential" || v.Batch != 16 || v.Workers != 2 || len(v.Unknown) != 0 || v.RankEpochs["rank-0"] != 1 {
				t.Errorf("the validation pass's job %s: %+v", valJob, v)
			}
			if tr, ok := status.Jobs["train"]; mode == "announced" && (!ok || tr.Inferred || tr.RankEpochs["rank-0"] != 1) {
				t.Errorf("the announced training job: %+v (present %v)", tr, ok)
			}
			first := passes[0][valJob]["rank-0"]
			t.Logf("val job %s after its first pass: %v; after its second: %v", valJob, first, passes[1][valJob]["rank-0"])
			if hits, _ := first["hits"].(float64); hits < float64(nVal)/2 {
				t.Errorf("the first validation pass: %v of its %d files prefetched (hits)", first["hits"], nVal)
			}
			if e := passes[1][valJob]["rank-0"]["epoch"]; e != 1.0 {
				t.Errorf("the second validation pass is the val job's epoch %v, want 1", e)
			}
			sizes, err := os.ReadFile(filepath.Join(d.Mnt, ".dlfs/jobs", valJob, "rank-0/epoch-1.batches"))
			if want := strings.Repeat("16\n", nVal/16) + fmt.Sprintf("%d\n", nVal%16); err != nil || string(sizes) != want {
				t.Errorf("epoch-1.batches of %s: %q (%v), want %q", valJob, sizes, err, want)
			}
		})
	}
}
