package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/datagen"
)

// loaderEpoch is one line of loader_advice.py.
type loaderEpoch struct {
	Epoch   int `json:"epoch"`
	Samples int `json:"samples"`
	Workers int `json:"workers"`
	Advice  *struct {
		Workers        int     `json:"workers"`
		PrefetchFactor int     `json:"prefetch_factor"`
		Predicted      float64 `json:"predicted_samples_per_second"`
	} `json:"advice"`
}

// runLoader runs loader_advice.py and returns its epochs.
func runLoader(data, job string, step float64, epochs int) ([]loaderEpoch, string, error) {
	cmd := exec.Command("/usr/bin/python3", "loader_advice.py", "--data", data, "--job", job,
		"--step", fmt.Sprint(step), "--epochs", fmt.Sprint(epochs))
	out, err := cmd.Output()
	var stderr string
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		stderr = string(ee.Stderr)
	}
	if err != nil {
		return nil, "", fmt.Errorf("%s: %v\n%s%s", job, err, out, stderr)
	}
	var eps []loaderEpoch
	sc := bufio.NewScanner(bytes.NewReader(out))
	first := ""
	for sc.Scan() {
		if first == "" {
			first = sc.Text()
			continue
		}
		var e loaderEpoch
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, "", fmt.Errorf("%s: %q: %v", job, sc.Text(), err)
		}
		eps = append(eps, e)
	}
	return eps, first, nil
}

