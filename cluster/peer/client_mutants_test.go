package peer

// Tests written against the mutants gremlins left alive (make mutate,
// docs/mutation.md).

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlfs/dlfs/integrity"
)

var mutKey = []byte("a key for the mutant tests")

// sizedSource serves, for any path, a block of the size its Block number
// says (block n: n bytes), summed under the asker's tag.
type sizedSource struct{}

func (sizedSource) Block(it Item) ([]byte, uint32, byte) {
	b := make([]byte, it.Block)
	return b, integrity.Sum(it.Tag, b), StatusOK
}

func (s sizedSource) Cached(it Item) ([]byte, uint32, byte) { return s.Block(it) }

// mutServer starts a server of src with the test key, closed with the test.
func mutServer(t *testing.T, src Source, log *slog.Logger) *Server {
	t.Helper()
	s, err := Listen("127.0.0.1:0", mutKey, src, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// mutClient returns a client with the test key, closed with the test.
func mutClient(t *testing.T) *Client {
	t.Helper()
	cl, err := NewClient(mutKey)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// TestClientDialsWithADeadline: a dial gives up after 2 s, whatever the
// caller's context.
func TestClientDialsWithADeadline(t *testing.T) {
	cl := mutClient(t)
	if cl.dialTimeout != 2*time.Second {
		t.Fatalf("dial timeout %v, want 2s", cl.dialTimeout)
	}
}

// TestFetchMaxItems: a request of MaxItems items is sent and answered
// whole; one more is refused before anything is sent.
func TestFetchMaxItems(t *testing.T) {
	s := mutServer(t, sizedSource{}, nil)
	cl := mutClient(t)
	items := make([]Item, MaxItems+1)
	for i := range items {
		items[i] = Item{Path: "f", Block: 1, Tag: uint64(i)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cl.Fetch(ctx, s.Addr(), items[:MaxItems])
	if err != nil || len(res) != MaxItems {
		t.Fatalf("MaxItems items: %d results, %v", len(res), err)
	}
	for i, r := range res {
		if r.Status != StatusOK || !integrity.Check(uint64(i), r.Sum, r.Data) {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	if _, err := cl.Fetch(ctx, s.Addr(), items); err == nil {
		t.Fatal("MaxItems+1 items were sent")
	}
	if _, err := cl.Fetch(ctx, s.Addr(), nil); err == nil {
		t.Fatal("no items were sent")
	}
}

// fakePeer is a TLS peer with the key that answers each request with
// answer(items), and counts the connections it accepted.
func fakePeer(t *testing.T, answer func([]Item) []Result) (addr string, conns *atomic.Int32) {
	t.Helper()
	cfg, err := tlsConfig(mutKey)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	conns = &atomic.Int32{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				tc := tls.Server(c, cfg)
				for {
					b, err := readFrame(tc)
					if err != nil {
						return
					}
					id, items, _, err := decodeRequest(b)
					if err != nil {
						return
					}
					if writeFrame(tc, encodeResponse(id, answer(items))) != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String(), conns
}

// TestFetchWrongCount: a peer that answers with another number of results
// than items asked is a malformed answer, never results.
func TestFetchWrongCount(t *testing.T) {
	addr, _ := fakePeer(t, func(items []Item) []Result { return make([]Result, len(items)+1) })
	cl := mutClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cl.Fetch(ctx, addr, []Item{{Path: "a", Tag: 1}, {Path: "b", Tag: 2}})
	if !errors.Is(err, ErrWire) || res != nil {
		t.Fatalf("3 results for 2 items: %v, %v; want ErrWire", res, err)
	}
}

// TestConnectionReused: requests to one peer share one connection while it
// works.
func TestConnectionReused(t *testing.T) {
	addr, conns := fakePeer(t, func(items []Item) []Result { return make([]Result, len(items)) })
	cl := mutClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 5; i++ {
		if _, err := cl.Fetch(ctx, addr, []Item{{Path: "a", Tag: uint64(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("5 requests took %d connections, want 1", n)
	}
}

// TestAnswerByteBound: a response carries blocks up to MaxResponseBytes
// exactly; past them, items get StatusError, an empty block too.
func TestAnswerByteBound(t *testing.T) {
	s := mutServer(t, sizedSource{}, nil)
	half := int64(MaxResponseBytes / 2)
	res := s.answer([]Item{{Path: "a", Block: half}, {Path: "b", Block: half}, {Path: "c", Block: 0}, {Path: "d", Block: 1}}, false)
	want := []byte{StatusOK, StatusOK, StatusError, StatusError}
	for i, r := range res {
		if r.Status != want[i] {
			t.Errorf("item %d: status %d, want %d", i, r.Status, want[i])
		}
	}
	res = s.answer([]Item{{Path: "a", Block: half}, {Path: "b", Block: half + 1}, {Path: "c", Block: 1}}, false)
	if res[0].Status != StatusOK || res[1].Status != StatusError || res[1].Data != nil || res[2].Status != StatusError {
		t.Errorf("a block past the bound: %d, %d (%d bytes), %d; want it and the rest StatusError", res[0].Status, res[1].Status, len(res[1].Data), res[2].Status)
	}
}

// panicSource panics on every block.
type panicSource struct{ sizedSource }

func (panicSource) Block(Item) ([]byte, uint32, byte) { panic("a bug while serving") }

// logCount counts the records a logger was given.
type logCount struct{ n atomic.Int32 }

func (c *logCount) Enabled(context.Context, slog.Level) bool  { return true }
func (c *logCount) Handle(context.Context, slog.Record) error { c.n.Add(1); return nil }
func (c *logCount) WithAttrs([]slog.Attr) slog.Handler        { return c }
func (c *logCount) WithGroup(string) slog.Handler             { return c }

// TestServerUsesTheLogger: what the server logs goes to the logger given
// to Listen.
func TestServerUsesTheLogger(t *testing.T) {
	logs := &logCount{}
	s := mutServer(t, panicSource{}, slog.New(logs))
	cl := mutClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cl.Fetch(ctx, s.Addr(), []Item{{Path: "a", Block: 1}})
	if err != nil || len(res) != 1 || res[0].Status != StatusError {
		t.Fatalf("a panicking block: %+v, %v; want StatusError", res, err)
	}
	if logs.n.Load() == 0 {
		t.Fatal("the panic was not logged to the logger given")
	}
}
