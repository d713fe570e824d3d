package allocator

import (
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// bench3 are the three jobs of issue 15's bench in figures: model steps of
// 5, 20 and 60 ms per batch of 32, workers that wait 2 ms per sample on
// reads and spend 0.1 ms of CPU.
func bench3() []Fit {
	mk := func(step float64) Fit {
		return fit(Figures{Batch: 32, Step: step, Decode: 0.0021, CPU: 0.0001, Read: 0.002})
	}
	return []Fit{mk(0.005), mk(0.020), mk(0.060)}
}

func TestFit(t *testing.T) {
	m := fit(Figures{Batch: 32, Workers: 4, Step: 0.02, Wait: 0.01, Decode: 0.005, CPU: 0.001, Read: 0.002})
	if m.Mu != 1600 || math.Abs(m.Measured-32/0.03) > 1e-9 || m.IO != 0.002 || m.CPU != 0.001 || math.Abs(m.Slowdown-3) > 1e-9 {
		t.Errorf("fit %+v: want μ 1600, measured %.1f, io 0.002, cpu 0.001, slowdown 3", m, 32/0.03)
	}
	// With no read seen, all the wall time beside the CPU is io.
	if m := fit(Figures{Batch: 1, Step: 1, Decode: 0.005, CPU: 0.001}); math.Abs(m.IO-0.004) > 1e-12 || m.Slowdown != 1 {
		t.Errorf("no read: %+v, want io 0.004 and no slowdown", m)
	}
	// A read longer than the wall time leaves (its CPU counted in both)
	// is cut to what is left.
	if m := fit(Figures{Batch: 1, Step: 1, Decode: 0.005, CPU: 0.004, Read: 0.003}); math.Abs(m.IO-0.001) > 1e-12 || m.Slowdown != 1 {
		t.Errorf("long read: %+v, want io 0.001", m)
	}
	// CPU beyond the wall time is impossible: taken as the wall time.
	if m := fit(Figures{Batch: 1, Step: 1, Decode: 0.002, CPU: 0.004}); m.CPU != 0.002 || m.IO != 0 {
		t.Errorf("cpu beyond wall: %+v", m)
	}
	// A step of zero: the model never limits.
	if m := fit(Figures{Batch: 8, Decode: 0.001}); !math.IsInf(m.Mu, 1) || m.rate(2, 1) != 2000 {
		t.Errorf("zero step: %+v, rate %v", m, m.rate(2, 1))
	}
}

func TestRate(t *testing.T) {
	m := Fit{Batch: 10, Mu: 1000, IO: 0.004, CPU: 0.001}
	for _, c := range []struct {
		d    int
		s    float64
		want float64
	}{
		{1, 1, 200}, {4, 1, 800}, {5, 1, 1000}, {9, 1, 1000}, // linear, then μ
		{4, 6, 400}, // CPU stretched 6×: 4 / 0.01
		{0, 1, 10 / (0.01 + 10*0.005)},
	} {
		if got := m.rate(c.d, c.s); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("rate(%d, %v) = %v, want %v", c.d, c.s, got, c.want)
		}
	}
}

func TestSlowdown(t *testing.T) {
	fits := []Fit{{Batch: 1, Mu: math.Inf(1), CPU: 0.01}, {Batch: 1, Mu: math.Inf(1), CPU: 0.01}}
	// Two workers each asking for a whole CPU fit on 2 CPUs.
	if s := slowdown(fits, []int{1, 1}, 2); s != 1 {
		t.Errorf("fits: slowdown %v", s)
	}
	// Eight on 2 CPUs: each gets a quarter.
	if s := slowdown(fits, []int{4, 4}, 2); math.Abs(s-4) > 1e-6 {
		t.Errorf("8 on 2: slowdown %v, want 4", s)
	}
	// The CPU used at the slowdown is the CPUs there are.
	d := []int{4, 4}
	var used float64
	for i, r := range predict(fits, d, 2) {
		used += fits[i].CPU * r
	}
	if math.Abs(used-2) > 1e-6 {
		t.Errorf("CPU used %v, want 2", used)
	}
}

