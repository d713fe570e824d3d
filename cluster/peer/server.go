package peer

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/dlfs/dlfs/netlimit"
	"github.com/dlfs/dlfs/ratelog"
)

// Source is what a server serves: a block by catalog identity.
type Source interface {
	// Block returns block it.Block of the file it names, with its
	// integrity sum under it.Tag, or a status saying why not. It may
	// block on the SSD or the PFS.
	Block(it Item) ([]byte, uint32, byte)
	// Cached returns the block only if the node's caches hold it
	// (StatusMissing otherwise); it never reads the PFS.
	Cached(it Item) ([]byte, uint32, byte)
}

// Server answers peers' requests. Close stops it and waits for its
// goroutines.
//
// # Binding and serving
//
// Bind listens without answering, and Serve starts answering from a
// Source: a node binds first, so that it can advertise the port (one the
// kernel picked, for port 0) while it builds the tiers it serves from,
// and serves once they exist. A peer that connects in between waits in
// the listen backlog (the kernel completes its TCP handshake; its TLS
// handshake waits for Serve), within its own deadlines. Listen does both
// at once.
type Server struct {
	ln  *netlimit.Listener // admits strangers within limits.strangers
	tls *tls.Config
	log *slog.Logger
	lim limits // read-only after bind
	// src is set by Serve, before the goroutines that read it start.
	src Source

	handshaking chan struct{} // a slot per connection in its handshake
	stop        chan struct{} // closed by Close
	// Refusals are logged at a bounded rate, one Every per reason.
	slowLog, authLog ratelog.Every

	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   map[net.Conn]struct{} // mu guards conns, closed and serving
	closed  bool
	serving bool // Serve was called
}

// limits are a server's bounds on connections that have not proved the
// key yet; see the package doc.
type limits struct {
	handshakes int             // handshakes at once
	strangers  netlimit.Config // connections waiting for a handshake slot or in a handshake: in all, and from one address
	hello      time.Duration   // for a connection's first byte, once it has a slot
}

func defaultLimits(log *slog.Logger) limits {
	return limits{handshakes: MaxHandshakes, hello: helloTimeout, strangers: netlimit.Config{Name: "peer",
		MaxConns: MaxHandshakes + MaxQueued, MaxPerHost: MaxPerAddress, LogEvery: logEvery, Logger: log}}
}

// Listen starts a server on addr, serving src: Bind, then Serve.
func Listen(addr string, key []byte, src Source, log *slog.Logger) (*Server, error) {
	s, err := Bind(addr, key, log)
	if err != nil {
		return nil, err
	}
	s.Serve(src)
	return s, nil
}

// Bind listens on addr, answering no one until Serve (see Binding and
// serving). Close closes it, served or not.
func Bind(addr string, key []byte, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return bind(addr, key, log, defaultLimits(log))
}

// listen is Listen under lim.
func listen(addr string, key []byte, src Source, log *slog.Logger, lim limits) (*Server, error) {
	s, err := bind(addr, key, log, lim)
	if err != nil {
		return nil, err
	}
	s.Serve(src)
	return s, nil
}

func bind(addr string, key []byte, log *slog.Logger, lim limits) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg, err := tlsConfig(key)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("peer: listen on %s: %w", addr, err)
	}
	ln, err := netlimit.NewListener(l, lim.strangers)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("peer: listen on %s: %w", addr, err)
	}
	every := lim.strangers.LogEvery
	return &Server{ln: ln, tls: cfg, log: log, lim: lim, conns: map[net.Conn]struct{}{},
		handshaking: make(chan struct{}, lim.handshakes), stop: make(chan struct{}),
		slowLog: ratelog.Every{Interval: every}, authLog: ratelog.Every{Interval: every}}, nil
}

// Serve starts answering peers from src, the connections waiting in the
// backlog first. It does not block. It takes effect once: a second call,
// or one after Close, does nothing.
func (s *Server) Serve(src Source) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.serving {
		return
	}
	s.serving, s.src = true, src
	s.wg.Add(1)
	go s.accept()
}

// Addr returns the listening address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops accepting, closes every connection (those waiting in the
// backlog too) and waits.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

