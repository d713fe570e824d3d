package cluster

import (
	"log/slog"
	"slices"
	"testing"
)

// TestResolveJoin: the --join entries name each address once, this
// node's own left out; an entry that is not HOST:PORT names none.
func TestResolveJoin(t *testing.T) {
	c := &Cluster{addr: "127.0.0.1:7000", log: slog.New(slog.DiscardHandler),
		cfg: Config{Join: []string{"127.0.0.1:7001", "127.0.0.1:7000", "127.0.0.1:7001", "nonsense", "[::1]:7002", "[::ffff:127.0.0.1]:7001", "[0:0::1]:7002"}}}
	got := c.resolveJoin()
	if want := []string{"127.0.0.1:7001", "[::1]:7002"}; !slices.Equal(got, want) {
		t.Fatalf("resolved %v, want %v", got, want)
	}
}
