package cluster

import (
	"log/slog"
	"os"
	"testing"
	"time"
)

// TestRejoinAfterCrash: a node that crashed (no leave) and comes back
// under the same name at a new address is seen again, at its new address.
func TestRejoinAfterCrash(t *testing.T) {
	var logger *slog.Logger
	if testing.Verbose() {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	mk := func(name string, join ...string) *Cluster {
		c, err := Start(Config{NodeName: name, Bind: "127.0.0.1:0", Join: join, Local: true, Insecure: true, Logger: logger,
			Meta: Meta{DataAddr: "127.0.0.1:1", Dataset: "ds", RAM: 1, SSD: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := mk("node-a")
	defer a.Close()
	c := mk("node-c", a.Addr())
	waitView(t, a, 2)
	c.mu.Lock()
	c.closed = true // a crash: no leave message, and no Close later
	c.mu.Unlock()
	close(c.stop)
	c.wg.Wait()
	c.ml.Shutdown()
	waitView(t, a, 1)
	c2 := mk("node-c", a.Addr())
	defer c2.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		found := false
		for _, m := range a.Alive() {
			found = found || m.Name == "node-c" && m.Addr == c2.Addr()
		}
		if found {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a sees %v; the new node-c is at %s", a.Members(), c2.Addr())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
