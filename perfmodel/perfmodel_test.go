package perfmodel

import (
	"math"
	"math/rand"
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

// TestOrderFollowsMeasurements: priors put a peer before the PFS; once the
// peer is measured slower, the PFS comes first; a failed source is
// skipped for the backoff and then tried again.
func TestOrderFollowsMeasurements(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Backoff = 50 * time.Millisecond
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
	deadline := time.Now().Add(5 * time.Second)
	for order()[1] != "peer:b" {
		if time.Now().After(deadline) {
			t.Fatal("the peer was never tried again after its backoff")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
