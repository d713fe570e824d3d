package netlimit

import (
	"errors"
	"net"
	"testing"

	"github.com/dlfs/dlfs/netlimit/limittest"
)

// Strangers hold at most MaxConns-Reserve slots: however many idle
// connections they open, a known host still gets its reserved ones.
func TestReserveForKnownHosts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewListener(ln, Config{MaxConns: 6, MaxPerHost: 4, Reserve: 2,
		Known: func(host string) bool { return host == "127.0.0.9" }})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, l)
	addr := ln.Addr().String()
	limittest.DialFrom(t, "127.0.0.2", addr, 4)
	limittest.DialFrom(t, "127.0.0.3", addr, 4)
	limittest.WaitFor(t, "the strangers' connections to be decided", func() bool { return l.Held()+int(l.Refused()) == 8 })
	if held := l.Held(); held != 4 {
		t.Fatalf("strangers hold %d slots, want MaxConns-Reserve = 4", held)
	}
	known := limittest.DialFrom(t, "127.0.0.9", addr, 3)
	limittest.WaitFor(t, "the known host's connections to be decided", func() bool { return l.Held()+int(l.Refused()) == 11 })
	if got := l.HeldBy("127.0.0.9"); got != 2 {
		t.Fatalf("the known host holds %d slots, want the 2 reserved", got)
	}
	if closed := limittest.ClosedByServer(known); closed != 1 {
		t.Fatalf("the server closed %d of the known host's 3, want 1 (no slot left)", closed)
	}
}

// With Evict, idle strangers cannot keep a newcomer out: it closes the
// oldest stranger's connection and takes its slot. Known hosts' are
// never closed for it, and one address is still held to MaxPerHost.
func TestEvictOldestStranger(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewListener(ln, Config{MaxConns: 3, MaxPerHost: 2, Evict: true,
		Known: func(host string) bool { return host == "127.0.0.9" }})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, l)
	addr := ln.Addr().String()
	known := limittest.DialFrom(t, "127.0.0.9", addr, 1)
	limittest.WaitFor(t, "the known host's connection", func() bool { return l.Held() == 1 })
	var first []net.Conn
	for i := range 3 {
		first = append(first, limittest.DialFrom(t, "127.0.0.2", addr, 1)...)
		if i == 2 {
			break
		}
		limittest.WaitFor(t, "a stranger's connection", func() bool { return l.Held() == 2+i })
	}
	// The third from 127.0.0.2 is past MaxPerHost: refused, nothing closed for it.
	limittest.WaitFor(t, "the third from one address to be refused", func() bool { return l.Refused() == 1 })
	second := limittest.DialFrom(t, "127.0.0.3", addr, 1)
	limittest.WaitFor(t, "the newcomer to take a slot", func() bool { return l.HeldBy("127.0.0.3") == 1 })
	if l.Evicted() != 1 || l.Held() != 3 || l.HeldBy("127.0.0.2") != 1 || l.HeldBy("127.0.0.9") != 1 {
		t.Fatalf("evicted %d, held %d (%d from 127.0.0.2, %d known); want 1 evicted, 3 held, 1, 1",
			l.Evicted(), l.Held(), l.HeldBy("127.0.0.2"), l.HeldBy("127.0.0.9"))
	}
	if closed := limittest.ClosedByServer(first); closed != 2 {
		t.Fatalf("the server closed %d of 127.0.0.2's 3, want 2 (the oldest, and the one past MaxPerHost)", closed)
	}
	limittest.WaitClosed(t, first[:1])
	if closed := limittest.ClosedByServer(append(known, second...)); closed != 0 {
		t.Fatalf("the server closed %d of the known host's and the newcomer's connections", closed)
	}
}

// Charges count against one budget for strangers and one for known
// hosts; past it a charge fails; Close and Release give the bytes back.
func TestCharge(t *testing.T) {
	knownNext := false
	l, err := New(Config{MaxConns: 8, MaxPerHost: 8, Bytes: 100, Known: func(string) bool { return knownNext }})
	if err != nil {
		t.Fatal(err)
	}
	admit := func(known bool) *Conn {
		knownNext = known
		c1, c2 := net.Pipe()
		t.Cleanup(func() { c1.Close(); c2.Close() })
		c, ok := l.Admit(c1)
		if !ok {
			t.Fatal("refused")
		}
		return c
	}
	a, b, k := admit(false), admit(false), admit(true)
	if err := a.Charge(60); err != nil {
		t.Fatal(err)
	}
	if err := b.Charge(50); !errors.Is(err, ErrBudget) {
		t.Fatalf("a charge past the strangers' budget: %v, want ErrBudget", err)
	}
	if err := k.Charge(100); err != nil {
		t.Fatalf("a known host's charge within its own budget: %v", err)
	}
	if s, kn := l.Charged(); s != 60 || kn != 100 || l.Overruns() != 1 {
		t.Fatalf("charged %d and %d, %d overruns; want 60, 100, 1", s, kn, l.Overruns())
	}
	a.Close()
	if err := b.Charge(50); err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
	b.Release()
	k.Release()
	if err := b.Charge(1 << 20); err != nil {
		t.Fatalf("a released connection is charged nothing: %v", err)
	}
	if s, kn := l.Charged(); s != 0 || kn != 0 {
		t.Fatalf("charged %d and %d after every connection was closed or released", s, kn)
	}
}
