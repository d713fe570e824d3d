package peer

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
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
type Server struct {
	ln  net.Listener
	tls *tls.Config
	src Source
	log *slog.Logger

	handshaking chan struct{} // a slot per connection in its handshake
	queued      atomic.Int64  // connections waiting for a slot
	maxQueued   int64         // read-only after listen
	refused     atomic.Int64  // connections closed for want of a place in the queue
	stop        chan struct{} // closed by Close

	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{} // mu guards conns and closed
	closed bool
}

// Listen starts a server on addr.
func Listen(addr string, key []byte, src Source, log *slog.Logger) (*Server, error) {
	return listen(addr, key, src, log, MaxHandshakes, MaxQueued)
}

func listen(addr string, key []byte, src Source, log *slog.Logger, handshakes, queued int) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg, err := tlsConfig(key)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("peer: listen on %s: %w", addr, err)
	}
	s := &Server{ln: ln, tls: cfg, src: src, log: log, conns: map[net.Conn]struct{}{},
		handshaking: make(chan struct{}, handshakes), maxQueued: int64(queued), stop: make(chan struct{})}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr returns the listening address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops accepting, closes every connection and waits.
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
		if s.queued.Add(1) > s.maxQueued {
			s.queued.Add(-1)
			s.mu.Unlock()
			// Too many strangers at once: the cluster's own nodes redial.
			if s.refused.Add(1)%1000 == 1 {
				s.log.Warn("peer: too many unauthenticated connections; refusing more", "limit", s.maxQueued, "remote", c.RemoteAddr())
			}
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

// serve runs one connection: the handshake, then requests, each answered
// in its own goroutine (at most 128 at once) so a slow PFS read does not
// hold up the blocks behind it.
func (s *Server) serve(c net.Conn) {
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
		s.queued.Add(-1)
	case <-t.C:
		s.queued.Add(-1)
		s.log.Warn("peer: refused a connection: no handshake slot came free in time", "remote", c.RemoteAddr())
		return
	case <-s.stop:
		s.queued.Add(-1)
		return
	}
	tc := tls.Server(c, s.tls)
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	<-s.handshaking
	if err != nil {
		s.log.Warn("peer: refused a connection (is the cluster key the same on both nodes?)", "remote", c.RemoteAddr(), "err", err)
		return
	}
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
