package peer

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Source is what a server serves: a block by catalog identity.
type Source interface {
	// Block returns block it.Block of the file it names, or a status
	// saying why not. It may block on the SSD or the PFS.
	Block(it Item) ([]byte, byte)
	// Cached returns the block only if the node's caches hold it
	// (StatusMissing otherwise); it never reads the PFS.
	Cached(it Item) ([]byte, byte)
}

// Server answers peers' requests. Close stops it and waits for its
// goroutines.
type Server struct {
	ln  net.Listener
	key []byte
	src Source
	log *slog.Logger

	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{} // mu guards conns and closed
	closed bool
}

// Listen starts a server on addr.
func Listen(addr string, key []byte, src Source, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("peer: listen on %s: %w", addr, err)
	}
	s := &Server{ln: ln, key: key, src: src, log: log, conns: map[net.Conn]struct{}{}}
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
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	if err := serverHandshake(c, s.key); err != nil {
		s.log.Warn("peer: refused a connection", "remote", c.RemoteAddr(), "err", err)
		return
	}
	c.SetDeadline(time.Time{})
	r := bufio.NewReader(c)
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
			results := make([]Result, len(items))
			for i, it := range items {
				if cached {
					results[i].Data, results[i].Status = s.src.Cached(it)
				} else {
					results[i].Data, results[i].Status = s.src.Block(it)
				}
			}
			writeMu.Lock()
			defer writeMu.Unlock()
			if err := writeFrame(c, encodeResponse(id, results)); err != nil {
				c.Close()
			}
		}()
	}
}
