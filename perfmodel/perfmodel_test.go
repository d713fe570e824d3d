package perfmodel

import (
	"math"
	"math/rand"
	"sync/atomic"
	"testing"
	"time"
)

// TestFitsLatencyAndBandwidth: reads of varied sizes from a source of 2 ms
// latency and 100 MB/s, with 10% noise, give back both within 15%.
func TestFitsLatencyAndBandwidth(t *testing.T) {
	m := New(DefaultConfig())
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 2000; i++ {
		n := int64(10_000 + rng.Intn(1_000_000))
		d := 2*time.Millisecond + time.Duration(float64(n)/100e6*1e9)
		m.Observe("pfs", n, time.Duration(float64(d)*(0.9+0.2*rng.Float64())))
	}
	s := m.Stats()["pfs"]
	if math.Abs(s.LatencyMs-2) > 0.3 || math.Abs(s.BandwidthMBps-100) > 15 {
		t.Errorf("fitted %+v, want 2 ms and 100 MB/s", s)
	}
	if got := m.Estimate("pfs", 1_000_000); got < 10*time.Millisecond || got > 14*time.Millisecond {
		t.Errorf("estimate for 1 MB %v, want about 12 ms", got)
	}
}

// TestOneSize: reads all of one size still predict that size exactly.
func TestOneSize(t *testing.T) {
	m := New(DefaultConfig())
	for i := 0; i < 100; i++ {
		m.Observe("peer:b", 100_000, 3*time.Millisecond)
	}
	if got := m.Estimate("peer:b", 100_000); got < 2900*time.Microsecond || got > 3100*time.Microsecond {
		t.Errorf("estimate %v, want 3 ms", got)
	}
}

// clock is a fake Config.Now that moves only when told to.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func fakeClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

// TestOrderFollowsMeasurements: priors put a peer before the PFS; once the
// peer is measured slower, the PFS comes first; a failed source is
// skipped for the backoff and then tried again.
func TestOrderFollowsMeasurements(t *testing.T) {
	c := fakeClock()
	cfg := DefaultConfig()
	cfg.Backoff = 50 * time.Millisecond
	cfg.Now = c.now
	m := New(cfg)
	order := func() []string {
		s := []string{"ssd", "peer:b", "pfs"}
		m.Order(s, 100_000)
		return s
	}
	if o := order(); o[0] != "ssd" || o[1] != "peer:b" || o[2] != "pfs" {
		t.Fatalf("unmeasured order %v", o)
	}
	for i := 0; i < 50; i++ {
		m.Observe("pfs", 100_000+int64(i), 4*time.Millisecond)
		m.Observe("peer:b", 100_000+int64(i), 40*time.Millisecond) // a busy peer
	}
	if o := order(); o[1] != "pfs" || o[2] != "peer:b" {
		t.Fatalf("order with a slow peer %v, want the PFS before it", o)
	}
	for i := 0; i < 200; i++ {
		m.Observe("peer:b", 100_000, time.Millisecond) // recovered
	}
	if o := order(); o[1] != "peer:b" {
		t.Fatalf("order after the peer recovered %v", o)
	}
	m.Fail("peer:b")
	if o := order(); o[2] != "peer:b" || m.Estimate("peer:b", 1) != Unreachable || !m.Stats()["peer:b"].Skipped {
		t.Fatalf("order after a failure %v, want the peer last", o)
	}
	c.advance(50 * time.Millisecond)
	if o := order(); o[1] != "peer:b" {
		t.Fatalf("order after the backoff %v, want the peer tried again", o)
	}
}

// TestBackoff, on a fake clock: a failure skips a source for Backoff,
// doubled for each failure in a row up to 32 times; failures while it is
// skipped do not lengthen the wait; a read that succeeds starts the
// count again. Since counts from the last read.
func TestBackoff(t *testing.T) {
	c := fakeClock()
	m := New(Config{Backoff: time.Second, Now: c.now})
	skippedFor := func() time.Duration {
		t.Helper()
		var d time.Duration
		for m.Estimate("pfs", 1) == Unreachable {
			if !m.Stats()["pfs"].Skipped {
				t.Fatal("unreachable but not shown as skipped")
			}
			c.advance(time.Millisecond)
			if d += time.Millisecond; d > time.Minute {
				t.Fatal("skipped for over a minute")
			}
		}
		return d
	}
	for i, want := range []time.Duration{1, 2, 4, 8, 16, 32, 32} {
		m.Fail("pfs")
		if i == 0 {
			c.advance(500 * time.Millisecond)
			m.Fail("pfs") // in flight during the outage: not counted again
			c.advance(-500 * time.Millisecond)
		}
		if got := skippedFor(); got != want*time.Second {
			t.Fatalf("failure %d in a row: skipped for %v, want %v", i+1, got, want*time.Second)
		}
	}
	if st := m.Stats()["pfs"]; st.Failures != 8 || st.Skipped {
		t.Fatalf("stats %+v, want 8 failures and not skipped", st)
	}
	m.Observe("pfs", 100, time.Millisecond)
	m.Fail("pfs")
	if got := skippedFor(); got != time.Second {
		t.Fatalf("after a read: skipped for %v, want the first backoff again", got)
	}
	if m.Since("ssd") != math.MaxInt64 {
		t.Error("Since of a source never read")
	}
	m.Observe("ssd", 100, time.Millisecond)
	c.advance(3 * time.Second)
	if got := m.Since("ssd"); got != 3*time.Second {
		t.Errorf("Since = %v, want 3s", got)
	}
}