func TestEven(t *testing.T) {
	for _, c := range []struct {
		n, cpus int
		want    []int
	}{{3, 12, []int{4, 4, 4}}, {3, 8, []int{3, 3, 2}}, {3, 3, []int{1, 1, 1}}, {3, 2, []int{1, 1, 0}}, {1, 5, []int{5}}} {
		got := even(c.n, c.cpus, 64)
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("even(%d, %d) = %v, want %v", c.n, c.cpus, got, c.want)
				break
			}
		}
	}
}

// TestNeedBench3: on the bench's jobs, need beats even by well over 1.2×
// in the model, starves none of them, gives the slow model no more
// workers than it can use, and stays within the CPUs.
func TestNeedBench3(t *testing.T) {
	fits := bench3()
	const cpus = 24
	e, n := even(3, cpus, 64), need(fits, cpus, cpus, 64)
	te, tn := predict(fits, e, cpus), predict(fits, n, cpus)
	t.Logf("even %v → %.0f samples/s; need %v → %.0f", e, te, n, tn)
	if sum(tn) < 1.2*sum(te) {
		t.Errorf("need %.0f samples/s, even %.0f: want ≥ 1.2×", sum(tn), sum(te))
	}
	if n[0]+n[1]+n[2] > cpus {
		t.Errorf("need gave %v, more than %d workers", n, cpus)
	}
	for i := range tn {
		if tn[i] < 0.9*te[i] {
			t.Errorf("rank %d: %.0f samples/s under need, %.0f under even", i, tn[i], te[i])
		}
	}
	// The 60 ms model eats 533 samples/s; a worker delivers 476.
	if n[2] != 2 {
		t.Errorf("the slow model got %d workers, want 2 (ceil(533 / 476))", n[2])
	}
}

// TestNeedFewCPUs: with more ranks than CPUs, the total still keeps
// within them: the ranks a worker speeds up most get one, and the rest
// load in their main processes.
func TestNeedFewCPUs(t *testing.T) {
	if d := need(bench3(), 3, 3, 64); d[0] != 1 || d[1] != 1 || d[2] != 1 {
		t.Errorf("as many ranks as CPUs: %v, want one each", d)
	}
	// The 5 ms model gains least from a worker (476 samples/s against 443
	// from its main process, which loads between steps), where the 60 ms
	// model's worker overlaps loading with its long step (476 against 251).
	if d := need(bench3(), 2, 2, 64); d[0] != 0 || d[1] != 1 || d[2] != 1 {
		t.Errorf("three ranks on 2 CPUs: %v, want [0 1 1]", d)
	}
	if d := need(bench3()[:1], 100, 100, 8); d[0] != 8 {
		t.Errorf("max workers: %v, want 8", d)
	}
}

// TestNeedSaturatedCPU: when every worker is busy on the CPU, workers
// beyond the cores only move CPU between ranks: need leaves the budget
// unused rather than over-provision. Workers that wait on reads may
// outnumber the cores.
func TestNeedSaturatedCPU(t *testing.T) {
	f := Fit{Batch: 32, Mu: math.Inf(1), CPU: 0.01}
	if d := need([]Fit{f, f}, 16, 2, 64); d[0] != 1 || d[1] != 1 {
		t.Errorf("CPU-bound ranks, 16 workers allowed on 2 cores: %v, want one each", d)
	}
	io := Fit{Batch: 32, Mu: math.Inf(1), IO: 0.009, CPU: 0.001}
	if d := need([]Fit{io, io}, 16, 2, 64); d[0]+d[1] != 16 {
		t.Errorf("ranks waiting on reads, 16 workers allowed on 2 cores: %v, want all 16", d)
	}
}

