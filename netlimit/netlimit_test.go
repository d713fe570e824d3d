package netlimit

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlfs/dlfs/netlimit/limittest"
)

// serve accepts on ln until it closes, keeping what it accepts open.
func serve(t *testing.T, ln net.Listener) *[]net.Conn {
	t.Helper()
	var (
		mu    sync.Mutex
		conns []net.Conn
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return &conns
}

// The rule: whatever arrives, a server holds at most MaxConns, and at
// most MaxPerHost from one address; the rest are closed at once.
func TestBounds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	l, err := NewListener(ln, Config{Name: "test", MaxConns: 6, MaxPerHost: 4, LogEvery: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, l)
	addr := ln.Addr().String()

	a := limittest.DialFrom(t, "127.0.0.2", addr, 20)
	limittest.WaitFor(t, "the first address's connections to be decided", func() bool { return l.Held()+int(l.Refused()) == 20 })
	if got := l.HeldBy("127.0.0.2"); got != 4 {
		t.Errorf("one address holds %d slots, want MaxPerHost=4", got)
	}
	b := limittest.DialFrom(t, "127.0.0.3", addr, 20)
	limittest.WaitFor(t, "the second address's connections to be decided", func() bool { return l.Held()+int(l.Refused()) == 40 })
	if got := l.Held(); got != 6 {
		t.Errorf("holds %d, want MaxConns=6", got)
	}
	if got := l.HeldBy("127.0.0.3"); got != 2 {
		t.Errorf("the second address holds %d, want the 2 left", got)
	}
	if got := limittest.ClosedByServer(a); got != 16 {
		t.Errorf("the server closed %d of the first address's 20, want 16", got)
	}
	if got := limittest.ClosedByServer(b); got != 18 {
		t.Errorf("the server closed %d of the second address's 20, want 18", got)
	}
	if n := strings.Count(logs.String(), "refusing"); n != 1 {
		t.Errorf("34 refusals logged %d lines in one interval, want 1:\n%s", n, logs.String())
	}
}

// A closed or released connection gives its slot back, once.
func TestRelease(t *testing.T) {
	l, err := New(Config{MaxConns: 2, MaxPerHost: 2})
	if err != nil {
		t.Fatal(err)
	}
	var cs []*Conn
	for range 3 {
		c1, c2 := net.Pipe()
		t.Cleanup(func() { c1.Close(); c2.Close() })
		if c, ok := l.Admit(c1); ok {
			cs = append(cs, c)
		}
	}
	if len(cs) != 2 || l.Held() != 2 || l.Refused() != 1 {
		t.Fatalf("admitted %d, held %d, refused %d; want 2, 2, 1", len(cs), l.Held(), l.Refused())
	}
	cs[0].Release()
	cs[0].Release()
	cs[0].Close()
	if l.Held() != 1 {
		t.Fatalf("held %d after one release (twice) and its close, want 1", l.Held())
	}
	cs[1].Close()
	cs[1].Close()
	if l.Held() != 0 || len(l.byHost) != 0 {
		t.Fatalf("held %d, hosts %v after closing all, want none", l.Held(), l.byHost)
	}
}

// With a lifetime, no deadline reaches past it: an idle connection is
// cut off however far its owner pushes its deadline.
func TestLifetime(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewListener(ln, Config{MaxConns: 4, MaxPerHost: 4, Lifetime: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	errc := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Hour))
		_ = c.SetReadDeadline(time.Time{})
		_, err = io.ReadAll(c)
		errc <- err
	}()
	limittest.DialFrom(t, "127.0.0.1", ln.Addr().String(), 1)
	select {
	case err := <-errc:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("read ended with %v, want a timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a read past the lifetime did not end")
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{{MaxConns: -1}, {MaxConns: 2, MaxPerHost: 3}, {Lifetime: -1}, {LogEvery: -time.Second},
		{MaxConns: 2, Reserve: 3}, {Reserve: -1}, {Bytes: -1}} {
		if _, err := New(c); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%+v): %v, want ErrConfig", c, err)
		}
	}
	if err := (HTTPConfig{IdleTimeout: -1}).Validate(); !errors.Is(err, ErrConfig) {
		t.Errorf("negative idle timeout: %v, want ErrConfig", err)
	}
}
