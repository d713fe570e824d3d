package integration

import (
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pair starts two cluster nodes, a and b, over src, with flags and then
// flagsB for b, and waits until each sees the other.
func pair(t *testing.T, src string, flags []string, flagsB ...string) (a, b *proc) {
	t.Helper()
	key := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(key, []byte("0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	common := append([]string{"--bind", "127.0.0.1:0", "--data-addr", "127.0.0.1:0", "--cluster-key-file", key}, flags...)
	a = startDlfs(t, src, append([]string{"--node-name", "a"}, common...)...)
	addr, _ := dlfsStats(t, a.Mnt)["cluster"].(map[string]any)["gossip"].(string)
	b = startDlfs(t, src, append(append([]string{"--node-name", "b", "--join", addr}, common...), flagsB...)...)
	waitAlive(t, a.Mnt, 2)
	waitAlive(t, b.Mnt, 2)
	return a, b
}

// balanceRecord is one epoch of examples/train_imagefolder.py --balance.
type balanceRecord struct {
	Epoch   int        `json:"epoch"`
	Batches [][]string `json:"batches"`
	CRC     []uint32   `json:"crc"`
	Source  string     `json:"source"`
	Global  [][]string `json:"global"`
}

// TestLocalityBatchSampler runs the example training script with
// dlfs.LocalityBatchSampler as two ranks of torch.distributed (gloo), each
// over its own node of a two-node cluster, for two epochs. Every global
// batch the two loaders delivered together is torch's, every sample's bytes
// are the source's, the ranks followed dlfs's plan (not the fallback), and
// most reads were of the rank's own node's samples.
func TestLocalityBatchSampler(t *testing.T) {
	src := t.TempDir()
	files := dataset(t, filepath.Join(src, "train"), 240)
	a, b := pair(t, src, []string{"--ram-cache", "64MiB"})
	want := map[string]uint32{}
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(src, "train", f))
		if err != nil {
			t.Fatal(err)
		}
		want["train/"+f] = crc32.ChecksumIEEE(data)
	}
	records := make([][]balanceRecord, 2)
	errs := make([]error, 2)
	outs := make([][]byte, 2)
	var wg sync.WaitGroup
	for rank, n := range []*proc{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := filepath.Join(t.TempDir(), "rec.json")
			cmd := exec.Command("/usr/bin/python3", "../../examples/train_imagefolder.py", "--data", filepath.Join(n.Mnt, "train"),
				"--epochs", "2", "--batch", "8", "--workers", "2", "--seed", "11", "--raw", "--balance", "locality",
				"--dist", "--timeout", "30", "--record", rec)
			cmd.Env = append(os.Environ(), fmt.Sprintf("RANK=%d", rank), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
				fmt.Sprintf("MASTER_PORT=%d", 29500+os.Getpid()%1000))
			out, err := cmd.CombinedOutput()
			outs[rank] = out
			if err == nil {
				var data []byte
				if data, err = os.ReadFile(rec); err == nil {
					err = json.Unmarshal(data, &records[rank])
				}
			}
			if err != nil {
				errs[rank] = fmt.Errorf("rank %d: %v\n%s", rank, err, out)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	rel := func(mnt string, paths []string) []string {
		out := make([]string, len(paths))
		for i, p := range paths {
			out[i], _ = filepath.Rel(mnt, p)
		}
		return out
	}
	for e := 0; e < 2; e++ {
		ra, rb := records[0][e], records[1][e]
		if ra.Source != "dlfs" || rb.Source != "dlfs" {
			t.Fatalf("epoch %d: the ranks' batches came from %q and %q, want dlfs's plan\n%s\n%s", e, ra.Source, rb.Source, outs[0], outs[1])
		}
		global := ra.Global
		if len(ra.Batches) != len(global) || len(rb.Batches) != len(global) {
			t.Fatalf("epoch %d: %d and %d batches, torch has %d global batches", e, len(ra.Batches), len(rb.Batches), len(global))
		}
		for k := range global {
			got := append(rel(a.Mnt, ra.Batches[k]), rel(b.Mnt, rb.Batches[k])...)
			slices.Sort(got)
			if w := rel(a.Mnt, global[k]); !slices.Equal(got, w) {
				t.Fatalf("epoch %d global batch %d:\n%v\ntorch's:\n%v", e, k, got, w)
			}
			if len(ra.Batches[k]) != 8 || len(rb.Batches[k]) != 8 {
				t.Fatalf("epoch %d batch %d: sizes %d and %d, want 8", e, k, len(ra.Batches[k]), len(rb.Batches[k]))
			}
		}
		for r, rec := range []balanceRecord{ra, rb} {
			mnt := []*proc{a, b}[r].Mnt
			i := 0
			for _, batch := range rec.Batches {
				for _, p := range rel(mnt, batch) {
					if rec.CRC[i] != want[p] {
						t.Fatalf("rank %d epoch %d: %s read wrong bytes", r, e, p)
					}
					i++
				}
			}
		}
	}
	// The plans put most reads on the reader's own node.
	for _, n := range []*proc{a, b} {
		plans, _ := dlfsStats(t, n.Mnt)["plans"].(map[string]any)["default"].(map[string]any)
		p, _ := plans["epoch-1"].(map[string]any)
		if p == nil || num(p, "local") < 0.75*num(p, "reads") {
			t.Errorf("%s: plan of epoch 1: %v, want three quarters of reads local", n.Mnt, p)
		} else {
			t.Logf("%s: plan of epoch 1: %v", n.Mnt, p)
		}
	}
}

// TestLocalityNodeLeaves: a rank whose plan names samples another node
// owns finishes its epoch, reading them from the PFS, when that node dies
// mid-epoch; its plan does not change under it.
func TestLocalityNodeLeaves(t *testing.T) {
	src := t.TempDir()
	files := dataset(t, filepath.Join(src, "train"), 200)
	pfs := startPFS(t, src)
	// a caches little and stages little, so b owns most samples, rank 0
	// reads mostly b's, and a cannot have them all before b dies.
	a, b := pair(t, pfs.Mnt, []string{"--ram-cache", "2MiB", "--staging", "1MiB"}, "--ram-cache", "64MiB")
	const line = "job=j root=train seed=3 epoch=0 world=2 batch=4 balance=locality lookahead=1"
	for r, n := range []*proc{a, b} {
		if err := control(n.Mnt, fmt.Sprintf("%s rank=%d", line, r)); err != nil {
			t.Fatal(err)
		}
	}
	status := func() map[string]any {
		var st map[string]any
		data, err := os.ReadFile(filepath.Join(a.Mnt, ".dlfs/control"))
		if err == nil {
			err = json.Unmarshal(data, &st)
		}
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	plan := func(epoch int) map[string]any {
		m := status()
		for _, k := range []string{"jobs", "j", "plans", fmt.Sprintf("epoch-%d", epoch)} {
			if m, _ = m[k].(map[string]any); m == nil {
				return nil
			}
		}
		return m
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if p := plan(0); p != nil && p["pinned"] == true {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("epoch 0's plan never pinned: %v", plan(0))
		}
	}
	layout := plan(0)["layout"]
	planFile := filepath.Join(a.Mnt, ".dlfs/jobs/j/rank-0/epoch-0")
	before, err := os.ReadFile(planFile)
	if err != nil {
		t.Fatal(err)
	}
	order := strings.Fields(string(before))
	if len(order) != len(files)/2 {
		t.Fatalf("rank 0 plans %d samples, want %d", len(order), len(files)/2)
	}
	readOne := func(p string) {
		got, err := os.ReadFile(filepath.Join(a.Mnt, p))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if w, _ := os.ReadFile(filepath.Join(src, p)); string(got) != string(w) {
			t.Fatalf("%s: wrong bytes", p)
		}
	}
	half := len(order) / 2
	for _, p := range order[:half] {
		readOne(p)
	}
	b.Cmd.Process.Signal(syscall.SIGKILL)
	syscall.Unmount(b.Mnt, syscall.MNT_DETACH)
	pfsBefore := pfs.counters(t).Opens
	for _, p := range order[half:] {
		readOne(p)
	}
	waitAlive(t, a.Mnt, 1)
	after, err := os.ReadFile(planFile)
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(before) || plan(0)["layout"] != layout {
		t.Errorf("rank 0's plan for epoch 0 changed when b left mid-epoch")
	}
	opens := pfs.counters(t).Opens - pfsBefore
	t.Logf("after b died, %d PFS opens for the %d samples left", opens, len(order)-half)
	if opens == 0 {
		t.Errorf("no sample came from the PFS after b died: the test did not reach b's share")
	}
	// The next epoch is planned without b: every sample on a.
	if err := control(a.Mnt, "job=j epoch=1 rank=0"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		p := plan(1)
		// Rank 1's node is gone: a owns every sample, and rank 0 reads
		// only a's.
		if p != nil && p["layout"] != layout && num(p, "pfs") == 0 && num(p, "local") == num(p, "reads")/2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("epoch 1 is not planned with every sample on a: %v", p)
		}
	}
}

// TestLocalityBatchSamplerOffDlfs: over a plain directory the sampler
// yields torch's own DistributedSampler batches, with one warning.
func TestLocalityBatchSamplerOffDlfs(t *testing.T) {
	src := t.TempDir()
	dataset(t, src, 50)
	script := `
import sys, warnings
sys.path.insert(0, "../../python")
import torch, torchvision, dlfs
ds = torchvision.datasets.ImageFolder(sys.argv[1], loader=lambda p: p)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    s = dlfs.LocalityBatchSampler(ds, 4, num_replicas=3, rank=1, seed=7)
    for epoch in range(2):
        s.set_epoch(epoch)
        got = list(s)
        stock = torch.utils.data.DistributedSampler(ds, num_replicas=3, rank=1, seed=7)
        stock.set_epoch(epoch)
        idx = list(stock)
        want = [idx[i:i + 4] for i in range(0, len(idx), 4)]
        assert got == want, (epoch, got, want)
        assert len(s) == len(want) and s.last_source == "stock"
assert len(w) == 1 and "not on a dlfs mount" in str(w[0].message), [str(x.message) for x in w]
print("ok")
`
	out, err := exec.Command("/usr/bin/python3", "-c", script, src).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("%v\n%s", err, out)
	}
}

// TestLocalityBatchSamplerNoPlan: rank 1 never announces, so no node can
// pin rank 0's plan; after its timeout rank 0 yields the stock batches and
// says why.
func TestLocalityBatchSamplerNoPlan(t *testing.T) {
	src := t.TempDir()
	dataset(t, filepath.Join(src, "train"), 40)
	a, _ := pair(t, src, nil)
	script := `
import sys, warnings
sys.path.insert(0, "../../python")
import torch, torchvision, dlfs
ds = torchvision.datasets.ImageFolder(sys.argv[1], loader=lambda p: p)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    s = dlfs.LocalityBatchSampler(ds, 4, num_replicas=2, rank=0, seed=3, timeout=2)
    got = list(s)
stock = torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=0, seed=3)
idx = list(stock)
assert got == [idx[i:i + 4] for i in range(0, len(idx), 4)], got
assert s.last_source == "stock"
assert any("no plan pinned" in str(x.message) for x in w), [str(x.message) for x in w]
print("ok")
`
	out, err := exec.Command("/usr/bin/python3", "-c", script, filepath.Join(a.Mnt, "train")).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("%v\n%s", err, out)
	}
}
