package latency

import (
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestBuckets(t *testing.T) {
	var h Histogram
	for _, c := range []struct {
		d    time.Duration
		want int
	}{
		{0, 0}, {time.Microsecond, 0}, {10 * time.Microsecond, 3}, {11 * time.Microsecond, 4}, {time.Millisecond, 9},
		{3 * time.Millisecond, 11}, {10 * time.Second, 21}, {time.Minute, 22},
	} {
		before := h.counts[c.want].Load()
		h.Observe(c.d)
		if h.counts[c.want].Load() != before+1 {
			t.Errorf("%v: not counted in bucket %d", c.d, c.want)
		}
	}
	if s := h.Summary(); s.Count != 8 || math.Abs(s.Sum-(70.0+0.004+0.000022)) > 1e-9 {
		t.Errorf("summary %+v: want 8 observations summing to 70.004022 s", s)
	}
}

// TestQuantiles: quantiles interpolate within their bucket, as
// Prometheus's histogram_quantile does.
func TestQuantiles(t *testing.T) {
	var h Histogram
	// 100 reads: 90 between 100 and 250 µs, 9 between 1 and 2.5 ms, one
	// beyond 10 s.
	for range 90 {
		h.Observe(200 * time.Microsecond)
	}
	for range 9 {
		h.Observe(2 * time.Millisecond)
	}
	h.Observe(20 * time.Second)
	s := h.Summary()
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-9 }
	if !near(s.P50, 100e-6+150e-6*50/90) || !near(s.P90, 250e-6) || !near(s.P99, 2.5e-3) {
		t.Errorf("p50 %v p90 %v p99 %v", s.P50, s.P90, s.P99)
	}
	if want := (90*200e-6 + 9*2e-3 + 20) / 100; !near(s.Mean, want) {
		t.Errorf("mean %v, want %v", s.Mean, want)
	}
	var empty Histogram
	if s := empty.Summary(); s != (Summary{}) {
		t.Errorf("empty: %+v", s)
	}
}

func TestNil(t *testing.T) {
	var v *Vec
	h := v.With("ram")
	h.Observe(time.Second)
	h.Since(time.Now())
	if v.Summaries() != nil {
		t.Error("a nil Vec has summaries")
	}
}

// TestVecBound: a label fed from outside cannot grow the family past its
// bound; the rest count under "other".
func TestVecBound(t *testing.T) {
	v := NewVec("dlfs_test_duration_seconds", "test", "member", 2)
	v.With("a").Observe(time.Millisecond)
	v.With("b").Observe(time.Millisecond)
	v.With("c").Observe(time.Millisecond)
	v.With("d").Observe(time.Millisecond)
	v.With("a").Observe(time.Millisecond)
	s := v.Summaries()
	if len(s) != 3 || s["a"].Count != 2 || s["other"].Count != 2 {
		t.Errorf("summaries %v: want a (2), b (1), other (2)", s)
	}
}

// TestCollect: the family gathers as Prometheus histograms in seconds.
func TestCollect(t *testing.T) {
	v := NewVec("dlfs_read_duration_seconds", "Reads by source.", "source", 0)
	v.With("ram").Observe(20 * time.Microsecond)
	v.With("ram").Observe(20 * time.Microsecond)
	v.With("pfs").Observe(30 * time.Millisecond)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(v)
	want := `
# HELP dlfs_read_duration_seconds Reads by source.
# TYPE dlfs_read_duration_seconds histogram
`
	var b strings.Builder
	b.WriteString(want)
	for _, c := range []struct {
		src   string
		first int // index of the first bound that holds them
		n     int
		sum   string
	}{{"pfs", 14, 1, "0.03"}, {"ram", 4, 2, "4e-05"}} {
		for i, bound := range Bounds {
			n := 0
			if i >= c.first {
				n = c.n
			}
			b.WriteString("dlfs_read_duration_seconds_bucket{source=\"" + c.src + "\",le=\"" + strconv.FormatFloat(bound, 'g', -1, 64) + "\"} " + strconv.Itoa(n) + "\n")
		}
		b.WriteString("dlfs_read_duration_seconds_bucket{source=\"" + c.src + "\",le=\"+Inf\"} " + strconv.Itoa(c.n) + "\n")
		b.WriteString("dlfs_read_duration_seconds_sum{source=\"" + c.src + "\"} " + c.sum + "\n")
		b.WriteString("dlfs_read_duration_seconds_count{source=\"" + c.src + "\"} " + strconv.Itoa(c.n) + "\n")
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(b.String()), "dlfs_read_duration_seconds"); err != nil {
		t.Error(err)
	}
}

// TestConcurrent: observations from many goroutines all count (run with
// -race).
func TestConcurrent(t *testing.T) {
	v := NewVec("dlfs_test2_duration_seconds", "test", "op", 0)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				v.With([]string{"read", "lookup"}[(g+i)%2]).Observe(time.Duration(i) * time.Microsecond)
			}
		}()
	}
	for range 10 {
		_ = v.Summaries()
	}
	wg.Wait()
	s := v.Summaries()
	if s["read"].Count+s["lookup"].Count != 8000 {
		t.Errorf("%d observations, want 8000", s["read"].Count+s["lookup"].Count)
	}
}

// BenchmarkObserve is what a histogram costs a request: with every core
// observing into one histogram, the worst case for its shared counters.
func BenchmarkObserve(b *testing.B) {
	v := NewVec("dlfs_bench_duration_seconds", "bench", "source", 0)
	h := v.With("ram")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		d := time.Duration(0)
		for pb.Next() {
			d += 7 * time.Microsecond
			h.Observe(d % (3 * time.Millisecond))
		}
	})
}

// BenchmarkSince adds the clock reads a timed request makes.
func BenchmarkSince(b *testing.B) {
	var h Histogram
	b.ReportAllocs()
	for range b.N {
		h.Since(time.Now())
	}
}
