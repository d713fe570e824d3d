package cluster

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/netlimit"
	"github.com/dlfs/dlfs/netlimit/limittest"
)

// TestJoinPastIdleStrangers: strangers' idle streams that fill every
// slot they may hold keep neither a member nor a joiner out. The joiner
// (another address) takes the oldest stranger's slot; the members'
// address is known, and its streams take the slots kept for members.
func TestJoinPastIdleStrangers(t *testing.T) {
	key := bytes.Repeat([]byte{5}, 32)
	// memberlist's LAN timings: an idle stream is held for a minute here.
	a, err := Start(Config{NodeName: "node-a", Bind: "127.0.0.1:0", Key: key,
		Streams: netlimit.Config{MaxConns: 16, MaxPerHost: 4, Lifetime: time.Minute},
		Meta:    Meta{DataAddr: "127.0.0.1:1", Dataset: "ds"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b := start(t, "node-b", key, a.Addr())
	waitView(t, a, 2)
	if !a.hosts.has("127.0.0.1") || a.hosts.has("127.0.0.2") {
		t.Fatalf("known hosts %v: want the members' 127.0.0.1 only", a.hosts.n)
	}

	// Strangers take all they may, 16 - 4 kept for members, and try more.
	for _, src := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.6"} {
		limittest.DialFrom(t, src, a.Addr(), 4)
	}
	limittest.WaitFor(t, "the strangers' streams to be decided", func() bool {
		return a.tr.lim.Held()+int(a.tr.lim.Evicted()+a.tr.lim.Refused()) >= 16
	})
	evicted := a.tr.lim.Evicted()

	// A member's stream still gets a slot, without closing a stranger's.
	known := limittest.DialFrom(t, "127.0.0.1", a.Addr(), 1)
	limittest.WaitFor(t, "the member address's stream to be decided", func() bool {
		return a.tr.lim.HeldBy("127.0.0.1") >= 1 || a.tr.lim.Refused() > 0
	})
	if closed := limittest.ClosedByServer(known); closed != 0 || a.tr.lim.Evicted() != evicted {
		t.Fatalf("a stream from the members' address: closed %d, %d strangers' closed for it; want a reserved slot", closed, a.tr.lim.Evicted()-evicted)
	}
	known[0].Close()
	limittest.WaitFor(t, "the member address's slot to come free", func() bool { return a.tr.lim.HeldBy("127.0.0.1") == 0 })
	evicted = a.tr.lim.Evicted()

	// A joiner from another address.
	c, err := Start(Config{NodeName: "node-c", Bind: "127.0.0.5:0", Join: []string{a.Addr()}, Key: key, Local: true,
		Meta: Meta{DataAddr: "127.0.0.5:1", Dataset: "ds"}})
	if err != nil {
		t.Fatalf("a joiner past idle strangers: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	for _, n := range []*Cluster{a, b, c} {
		waitView(t, n, 3)
	}
	if a.tr.lim.Evicted() == evicted {
		t.Errorf("the joiner got in, but no stranger's stream was closed for it")
	}
}

// TestJoinClosedIsNotAnswered: a stream accepted and closed with no
// reply (a member with every slot taken) is no answer, not a refusal:
// the node starts, serves alone and keeps trying.
func TestJoinClosedIsNotAnswered(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	c, err := Start(Config{NodeName: "b", Bind: "127.0.0.1:0", Join: []string{ln.Addr().String()}, Key: bytes.Repeat([]byte{3}, 16), Local: true})
	if err != nil {
		t.Fatalf("a join address that closes every stream stopped the node: %v", err)
	}
	defer c.Close()
	if err := c.joinOne(ln.Addr().String()); err == nil || errors.Is(err, errRefused) {
		t.Fatalf("joining an address that closes every stream: %v, want no answer", err)
	}
}

// blackhole returns an address that accepts no connection and answers
// no SYN: a listening socket whose queue of one is full. A dial to it
// waits for its timeout.
func blackhole(t *testing.T) string {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := (&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: sa.(*syscall.SockaddrInet4).Port}).String()
	for range 2 { // the queue holds backlog+1; one more may be half open
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			t.Cleanup(func() { c.Close() })
		}
	}
	if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
		c.Close()
		t.Skip("this kernel completes connections past a full listen queue: no blackhole to dial")
	}
	return addr
}

