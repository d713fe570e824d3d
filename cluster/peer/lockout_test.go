package peer

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlfs/dlfs/netlimit/limittest"
)

// lockedBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestKeylessClientCannotLockOut: a keyless client that opens 1,100 idle
// connections from one address holds at most its share of the handshake
// slots and queue, each for a short while; a real peer from another
// address is still served, and the refusals cost one log line for each
// reason, not one each (finding of issue 27).
func TestKeylessClientCannotLockOut(t *testing.T) {
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	lim := defaultLimits(log)
	lim.strangers.LogEvery = time.Hour // so that the test sees one line per reason
	s, err := listen("127.0.0.1:0", testKey, mapSource{files: map[string][]byte{"b.jpg": []byte("bee")}}, log, lim)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	idle := limittest.DialFrom(t, "127.0.0.2", s.Addr(), 1100)
	limittest.WaitFor(t, "every connection to be admitted or refused", func() bool {
		return s.ln.Held()+int(s.ln.Refused()) == 1100
	})
	if held := s.ln.HeldBy("127.0.0.2"); held > MaxPerAddress {
		t.Fatalf("one address holds %d places, over its %d", held, MaxPerAddress)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := client(t, testKey).Fetch(ctx, s.Addr(), []Item{item("b.jpg", 3)})
	if err != nil || res[0].Status != StatusOK {
		t.Fatalf("a real peer from another address is not served while a keyless one idles: %v %+v", err, res)
	}
	if held := s.ln.HeldBy("127.0.0.1"); held != 0 {
		t.Errorf("the real peer's connection, authenticated, still counts %d against strangers' places", held)
	}

	// Idle connections with a slot are closed after the hello timeout.
	limittest.WaitClosed(t, idle)
	limittest.WaitFor(t, "the keyless client's places to come free", func() bool { return s.ln.HeldBy("127.0.0.2") == 0 })
	if n := strings.Count(logs.String(), "level=WARN"); n == 0 || n > 3 {
		t.Fatalf("%d WARN lines for one flood, want 1 to 3 (one for each reason):\n%s", n, logs.String())
	}
}

// TestGonePeerForgotten: the connection to a peer that went leaves the
// client's table; a client that outlives many peers holds none of theirs.
func TestGonePeerForgotten(t *testing.T) {
	cl := client(t, testKey)
	for range 3 {
		s, _ := serve(t, testKey)
		if _, err := cl.Fetch(context.Background(), s.Addr(), []Item{item("b.jpg", 3)}); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	limittest.WaitFor(t, "the connections to gone peers to be dropped", func() bool {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		return len(cl.conns) == 0
	})
}
