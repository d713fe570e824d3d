// Package limittest holds test helpers for servers bounded by package
// netlimit.
package limittest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// IdleKeepAlives opens n keep-alive connections to addr, each of which
// sends one GET and reads its answer, then idles. It returns those that
// were answered, and how many the server closed instead.
func IdleKeepAlives(t *testing.T, addr string, n int) (answered []net.Conn, refused int) {
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
// EOF), failing after a deadline.
func WaitClosed(t *testing.T, conns []net.Conn) {
	t.Helper()
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("idle connection %d of %d: read %v, want EOF (closed by the server)", i+1, len(conns), err)
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