// TestStartWithDeadJoin: Start returns while the dials to --join
// addresses that never answer are still pending (memberlist's LAN TCP
// timeout is 10 s, each), and Close ends them.
func TestStartWithDeadJoin(t *testing.T) {
	dead := []string{blackhole(t), blackhole(t), blackhole(t)}
	c, err := Start(Config{NodeName: "alone", Bind: "127.0.0.1:0", Join: dead, Key: bytes.Repeat([]byte{3}, 16),
		Meta: Meta{DataAddr: "127.0.0.1:1", Dataset: "ds"}})
	if err != nil {
		t.Fatal(err)
	}
	if n := c.tr.dialing.Load(); n != 3 {
		t.Errorf("Start returned with %d dials pending, want the 3 to dead addresses, at once", n)
	}
	if n := len(c.Alive()); n != 1 {
		t.Errorf("alone sees %d members", n)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n, aborted := c.tr.dialing.Load(), c.tr.dialsAborted.Load(); n != 0 || aborted != 3 {
		t.Errorf("Close returned with %d dials pending, %d ended by it; want 0 pending, the 3 ended", n, aborted)
	}
}

// TestStreamFrameBounded: a stream that declares a first frame past
// MaxFrame is closed before memberlist reads it, and the frames of
// streams that have not proved the key are held to Streams.Bytes
// together; closing them gives the budget back.
func TestStreamFrameBounded(t *testing.T) {
	key := bytes.Repeat([]byte{9}, 32)
	a, err := Start(Config{NodeName: "node-a", Bind: "127.0.0.1:0", Key: key,
		Streams: netlimit.Config{Lifetime: time.Minute, Bytes: 3 * MaxFrame},
		Meta:    Meta{DataAddr: "127.0.0.1:1", Dataset: "ds"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	frame := func(src string, n uint32) net.Conn {
		c := limittest.DialFrom(t, src, a.Addr(), 1)[0]
		hdr := []byte{encryptMsg, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(hdr[1:], n)
		if _, err := c.Write(hdr); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// memberlist's own limit is 20 MiB.
	huge := frame("127.0.0.2", 20<<20)
	limittest.WaitClosed(t, []net.Conn{huge})
	if s, _ := a.tr.lim.Charged(); s != 0 || a.tr.framesRefused.Load() != 1 {
		t.Fatalf("a 20 MiB frame: %d frames refused, %d bytes charged; want it refused for its length", a.tr.framesRefused.Load(), s)
	}
	// Labelled, the same.
	c := limittest.DialFrom(t, "127.0.0.2", a.Addr(), 1)[0]
	if _, err := c.Write([]byte{hasLabelMsg, 2, 'x', 'y', encryptMsg, 0xff, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	limittest.WaitClosed(t, []net.Conn{c})
	if n := a.tr.framesRefused.Load(); n != 2 {
		t.Fatalf("a labelled frame of 4 GiB: %d frames refused, want 2", n)
	}

	var held []net.Conn
	for _, src := range []string{"127.0.0.3", "127.0.0.4", "127.0.0.5"} {
		held = append(held, frame(src, MaxFrame))
	}
	limittest.WaitFor(t, "three frames charged", func() bool { s, _ := a.tr.lim.Charged(); return s == 3*MaxFrame })
	over := frame("127.0.0.6", 1)
	limittest.WaitClosed(t, []net.Conn{over})
	if closed := limittest.ClosedByServer(held); closed != 0 {
		t.Fatalf("%d of the streams within the budget were closed", closed)
	}
	if s, _ := a.tr.lim.Charged(); s != 3*MaxFrame || a.tr.lim.Overruns() != 1 {
		t.Fatalf("charged %d, %d overruns; want %d, 1", s, a.tr.lim.Overruns(), 3*MaxFrame)
	}
	for _, c := range held {
		c.Close()
	}
	limittest.WaitFor(t, "the budget to come back", func() bool { s, _ := a.tr.lim.Charged(); return s == 0 })

	// A member with the key still joins.
	b := start(t, "node-b", key, a.Addr())
	waitView(t, a, 2)
	waitView(t, b, 2)
}