// TestNeedRandom: for random ranks, need stays within the CPUs and the
// per-rank bounds, and its predicted total is never much below even's
// (need stops short of workers that add under a fiftieth of an average
// one, where even gives them).
func TestNeedRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	worst, better := 2.0, 0
	defer func() { t.Logf("need ÷ even: worst %.3f; need ahead by over 1%% in %d of 500", worst, better) }()
	for trial := range 500 {
		n := 1 + rng.IntN(6)
		cpus := 1 + rng.IntN(32)
		fits := make([]Fit, n)
		for i := range fits {
			fits[i] = fit(Figures{Batch: 1 + rng.IntN(256), Step: rng.Float64() * 0.2, Wait: rng.Float64() * 0.1,
				Decode: rng.Float64() * 0.02, CPU: rng.Float64() * 0.01, Read: rng.Float64() * 0.01})
		}
		cores := 1 + rng.IntN(cpus)
		d := need(fits, cpus, float64(cores), 16)
		total := 0
		for _, x := range d {
			if x < min(1, cpus/n) || x > 16 {
				t.Fatalf("trial %d: workers %v out of [1, 16] (or [0, 1] with more ranks than %d CPUs)", trial, d, cpus)
			}
			total += x
		}
		if total > cpus {
			t.Fatalf("trial %d: %v: %d workers on %d CPUs", trial, d, total, cpus)
		}
		e := even(n, cpus, 16)
		te, tn := sum(predict(fits, e, float64(cores))), sum(predict(fits, d, float64(cores)))
		worst = min(worst, tn/te)
		if tn > 1.01*te {
			better++
		}
		if tn < 0.9*te {
			t.Errorf("trial %d: need %v %.1f samples/s, even %v %.1f", trial, d, tn, e, te)
		}
	}
}

// report reports f for k and fails the test on an error.
func report(t *testing.T, a *Allocator, k Key, f Figures) Advice {
	t.Helper()
	adv, err := a.Report(k, f)
	if err != nil {
		t.Fatal(err)
	}
	return adv
}

func TestMaxRanks(t *testing.T) {
	a := New(Config{CPUs: 8, MaxRanks: 2, Now: newClock().now})
	report(t, a, Key{"a", 0}, figures(0.01, 0))
	report(t, a, Key{"a", 1}, figures(0.01, 0))
	if _, err := a.Report(Key{"b", 0}, figures(0.01, 0)); err == nil {
		t.Error("a third rank was taken with MaxRanks 2")
	}
	report(t, a, Key{"a", 1}, figures(0.01, 1)) // a known rank still reports
	a.End("a")
	report(t, a, Key{"b", 0}, figures(0.01, 0))
}

// clock is a settable time for the allocator's tests.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock               { return &clock{t: time.Unix(1e9, 0)} }
func figures(step float64, e int) Figures {
	return Figures{Epoch: e, Batch: 32, Workers: 2, Prefetch: 2, Step: step, Decode: 0.0021, CPU: 0.0001, Read: 0.002, Samples: 320}
}