// accept serves the connections the listener admits; it closes the
// others itself (too many strangers at once, or from one address: the
// cluster's own nodes redial).
func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Warn("peer: accept failed", "err", err)
			}
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c.(*netlimit.Conn))
	}
}

// serve runs one connection: the handshake, then requests, each answered
// in its own goroutine (at most 128 at once) so a slow PFS read does not
// hold up the blocks behind it.
func (s *Server) serve(c *netlimit.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	// Wait for a handshake slot, no longer than a handshake may take;
	// nothing is read from the connection meanwhile.
	t := time.NewTimer(handshakeTimeout)
	select {
	case s.handshaking <- struct{}{}:
		t.Stop()
	case <-t.C:
		s.slowLog.Warn(s.log, "peer: refused connections: no handshake slot came free in time", "remote", c.RemoteAddr().String())
		return
	case <-s.stop:
		t.Stop()
		return
	}
	tc, err := s.handshake(c)
	<-s.handshaking
	if err != nil {
		s.authLog.Warn(s.log, "peer: refused connections (is the cluster key the same on both nodes?)", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	// It proved the key: it no longer counts against the strangers'
	// bounds.
	c.Release()
	r := bufio.NewReader(tc)
	var (
		writeMu sync.Mutex
		reqs    sync.WaitGroup
		sem     = make(chan struct{}, 128)
	)
	defer reqs.Wait()
	for {
		frame, err := readFrame(r)
		if err != nil {
			return // closed, or garbage: drop the connection
		}
		id, items, cached, err := decodeRequest(frame)
		if err != nil {
			s.log.Warn("peer: malformed request; closing", "remote", c.RemoteAddr(), "err", err)
			return
		}
		sem <- struct{}{}
		reqs.Add(1)
		go func() {
			defer reqs.Done()
			defer func() { <-sem }()
			results := s.answer(items, cached)
			writeMu.Lock()
			defer writeMu.Unlock()
			if err := writeFrame(tc, encodeResponse(id, results)); err != nil {
				c.Close()
			}
		}()
	}
}

// handshake runs the TLS handshake on c. A peer sends its hello as soon
// as it connects, so the hello is already waiting when c gets its slot:
// a connection silent for lim.hello gives the slot back then, not after
// the whole handshakeTimeout.
func (s *Server) handshake(c net.Conn) (*tls.Conn, error) {
	var first [1]byte
	_ = c.SetReadDeadline(time.Now().Add(s.lim.hello))
	if _, err := io.ReadFull(c, first[:]); err != nil {
		return nil, fmt.Errorf("no hello within %v: %w", s.lim.hello, err)
	}
	_ = c.SetReadDeadline(time.Time{})
	tc := tls.Server(&replayConn{Conn: c, first: first[:]}, s.tls)
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, err
	}
	return tc, nil
}

// replayConn reads first before the rest of the connection.
type replayConn struct {
	net.Conn
	first []byte
}

func (c *replayConn) Read(b []byte) (int, error) {
	if len(c.first) > 0 {
		n := copy(b, c.first)
		c.first = c.first[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

// answer serves one request's items, at most MaxResponseBytes of blocks;
// the rest, and an item whose serving panicked, get StatusError.
func (s *Server) answer(items []Item, cached bool) []Result {
	results := make([]Result, len(items))
	var bytes int
	for i, it := range items {
		if bytes >= MaxResponseBytes {
			results[i].Status = StatusError
			continue
		}
		results[i] = s.serveItem(it, cached)
		if bytes += len(results[i].Data); bytes > MaxResponseBytes {
			results[i] = Result{Status: StatusError}
		}
	}
	return results
}

func (s *Server) serveItem(it Item, cached bool) (r Result) {
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("peer: serving a block panicked; failing the item", "path", it.Path, "block", it.Block, "panic", v)
			r = Result{Status: StatusError}
		}
	}()
	if cached {
		r.Data, r.Sum, r.Status = s.src.Cached(it)
	} else {
		r.Data, r.Sum, r.Status = s.src.Block(it)
	}
	return r
}
