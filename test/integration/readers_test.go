package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInferredSequential runs an unmodified evaluation loop (ImageFolder,
// DataLoader with shuffle=False and 2 workers, no control line) over a
// mount of a slow PFS. dlfs sees one stream (the loader and its workers),
// calls it sequential, infers the job and prefetches for it: the stream is
// shown in the stats, the job in the control status as inferred, most
// reads after the first are hits, and every byte is the source's.
func TestInferredSequential(t *testing.T) {
	src := t.TempDir()
	files := dataset(t, filepath.Join(src, "val"), 300)
	pfs := startPFS(t, src, "-open-latency", "3ms", "-read-latency", "300us")
	d := startDlfs(t, pfs.Mnt, "--ram-cache", "256MiB")
	script := `
import sys, zlib, torch, torchvision
root, src = sys.argv[1], sys.argv[2]
def load(p):
    with open(p, "rb") as f:
        return zlib.crc32(f.read())
ds = torchvision.datasets.ImageFolder(root, loader=load)
loader = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=False, num_workers=2)
i = 0
for crcs, _ in loader:
    for c in crcs:
        path = ds.samples[i][0]
        with open(src + path[len(root):], "rb") as f:
            assert int(c) == zlib.crc32(f.read()), path
        i += 1
print(i)
`
	out, err := exec.Command("/usr/bin/python3", "-c", script, filepath.Join(d.Mnt, "val"), filepath.Join(src, "val")).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "300" {
		t.Fatalf("%v\n%s", err, out)
	}
	st := dlfsStats(t, d.Mnt)
	streams, _ := st["streams"].([]any)
	var seq map[string]any
	for _, s := range streams {
		if s := s.(map[string]any); s["pattern"] == "sequential" {
			seq = s
		}
	}
	if seq == nil || num(seq, "files") < float64(len(files))*0.9 || !strings.HasPrefix(seq["job"].(string), "auto-") || seq["root"] != "val" {
		t.Fatalf("no sequential stream over val with an inferred job: %v", streams)
	}
	job := seq["job"].(string)
	var status struct {
		Jobs map[string]struct {
			Inferred bool   `json:"inferred"`
			Sampler  string `json:"sampler"`
			Root     string `json:"root"`
		} `json:"jobs"`
	}
	b, _ := os.ReadFile(filepath.Join(d.Mnt, ".dlfs/control"))
	if err := json.Unmarshal(b, &status); err != nil {
		t.Fatal(err)
	}
	if j, ok := status.Jobs[job]; !ok || !j.Inferred || j.Sampler != "sequential" || j.Root != "val" {
		t.Errorf("control status of %s: %+v", job, status.Jobs)
	}
	if _, err := os.Stat(filepath.Join(d.Mnt, ".dlfs/jobs", job, "rank-0/epoch-0")); err != nil {
		t.Errorf("the inferred job's plan: %v", err)
	}
	hits, reads := num(seq, "hits"), num(seq, "reads")
	t.Logf("stream %v; prefetch %v", seq, st["prefetch"])
	if num(st, "prefetch", "fetched") < float64(len(files))/2 || hits < 0.6*reads {
		t.Errorf("%v of %v reads were hits, %v samples prefetched", hits, reads, num(st, "prefetch", "fetched"))
	}
}

// TestInferredTorchOrder runs the example loop with torch's own
// DistributedSampler (rank 1 of 2, the default seed, no control line) for
// two epochs over a mount of a slow PFS. dlfs finds the order from the
// first reads, shows it, prefetches it, and follows the rank into epoch 1.
func TestInferredTorchOrder(t *testing.T) {
	src := t.TempDir()
	dataset(t, filepath.Join(src, "train"), 400)
	pfs := startPFS(t, src, "-open-latency", "3ms", "-read-latency", "300us")
	d := startDlfs(t, pfs.Mnt, "--ram-cache", "8MiB") // too small to hold an epoch: epoch 1 needs the plan
	cmd := exec.Command("/usr/bin/python3", "../../examples/train_imagefolder.py", "--data", filepath.Join(d.Mnt, "train"),
		"--epochs", "2", "--batch", "8", "--workers", "2", "--raw", "--sampler", "torch")
	cmd.Env = append(os.Environ(), "RANK=1", "WORLD_SIZE=2")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	st := dlfsStats(t, d.Mnt)
	streams, _ := st["streams"].([]any)
	if len(streams) != 1 {
		t.Fatalf("streams %v", streams)
	}
	s := streams[0].(map[string]any)
	job, _ := s["job"].(string)
	if s["pattern"] != "torch seed=0 world=2 rank=1" || job == "" {
		t.Fatalf("stream %v", s)
	}
	jobs, _ := st["jobs"].(map[string]any)
	js, _ := jobs[job].(map[string]any)["rank-1"].(map[string]any)
	t.Logf("stream %v; job %v", s, js)
	if num(js, "epoch") != 1 || num(js, "hits") < 0.8*num(s, "files") {
		t.Errorf("the inferred job: %v (stream %v)", js, s)
	}
}