// TestLoaderAdvice: two dlfs.DataLoaders on one mount, a fast model and a
// slow one, each starting with one worker. They report; dlfs advises both
// from one allocation within --loader-cpus, and each runs its next epochs
// with its advice. (Nothing here compares measured speeds: the split
// between them is allocator's TestLoaderAdviceByModel, on a fake clock,
// and dlfsbench's advice suite measures it.) Stats show both ranks with their
// fits; impossible reports are refused; end drops a job.
func TestLoaderAdvice(t *testing.T) {
	src := t.TempDir()
	if _, err := datagen.ImageFolder(filepath.Join(src, "train"), datagen.Spec{Classes: 4, Files: 400, MeanSize: 2000, Spread: 1000, Seed: 15}); err != nil {
		t.Fatal(err)
	}
	d := startDlfs(t, src, "--loader-cpus", "6", "--log-level", "debug")
	data := filepath.Join(d.Mnt, "train")

	// The slow job starts first; the fast one once the slow one has
	// reported, so that every advice the fast one takes counts both.
	var wg sync.WaitGroup
	runs := map[string][]loaderEpoch{}
	var mu sync.Mutex
	var errs []error
	start := func(job string, step float64) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			eps, first, err := runLoader(data, job, step, 3)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			if first != `{"wrapped": "_TimedDataset", "classes": 4}` {
				errs = append(errs, fmt.Errorf("%s: first line %s", job, first))
			}
			runs[job] = eps
		}()
	}
	start("slow", 0.08)
	waitFor(t, "the slow job's first report", 60*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(d.Mnt, ".dlfs/jobs/slow/rank-0/advice"))
		return err == nil
	})
	start("fast", 0.001)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	for job, eps := range runs {
		if len(eps) != 3 {
			t.Fatalf("%s: %d epochs", job, len(eps))
		}
		if eps[0].Workers != 1 {
			t.Errorf("%s: epoch 0 ran with %d workers, want the 1 given (no advice before a report)", job, eps[0].Workers)
		}
		for _, e := range eps {
			if e.Samples != 400 {
				t.Errorf("%s epoch %d: %d samples", job, e.Epoch, e.Samples)
			}
		}
		last := eps[2]
		if last.Advice == nil || last.Workers != last.Advice.Workers {
			t.Errorf("%s: epoch 2 ran with %d workers under advice %+v", job, last.Workers, last.Advice)
		}
	}
	advice := func(job string) (a struct {
		Workers    int `json:"workers"`
		Generation int `json:"generation"`
	}) {
		b, err := os.ReadFile(filepath.Join(d.Mnt, ".dlfs/jobs", job, "rank-0/advice"))
		if err == nil {
			err = json.Unmarshal(b, &a)
		}
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	fast, slow := advice("fast"), advice("slow")
	// Which job gets more workers follows from measured throughputs, which
	// move with the machine's load: allocator's TestLoaderAdviceByModel
	// checks that by the model, and dlfsbench's advice suite measures it.
	if fast.Generation != slow.Generation || fast.Workers+slow.Workers > 6 || fast.Workers < 1 || slow.Workers < 1 {
		t.Errorf("advice: fast %+v, slow %+v on 6 loader CPUs; want both from one allocation, within the CPUs", fast, slow)
	}
	t.Logf("advice: fast %+v, slow %+v; epochs: fast %+v, slow %+v", fast, slow, runs["fast"], runs["slow"])

	// The advice file, and stats.
	b, err := os.ReadFile(filepath.Join(d.Mnt, ".dlfs/jobs/fast/rank-0/advice"))
	if err != nil {
		t.Fatal(err)
	}
	var adv map[string]any
	if err := json.Unmarshal(b, &adv); err != nil || adv["mode"] != "need" {
		t.Errorf("advice %s: %v", b, err)
	}
	st := dlfsStats(t, d.Mnt)
	alloc, _ := st["allocation"].(map[string]any)
	ranks, _ := alloc["ranks"].([]any)
	if len(ranks) != 2 || num(alloc, "loader_cpus") != 6 || num(alloc, "workers") > 6 {
		t.Fatalf("stats allocation: %v", alloc)
	}
	for _, r := range ranks {
		r := r.(map[string]any)
		if num(r, "fit", "mu_samples_per_second") <= 0 || num(r, "figures", "decode_seconds_per_sample") <= 0 ||
			num(r, "model", "measured_samples_per_second") <= 0 {
			t.Errorf("rank stats without figures: %v", r)
		}
	}
	// Impossible figures are refused with EINVAL, and change nothing.
	ctl := filepath.Join(d.Mnt, ".dlfs/control")
	for _, bad := range []string{
		"report job=fast rank=0 epoch=3 batch=8 workers=2 step=NaN wait=0 decode=0.001 cpu=0.001 samples=8",
		"report job=fast rank=0 epoch=3 batch=8 workers=2 step=-1 wait=0 decode=0.001 cpu=0.001 samples=8",
		"report job=fast rank=0 epoch=3 batch=8 workers=99999 step=0.1 wait=0 decode=0.001 cpu=0.001 samples=8",
	} {
		if err := os.WriteFile(ctl, []byte(bad+"\n"), 0); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%q: %v, want EINVAL", bad, err)
		}
	}
	if b2, _ := os.ReadFile(filepath.Join(d.Mnt, ".dlfs/jobs/fast/rank-0/advice")); !bytes.Equal(b, b2) {
		t.Errorf("a refused report changed the advice: %s, then %s", b, b2)
	}

	// Off a dlfs mount it is the stock DataLoader: nothing wrapped, no
	// advice.
	eps, first, err := runLoader(filepath.Join(src, "train"), "plain", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if first != `{"wrapped": "ImageFolder", "classes": 4}` || len(eps) != 1 || eps[0].Advice != nil || eps[0].Workers != 1 {
		t.Errorf("off the mount: %s, %+v", first, eps)
	}

	// end drops a job that only reported (no sampler was announced).
	if err := os.WriteFile(ctl, []byte("end job=slow\n"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d.Mnt, ".dlfs/jobs/slow/rank-0/advice")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the advice of an ended job: %v", err)
	}
	if err := os.WriteFile(ctl, []byte("end job=slow\n"), 0); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("ending it again: %v, want EINVAL", err)
	}
}
