package integration

import (
	"bufio"
	"encoding/json"
	"io"
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
	out := runHeld(t, exec.Command("/usr/bin/python3", "-c", script+held, filepath.Join(d.Mnt, "val"), filepath.Join(src, "val")))
	if strings.TrimSpace(out) != "300" {
		t.Fatalf("%s", out)
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
	// The example runs in a process that stays until the stats are read:
	// a stream, and its inferred job, end with their process.
	run := "import runpy, sys\nsys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n"
	cmd := exec.Command("/usr/bin/python3", "-c", run+held, "../../examples/train_imagefolder.py", "--data", filepath.Join(d.Mnt, "train"),
		"--epochs", "2", "--batch", "8", "--workers", "2", "--raw", "--sampler", "torch")
	cmd.Env = append(os.Environ(), "RANK=1", "WORLD_SIZE=2")
	runHeld(t, cmd)
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

// held ends a Python script run by runHeld.
const held = "\nimport sys\nprint('dlfs-test: held', flush=True)\nsys.stdin.read()\n"

// runHeld runs cmd, a Python script ending in held, until it prints that
// it is done, and returns what it wrote (stdout and stderr) before. Its
// process then waits, so that its stream and inferred job live on while
// the test looks at them (they end with their process); the cleanup lets
// it exit. A script that exits first fails the test.
func runHeld(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() { in.Close(); cmd.Wait(); r.Close() })
	var out strings.Builder
	lines := bufio.NewScanner(r)
	lines.Buffer(nil, 1<<20)
	for lines.Scan() {
		if lines.Text() == "dlfs-test: held" {
			go io.Copy(io.Discard, r)
			return out.String()
		}
		out.WriteString(lines.Text() + "\n")
	}
	t.Fatalf("%v exited before it was done:\n%s", cmd.Args[:min(len(cmd.Args), 3)], out.String())
	return ""
}
