package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/dlfs/dlfs/test/datagen"
	"github.com/dlfs/dlfs/test/mountproc"
)

// The advice suite (issue 39, item 14): TestLoaderAdvice's two
// dlfs.DataLoaders on one mount, measured. A slow stand-in model (80 ms a
// batch of 8) reports first, a fast one (1 ms) arrives while it runs;
// each starts with one worker and runs three epochs of 400 samples under
// --loader-cpus 6. Which one the measured figures give more workers to
// moves with the machine's load, so it is measured here and reported, not
// asserted in make test (allocator's TestLoaderAdviceByModel checks the
// split by the model on a fake clock).

// adviceJob is one of the suite's two DataLoaders.
type adviceJob struct {
	name string
	step float64 // seconds the stand-in model holds a batch
}

// adviceEpoch is one line of loader_advice.py's output.
type adviceEpoch struct {
	Epoch   int `json:"epoch"`
	Samples int `json:"samples"`
	Workers int `json:"workers"`
}

// adviceFile is a rank's advice file, as far as the suite reads it.
type adviceFile struct {
	Workers    int     `json:"workers"`
	Predicted  float64 `json:"predicted_samples_per_second"`
	Generation int     `json:"generation"`
}

func runAdvice(o options) error {
	const cpus, epochs = 6, 3
	script, err := filepath.Abs(filepath.Join("test", "integration", "loader_advice.py"))
	if err != nil {
		return err
	}
	src := filepath.Join(o.dir, "advice-src")
	if _, err := datagen.ImageFolder(filepath.Join(src, "train"), datagen.Spec{Classes: 4, Files: 400, MeanSize: 2000, Spread: 1000, Seed: 15}); err != nil {
		return err
	}
	mnt, err := freshDir(filepath.Join(o.dir, "advice-mnt"))
	if err != nil {
		return err
	}
	d, err := mountproc.Start(filepath.Join(o.bin, "dlfs"), mnt, time.Minute, "mount", "--log-level", "warn",
		"--loader-cpus", fmt.Sprint(cpus), src, mnt)
	if err != nil {
		return err
	}
	defer d.Stop(time.Minute)

	jobs := []adviceJob{{"slow", 0.080}, {"fast", 0.001}}
	runs := make([][]adviceEpoch, len(jobs))
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, j := range jobs {
		if i > 0 {
			// The fast job starts once the slow one has reported, so that
			// every advice it takes counts both.
			first := filepath.Join(mnt, ".dlfs/jobs", jobs[0].name, "rank-0/advice")
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
				if _, err := os.Stat(first); err == nil {
					break
				}
				if time.Now().After(deadline) {
					wg.Wait()
					return fmt.Errorf("advice: no advice for %s a minute after it started: %v", jobs[0].name, firstErr(errs...))
				}
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command("/usr/bin/python3", script, "--data", filepath.Join(mnt, "train"), "--job", j.name,
				"--step", fmt.Sprint(j.step), "--epochs", fmt.Sprint(epochs))
			out, err := cmd.Output()
			if err != nil {
				errs[i] = fmt.Errorf("advice: %s: %v\n%s", j.name, err, out)
				return
			}
			sc := bufio.NewScanner(bytes.NewReader(out))
			sc.Scan() // the first line says what it wrapped
			for sc.Scan() {
				var e adviceEpoch
				if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
					errs[i] = fmt.Errorf("advice: %s: %q: %v", j.name, sc.Text(), err)
					return
				}
				runs[i] = append(runs[i], e)
			}
		}()
	}
	wg.Wait()
	if err := firstErr(errs...); err != nil {
		return err
	}
	wall := time.Since(t0)
	advice := make([]adviceFile, len(jobs))
	for i, j := range jobs {
		b, err := os.ReadFile(filepath.Join(mnt, ".dlfs/jobs", j.name, "rank-0/advice"))
		if err == nil {
			err = json.Unmarshal(b, &advice[i])
		}
		if err != nil {
			return fmt.Errorf("advice: %s's advice: %w", j.name, err)
		}
	}

	fmt.Printf("\n## Advice to two DataLoaders, measured (issue 39, item 14)\n\n")
	fmt.Printf("TestLoaderAdvice's scenario with the machine's own figures: a slow stand-in model (%.0f ms a batch of 8) and a fast one (%.0f ms) on one mount, `--loader-cpus %d`, each starting with 1 worker, %d epochs of 400 samples; %.1f s in all.\n\n",
		jobs[0].step*1000, jobs[1].step*1000, cpus, epochs, wall.Seconds())
	fmt.Println("| job | step | workers per epoch | advised workers | predicted samples/s | generation |")
	fmt.Println("|---|---|---|---|---|---|")
	for i, j := range jobs {
		var per []int
		for _, e := range runs[i] {
			per = append(per, e.Workers)
		}
		fmt.Printf("| %s | %.0f ms | %v | %d | %.0f | %d |\n", j.name, j.step*1000, per, advice[i].Workers, advice[i].Predicted, advice[i].Generation)
	}
	slow, fast := advice[0], advice[1]
	fmt.Printf("\nTarget: the fast model advised more workers than the slow one, both from one allocation, within %d CPUs: %s\n",
		cpus, verdict(fast.Workers > slow.Workers && fast.Generation == slow.Generation && fast.Workers+slow.Workers <= cpus, float64(fast.Workers)))
	return nil
}