func TestAllocatorLifecycle(t *testing.T) {
	c := newClock()
	a := New(Config{CPUs: 12, Cores: 12, Now: c.now, Idle: time.Minute})
	fast, mid, slow := Key{"fast", 0}, Key{"mid", 0}, Key{"slow", 0}
	if adv := report(t, a, fast, figures(0.005, 0)); adv.Workers != 12 || adv.Reason != "arrival" {
		t.Fatalf("alone: %+v, want all 12 workers", adv)
	}
	report(t, a, mid, figures(0.020, 0))
	if adv := report(t, a, slow, figures(0.060, 0)); adv.Workers != 2 {
		t.Errorf("slow: %+v, want 2 workers", adv)
	}
	advised := func() int {
		n := 0
		for _, k := range []Key{fast, mid, slow} {
			if adv, ok := a.Advice(k); ok {
				n += adv.Workers
			}
		}
		return n
	}
	if n := advised(); n != 12 {
		t.Errorf("%d workers advised on 12 CPUs, want all 12 (fast can use them)", n)
	}
	gen := a.Stats().Allocations

	// A drift within the epoch it was allocated in changes nothing; in
	// the next epoch it does, once.
	report(t, a, slow, figures(0.010, 0))
	if a.Stats().Allocations != gen {
		t.Error("a drift reallocated within the same epoch")
	}
	if adv := report(t, a, slow, figures(0.010, 1)); adv.Reason != "drift" || adv.Workers <= 2 {
		t.Errorf("drift in epoch 1: %+v, want more workers for a faster model", adv)
	}
	gen = a.Stats().Allocations
	report(t, a, slow, figures(0.060, 1))
	if a.Stats().Allocations != gen {
		t.Error("a second drift in epoch 1 reallocated")
	}
	// A small change is not a drift.
	report(t, a, mid, figures(0.022, 2))
	if a.Stats().Allocations != gen {
		t.Error("a 10% change reallocated")
	}

	// mid ends: its workers go to fast, which can use them.
	before, _ := a.Advice(fast)
	if !a.End("mid") || a.End("mid") {
		t.Error("End: want true once, then false")
	}
	after, _ := a.Advice(fast)
	if _, ok := a.Advice(mid); ok || after.Workers <= before.Workers || after.Reason != "end" {
		t.Errorf("after the end: fast %+v (was %+v)", after, before)
	}
	if n := advised(); n > 12 {
		t.Errorf("%d workers advised on 12 CPUs", n)
	}

	// fast stops reporting: it keeps its advice until idle, then goes.
	c.add(50 * time.Second)
	report(t, a, slow, figures(0.060, 3))
	if _, ok := a.Advice(fast); !ok {
		t.Error("fast dropped before it went idle")
	}
	c.add(20 * time.Second)
	if _, ok := a.Advice(fast); ok {
		t.Error("fast kept after a minute without a report")
	}
	if adv, _ := a.Advice(slow); adv.Reason != "idle" {
		t.Errorf("slow after fast went idle: %+v", adv)
	}

	st := a.Stats()
	if len(st.Ranks) != 1 || st.Ranks[0].Job != "slow" || st.Workers > 12 {
		t.Errorf("stats: %+v", st)
	}
	var left []string
	for _, ch := range st.Changes {
		if ch.Workers == 0 {
			left = append(left, ch.Job+":"+ch.Reason)
		}
	}
	if len(left) != 2 || left[0] != "mid:end" || left[1] != "fast:idle" {
		t.Errorf("timeline departures %v, want mid:end, fast:idle", left)
	}
}

func TestAllocatorEven(t *testing.T) {
	a := New(Config{CPUs: 12, Cores: 12, Mode: Even, Now: newClock().now})
	for i, s := range []float64{0.005, 0.02, 0.06} {
		report(t, a, Key{"j", i}, figures(s, 0))
	}
	for i := range 3 {
		if adv, _ := a.Advice(Key{"j", i}); adv.Workers != 4 || adv.PrefetchFactor != 2 {
			t.Errorf("rank %d: %+v, want 4 workers", i, adv)
		}
	}
}

// TestOverhead: a rank whose loader is the bottleneck shows what its
// workers spend beyond __getitem__, the model takes it from then on, and
// predicts the rank's rate with more workers from it.
func TestOverhead(t *testing.T) {
	a := New(Config{CPUs: 8, Cores: 8, Now: newClock().now})
	// 2 workers at 2.1 ms a sample in __getitem__ would deliver 952
	// samples/s; the loop measures half that, and waits for it.
	f := figures(0.020, 0)
	f.Wait = 32/(2/0.0021)*2 - f.Step
	report(t, a, Key{"j", 0}, f)
	r := a.Stats().Ranks[0]
	if math.Abs(r.Fit.Overhead-2) > 1e-9 || r.Model.Error > 1e-9 {
		t.Errorf("loader-bound: %+v, %+v; want overhead 2 and the rate explained", r.Fit, r.Model)
	}
	// The advice gives it enough workers for its 20 ms model at that
	// cost: 1600 / (952 / 2 / 2) = 6.7, so 7.
	if r.Advice.Workers != 7 {
		t.Errorf("advice %+v, want 7 workers", r.Advice)
	}
	// With them it keeps up (no wait): the overhead is kept.
	f.Workers, f.Wait, f.Epoch = 7, 0, 1
	report(t, a, Key{"j", 0}, f)
	if r := a.Stats().Ranks[0]; r.Fit.Overhead != 2 || r.Model.Error > 0.01 {
		t.Errorf("keeping up: %+v, %+v", r.Fit, r.Model)
	}
	// But a report where fewer workers keep up bounds it: 3 workers fed
	// the 20 ms loop, so each took at most 3 × 20 ms / 32 = 1.9 ms a
	// sample, under the 2.1 ms of __getitem__ alone: k is 1, not 2.
	f.Workers, f.Epoch = 3, 2
	report(t, a, Key{"j", 0}, f)
	if r := a.Stats().Ranks[0]; r.Fit.Overhead != 1 {
		t.Errorf("3 workers keeping up: overhead %v, want 1", r.Fit.Overhead)
	}
	// A fit with no wait shows none.
	if m := fit(Figures{Batch: 8, Workers: 2, Step: 0.01, Decode: 0.001}); m.Overhead != 0 {
		t.Errorf("no wait: overhead %v", m.Overhead)
	}
	// Loading in the main process: wait = batch·k·decode.
	if m := fit(Figures{Batch: 8, Workers: 0, Step: 0.01, Wait: 0.016, Decode: 0.001}); math.Abs(m.Overhead-2) > 1e-9 {
		t.Errorf("no workers: overhead %v, want 2", m.Overhead)
	}
}

