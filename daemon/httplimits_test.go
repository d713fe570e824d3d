package daemon

import (
	"testing"
	"time"

	"github.com/dlfs/dlfs/netlimit"
	"github.com/dlfs/dlfs/netlimit/limittest"
	"github.com/dlfs/dlfs/test/conformance"
)

// The metrics server holds at most its connection limit, and closes idle
// keep-alive connections after its idle timeout: idle scrapers cannot pin
// the daemon's descriptors.
func TestMetricsServerBounded(t *testing.T) {
	src := conformance.OddTree(t, t.TempDir())
	n, _ := start(t, src, func(c *Config) {
		c.MetricsAddr = "127.0.0.1:0"
		c.MetricsLimits = netlimit.HTTPConfig{IdleTimeout: 300 * time.Millisecond, MaxConns: 4, MaxPerHost: 4}
	})
	addr := n.MetricsAddr().String()
	answered, refused := limittest.IdleKeepAlives(t, addr, 40)
	if len(answered) != 4 || refused != 36 {
		t.Fatalf("%d of 40 idle keep-alives answered and %d refused, want 4 and 36", len(answered), refused)
	}
	limittest.WaitClosed(t, answered)
	if again, _ := limittest.IdleKeepAlives(t, addr, 1); len(again) != 1 {
		t.Fatal("no answer once the idle connections were closed")
	}
}
