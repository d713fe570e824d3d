package allocator

import (
	"math"
	"testing"
	"time"
)

// simLoader is a stand-in DataLoader for TestLoaderAdviceByModel: a
// training loop that holds each batch step seconds, fed by workers that
// each spend read seconds waiting and cpu seconds decoding per sample. It
// reports the figures the Python helper would (package control's report
// line plus dlfs's read time) every interval of simulated time, and takes
// its advice when an epoch starts, as the helper does.
type simLoader struct {
	key             Key
	step, read, cpu float64
	batch, length   int
	workers         int
	epoch, done     int // the epoch it runs, the samples read of it
	ran             []int
}

// batchSeconds is how long one batch takes in steady state: the loop's
// step or what the workers need to fill a batch, whichever is longer.
func (l *simLoader) batchSeconds() float64 {
	fill := float64(l.batch) * (l.read + l.cpu) / float64(max(l.workers, 1))
	return max(l.step, fill)
}

// run advances the loader by interval seconds and reports.
func (l *simLoader) run(t *testing.T, a *Allocator, interval float64) {
	if l.done == 0 {
		l.ran = append(l.ran, l.workers)
	}
	bs := l.batchSeconds()
	n := min(l.length-l.done, int(interval/bs)*l.batch)
	l.done += n
	wait := bs - l.step
	adv, err := a.Report(l.key, Figures{Epoch: l.epoch, Batch: l.batch, Workers: l.workers, Prefetch: 2,
		Step: l.step, Wait: wait, Decode: l.read + l.cpu, CPU: l.cpu, Read: l.read, Samples: n, Length: l.length})
	if err != nil {
		t.Fatalf("%s: %v", l.key, err)
	}
	if l.done >= l.length {
		l.epoch, l.done = l.epoch+1, 0
		l.workers = adv.Workers // the helper applies advice when the next epoch starts
	}
}

// TestLoaderAdviceByModel is TestLoaderAdvice's scenario driven by figures
// from the model and a fake clock, so that it cannot depend on the
// machine's speed or load (the measured version is dlfsbench's advice
// suite): two DataLoaders on one node with 6 loader CPUs, a slow model
// (80 ms a batch of 8) that reports first and a fast one (1 ms a batch)
// that arrives while it runs, each starting with one worker and running
// three epochs of 400 samples.
func TestLoaderAdviceByModel(t *testing.T) {
	c := newClock()
	a := New(Config{CPUs: 6, Cores: 2, Now: c.now, Idle: time.Minute})
	slow := &simLoader{key: Key{"slow", 0}, step: 0.080, read: 0.0005, cpu: 0.0005, batch: 8, length: 400, workers: 1}
	fast := &simLoader{key: Key{"fast", 0}, step: 0.001, read: 0.0005, cpu: 0.0005, batch: 8, length: 400, workers: 1}
	const interval = 0.5 // the helper's report interval
	slow.run(t, a, interval)
	for range 10_000 {
		if slow.epoch >= 3 && fast.epoch >= 3 {
			break
		}
		c.add(time.Duration(interval * float64(time.Second)))
		for _, l := range []*simLoader{slow, fast} {
			if l.epoch < 3 {
				l.run(t, a, interval)
			}
		}
	}
	if slow.epoch < 3 || fast.epoch < 3 {
		t.Fatalf("epochs run: slow %d, fast %d, want 3 each", slow.epoch, fast.epoch)
	}
	for _, l := range []*simLoader{slow, fast} {
		if len(l.ran) != 3 || l.ran[0] != 1 {
			t.Errorf("%s ran its epochs with %v workers, want 3 epochs, the first with the 1 given", l.key, l.ran)
		}
	}
	fa, _ := a.Advice(fast.key)
	sa, _ := a.Advice(slow.key)
	if fa.Generation != sa.Generation || fa.Workers+sa.Workers > 6 || fa.Workers <= sa.Workers || sa.Workers < 1 {
		t.Errorf("advice: fast %+v, slow %+v on 6 loader CPUs; want the fast model to get more, both from one allocation", fa, sa)
	}
	if fast.ran[2] != fa.Workers || slow.ran[2] != sa.Workers {
		t.Errorf("last epochs ran with %d (fast) and %d (slow) workers under advice %+v and %+v", fast.ran[2], slow.ran[2], fa, sa)
	}
	// What the model predicts for each follows from its figures: the slow
	// loop consumes 100 samples/s at most, whatever its workers.
	if sa.Predicted <= 0 || sa.Predicted > 100*1.001 || math.IsNaN(fa.Predicted) || fa.Predicted <= sa.Predicted {
		t.Errorf("predicted: fast %.1f, slow %.1f samples/s; want slow ≤ 100 < fast", fa.Predicted, sa.Predicted)
	}
	t.Logf("advice: fast %+v (epochs %v), slow %+v (epochs %v)", fa, fast.ran, sa, slow.ran)
	st := a.Stats()
	if len(st.Ranks) != 2 || st.Workers > 6 {
		t.Errorf("stats: %+v", st)
	}
	for _, r := range st.Ranks {
		if r.Fit.Mu <= 0 || r.Fit.Measured <= 0 {
			t.Errorf("rank %s/%d without a fit: %+v", r.Job, r.Rank, r.Fit)
		}
	}
}