// TestDriftKept: a drift whose new allocation would deliver under 5% more
// keeps the workers (a change restarts every DataLoader's workers), and
// only the predictions follow the new figures.
func TestDriftKept(t *testing.T) {
	a := New(Config{CPUs: 12, Cores: 12, Now: newClock().now})
	report(t, a, Key{"fast", 0}, figures(0.005, 0))
	report(t, a, Key{"mid", 0}, figures(0.020, 0))
	before, _ := a.Advice(Key{"fast", 0})
	f := figures(0.005, 1)
	f.Decode, f.Read = f.Decode*1.6, f.Read*1.6 // its reads got 30% slower, as blended: a drift, but the best split is the same
	after := report(t, a, Key{"fast", 0}, f)
	if after.Generation != before.Generation || after.Workers != before.Workers {
		t.Errorf("a drift that changes nothing worth it reallocated: %+v, then %+v", before, after)
	}
	if after.Predicted == before.Predicted {
		t.Errorf("the prediction did not follow the drift: %+v", after)
	}
}

// TestBlend: reports with the same workers are averaged, each new one
// weighing half; other workers start anew; a report with no reads seen
// keeps the last read time.
func TestBlend(t *testing.T) {
	a := Figures{Workers: 2, Batch: 8, Step: 0.01, Wait: 0.02, Decode: 0.004, CPU: 0.001, Read: 0.002}
	b := Figures{Workers: 2, Batch: 8, Step: 0.03, Wait: 0, Decode: 0.002, CPU: 0.001}
	got := blend(a, b)
	if got.Step != 0.02 || got.Wait != 0.01 || got.Decode != 0.003 || got.Read != 0.002 {
		t.Errorf("blend: %+v", got)
	}
	b.Workers = 3
	if got := blend(a, b); !reflect.DeepEqual(got, b) {
		t.Errorf("other workers: %+v, want the new report", got)
	}
}

// TestNodeCPU: what the node spends per sample beyond the workers comes
// from its busy time, and puts the knee where the node's cores run out.
func TestNodeCPU(t *testing.T) {
	c := newClock()
	var busy, total float64
	a := New(Config{CPUs: 24, Cores: 2, Now: c.now, NodeCPU: func() (float64, float64, error) {
		return busy, total, nil
	}})
	// 8 workers waiting 7 ms a sample on reads, 0.1 ms of CPU each: the
	// loop measures 1,000 samples/s while the node is 90% busy.
	f := Figures{Epoch: 0, Batch: 32, Workers: 8, Step: 0.005, Wait: 0.027, Decode: 0.0071, CPU: 0.0001, Read: 0.007, Samples: 1000}
	report(t, a, Key{"j", 0}, f)
	for range 3 {
		c.add(time.Second)
		busy, total = busy+1.8, total+2
		report(t, a, Key{"j", 0}, f)
	}
	st := a.Stats()
	// (1.8 cores − 1,000/s × 0.1 ms) / 1,000/s = 1.7 ms a sample.
	if math.Abs(st.Busy-0.9) > 1e-9 || math.Abs(st.Ranks[0].Fit.Extra-0.0017) > 1e-9 {
		t.Fatalf("busy %v, extra %v; want 0.9 and 1.7 ms", st.Busy, st.Ranks[0].Fit.Extra)
	}
	// So no number of workers gets it past 2 cores / 1.8 ms = 1,111/s.
	fits := a.fitsLocked([]Key{{"j", 0}})
	if got := predict(fits, []int{24}, 2)[0]; got > 1111.2 || got < 1100 {
		t.Errorf("24 workers: %.0f samples/s predicted, want the node's ceiling of 1,111", got)
	}
	if got := predict(fits, []int{8}, 2)[0]; math.Abs(got-1000) > 30 {
		t.Errorf("8 workers: %.0f samples/s predicted, want about the 1,000 measured", got)
	}
}

