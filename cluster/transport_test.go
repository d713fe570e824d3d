package cluster

import (
	"bytes"
	"testing"
	"time"

	"github.com/dlfs/dlfs/netlimit"
	"github.com/dlfs/dlfs/netlimit/limittest"
)

// A stranger who opens many idle streams to the gossip port holds at most
// its share of them, each for a short while; members from other addresses
// still join.
func TestGossipStreamsBounded(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	// memberlist's LAN timings: it holds an idle stream for 10 s.
	a, err := Start(Config{NodeName: "node-a", Bind: "127.0.0.1:0", Key: key,
		Streams: netlimit.Config{MaxConns: 32, MaxPerHost: 8, Lifetime: time.Second},
		Meta:    Meta{DataAddr: "127.0.0.1:1", Dataset: "ds"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })

	idle := limittest.DialFrom(t, "127.0.0.2", a.Addr(), 200)
	limittest.WaitFor(t, "every stream to be admitted or refused", func() bool {
		return a.tr.lim.Held()+int(a.tr.lim.Refused()) == 200
	})
	if held := a.tr.lim.HeldBy("127.0.0.2"); held > 8 {
		t.Fatalf("one address holds %d streams, over its 8", held)
	}
	if closed := limittest.ClosedByServer(idle); closed < 192 {
		t.Fatalf("the gossip port closed %d of 200 idle streams from one address at once, want at least 192", closed)
	}

	b := start(t, "node-b", key, a.Addr())
	waitView(t, a, 2)
	waitView(t, b, 2)

	limittest.WaitClosed(t, idle)
	limittest.WaitFor(t, "every stranger's slot to come free", func() bool { return a.tr.lim.HeldBy("127.0.0.2") == 0 })
}

func TestStreamLimitsDefaults(t *testing.T) {
	l := streamLimits(Config{Streams: netlimit.Config{MaxConns: 4}}, 10*time.Second)
	if l.MaxConns != 4 || l.MaxPerHost != 4 || l.Lifetime != 5*time.Second || l.Reserve != 1 || !l.Evict || l.Bytes != 16<<20 {
		t.Fatalf("limits %+v: want MaxConns 4, MaxPerHost 4 (capped by MaxConns), Lifetime 5s, Reserve 1 (a quarter), Evict, Bytes 16 MiB", l)
	}
	if l := streamLimits(Config{}, time.Second); l.Lifetime != time.Second || l.MaxPerHost != 16 {
		t.Fatalf("limits %+v: want the stream timeout when shorter, 16 per address", l)
	}
	if _, err := Start(Config{NodeName: "x", Bind: "127.0.0.1:0", Insecure: true, Streams: netlimit.Config{MaxConns: -1}}); err == nil {
		t.Fatal("Start took a negative stream limit")
	}
}
