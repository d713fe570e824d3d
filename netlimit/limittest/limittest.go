// Package limittest holds test helpers for servers bounded by package
// netlimit.
package limittest

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// IdleKeepAlives opens n keep-alive connections to addr, each of which
// sends one GET and reads its answer, then idles. It returns those that
// were answered, and how many the server closed instead.
func IdleKeepAlives(t testing.TB, addr string, n int) (answered []net.Conn, refused int) {
	t.Helper()
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
			refused++
			continue
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			refused++
			continue
		}
		resp.Body.Close()
		answered = append(answered, c)
	}
	return answered, refused
}

// WaitClosed waits until the server has closed every conn (a read gets
// EOF, after whatever it sent last), failing after a deadline.
func WaitClosed(t testing.TB, conns []net.Conn) {
	t.Helper()
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("connection %d of %d: read %v, want EOF (closed by the server)", i+1, len(conns), err)
		}
	}
}

// WaitFor polls cond until it holds, failing after a deadline.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// DialFrom opens n connections to addr from the loopback address src.
func DialFrom(t testing.TB, src, addr string, n int) []net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	var out []net.Conn
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial from %s: %v", src, err)
		}
		t.Cleanup(func() { c.Close() })
		out = append(out, c)
	}
	return out
}

// ClosedByServer counts the connections the server closed: a read gets
// EOF or a reset. Those it holds time out after a short wait, which
// only makes the count smaller: a bug shows as a count too small or too
// large, never as a pass.
func ClosedByServer(conns []net.Conn) int {
	n := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		var b [1]byte
		_, err := c.Read(b[:])
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			n++
		}
	}
	return n
}