// TestIdleByReads: a job whose helper stops reporting keeps its advice
// while dlfs still serves its reads, and goes once those stop too.
func TestIdleByReads(t *testing.T) {
	c := newClock()
	var read time.Time
	a := New(Config{CPUs: 8, Cores: 8, Now: c.now, Idle: time.Minute, LastRead: func(k Key) time.Time {
		if k.Job == "quiet" {
			return read
		}
		return time.Time{}
	}})
	report(t, a, Key{"quiet", 0}, figures(0.02, 0))
	c.add(90 * time.Second)
	read = c.now().Add(-10 * time.Second)
	if _, ok := a.Advice(Key{"quiet", 0}); !ok {
		t.Fatal("a job still reading was dropped for not reporting")
	}
	c.add(time.Minute)
	if _, ok := a.Advice(Key{"quiet", 0}); ok {
		t.Error("a job neither reporting nor reading for over a minute was kept")
	}
}

// TestEpochStart: a rank whose epoch of 3,200 samples takes 0.8 s to its
// first batch, of which the batch itself (one worker, 32 samples at 4 ms)
// is 0.128 s and the workers' start 0.084 s each, delivers 800 samples/s
// over an epoch where its steady rate is 1,000; the model predicts that,
// and a worker that adds little in steady state is not worth its start.
func TestEpochStart(t *testing.T) {
	// 8 workers, 32-sample batches, a 32 ms step, no wait: 1,000/s.
	m := fit(Figures{Batch: 32, Workers: 8, Step: 0.032, Decode: 0.004, CPU: 0.001, Start: 0.8, Length: 3200})
	if math.Abs(m.Start-0.084) > 1e-12 || math.Abs(m.Measured-800) > 1e-9 {
		t.Fatalf("fit %+v: want 0.084 s a worker and 800 samples/s measured", m)
	}
	if got := m.rate(8, 1); math.Abs(got-800) > 1e-9 {
		t.Errorf("rate(8) = %v, want 800", got)
	}
	// Twice the workers cost twice their start, not twice the first batch.
	if got, want := m.rate(16, 1), 3200/(16*0.084+0.128+3.2); math.Abs(got-want) > 1e-9 {
		t.Errorf("rate(16) = %v, want %v", got, want)
	}
	// Its model eats 1,000/s: 4 workers at 4 ms a sample are enough in
	// steady state (1,000/s); more only start slower.
	if d := need([]Fit{m}, 16, 16, 16); d[0] != 4 {
		t.Errorf("need gave %v workers, want 4", d)
	}
}

// TestAdviceWithinCPUs: however many ranks report, the advice in force
// never adds up to more workers than Config.CPUs, in either mode.
func TestAdviceWithinCPUs(t *testing.T) {
	for _, mode := range []Mode{Need, Even} {
		a := New(Config{CPUs: 3, Mode: mode, Now: newClock().now})
		for r := range 5 {
			report(t, a, Key{"j", r}, figures(0.01*float64(r+1), 0))
			total := 0
			for q := range r + 1 {
				adv, ok := a.Advice(Key{"j", q})
				if !ok {
					t.Fatalf("%s: rank %d has no advice", mode, q)
				}
				total += adv.Workers
			}
			if total > 3 {
				t.Errorf("%s, %d ranks: %d workers advised on 3 CPUs", mode, r+1, total)
			}
		}
	}
}
