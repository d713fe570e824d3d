package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/conformance"
)

type epochRecord struct {
	Epoch int      `json:"epoch"`
	Order []string `json:"order"`
}

// TestDataLoaderMatchesPlan runs the example training script (ImageFolder,
// dlfs.DistributedSampler, DataLoader with workers) as two ranks over the
// mount, and checks that the order in which each rank's loader delivered
// samples is exactly dlfs's plan for that rank and epoch; and that the
// prefetcher served the reads.
func TestDataLoaderMatchesPlan(t *testing.T) {
	src := t.TempDir()
	files := dataset(t, filepath.Join(src, "train"), 240)
	pfs := startPFS(t, src, "-open-latency", "2ms", "-read-latency", "200us")
	d := startDlfs(t, pfs.Mnt, "--ram-cache", "256MiB", "--prefetch-workers", "16", "--log-level", "debug")
	startup := pfs.counters(t).Opens // the heads the dataset's identity reads
	data := filepath.Join(d.Mnt, "train")

	// Announce the job as the ranks' samplers will, and wait until the
	// prefetcher follows both ranks: reads that come before it has built
	// a rank's stream are not tracked, and on a loaded machine a whole
	// epoch of 120 samples can come first.
	line := "job=default root=train dataset=imagefolder sampler=distributed seed=4294967301 world=2 shuffle=true drop_last=false batch=8 workers=2 lookahead=2 torch=1.13 ranks=0,1 epoch=0\n"
	if err := os.WriteFile(filepath.Join(d.Mnt, ".dlfs/control"), []byte(line), 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the prefetcher to follow both ranks", 30*time.Second, func() bool {
		st := dlfsStats(t, d.Mnt)
		return num(st, "jobs", "default", "rank-0", "predicted") > 0 && num(st, "jobs", "default", "rank-1", "predicted") > 0
	})

	var wg sync.WaitGroup
	records := make([][]epochRecord, 2)
	errs := make([]error, 2)
	for rank := 0; rank < 2; rank++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := filepath.Join(t.TempDir(), "rec.json")
			cmd := exec.Command("/usr/bin/python3", "../../examples/train_imagefolder.py", "--data", data,
				"--epochs", "2", "--batch", "8", "--workers", "2", "--seed", "4294967301", "--raw", "--record", rec)
			cmd.Env = append(os.Environ(), fmt.Sprintf("RANK=%d", rank), "WORLD_SIZE=2")
			out, err := cmd.CombinedOutput()
			if err != nil {
				errs[rank] = fmt.Errorf("rank %d: %v\n%s", rank, err, out)
				return
			}
			b, err := os.ReadFile(rec)
			if err == nil {
				err = json.Unmarshal(b, &records[rank])
			}
			errs[rank] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	// Ask dlfs for the plans of epochs 0 and 1 under a job of its own with
	// the same settings, and compare them with what the loaders delivered.
	ctl := filepath.Join(d.Mnt, ".dlfs/control")
	if err := os.WriteFile(ctl, []byte("job=check root=train seed=4294967301 epoch=0 world=2 ranks=0,1 batch=8 workers=2\n"), 0); err != nil {
		t.Fatal(err)
	}
	for rank, rec := range records {
		if len(rec) != 2 {
			t.Fatalf("rank %d recorded %d epochs", rank, len(rec))
		}
		for _, r := range rec {
			plan, err := os.ReadFile(filepath.Join(d.Mnt, fmt.Sprintf(".dlfs/jobs/check/rank-%d/epoch-%d", rank, r.Epoch)))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range r.Order {
				rel, _ := filepath.Rel(d.Mnt, p)
				got = append(got, rel)
			}
			if strings.Join(got, "\n") != strings.TrimSpace(string(plan)) {
				t.Errorf("rank %d epoch %d: the DataLoader's order differs from dlfs's plan", rank, r.Epoch)
			}
			if len(got) != len(files)/2 {
				t.Errorf("rank %d epoch %d: %d samples, want %d", rank, r.Epoch, len(got), len(files)/2)
			}
		}
	}

	st := dlfsStats(t, d.Mnt)
	if num(st, "prefetch", "fetched") == 0 {
		t.Errorf("nothing was prefetched: %v", st["prefetch"])
	}
	for _, rank := range []string{"rank-0", "rank-1"} {
		consumed := num(st, "jobs", "default", rank, "consumed") + num(st, "jobs", "default", rank, "inferred")
		if consumed == 0 {
			t.Errorf("%s: no consumption tracked: %v", rank, st["jobs"])
		}
	}
	// Each sample was read from the PFS about once in all.
	if c := pfs.counters(t); c.Opens-startup > int64(len(files))+int64(len(files))/20 {
		t.Errorf("pfssim saw %d opens for %d files", c.Opens-startup, len(files))
	}
	t.Logf("prefetch %v; jobs %v", st["prefetch"], st["jobs"])
	if os.Getenv("DLFS_DEBUG_IT") != "" {
		t.Log(d.Stderr.String())
	}
}

// TestPlanIndexMatchesTorchvision: on a tree with hidden classes, symlinks,
// mixed-case extensions and "sub-x" next to "sub/deeper", dlfs's
// ImageFolder index (a sequential plan lists it in order) is torchvision's.
func TestPlanIndexMatchesTorchvision(t *testing.T) {
	src := t.TempDir()
	dataset(t, src, 40)
	conformance.OddTree(t, filepath.Join(src, "class_odd"))
	if err := os.Symlink("class_001", filepath.Join(src, "class_link")); err != nil {
		t.Fatal(err)
	}
	d := startDlfs(t, src)
	if err := os.WriteFile(filepath.Join(d.Mnt, ".dlfs/control"), []byte("job=idx sampler=sequential epoch=0\n"), 0); err != nil {
		t.Fatal(err)
	}
	plan, err := os.ReadFile(filepath.Join(d.Mnt, ".dlfs/jobs/idx/rank-0/epoch-0"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, s := range imageFolder(t, d.Mnt).Samples {
		want = append(want, s[0].(string))
	}
	if got := strings.Split(strings.TrimSpace(string(plan)), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("dlfs index (%d samples) differs from torchvision's (%d)\ndlfs: %v\ntorchvision: %v", len(got), len(want), got, want)
	}
}
