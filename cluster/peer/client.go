package peer

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Client fetches blocks from peers over one pipelined connection per peer.
// Safe for concurrent use; Close closes every connection.
type Client struct {
	tls         *tls.Config
	dialTimeout time.Duration

	mu      sync.Mutex
	conns   map[string]*conn         // mu guards conns, dialing, reach and closed
	dialing map[string]chan struct{} // closed when the dial to an address ends
	reach   map[string]Reach         // the last dial to each address, at most maxReach
	closed  bool
}

// Reach is how the last dial to a peer's address went.
type Reach struct {
	OK  bool      // it answered and proved the key
	Err string    // why not
	At  time.Time // when
}

// maxReach bounds the addresses whose last dial a client remembers.
const maxReach = 4096

// NewClient returns a client that proves itself with key, and accepts
// only servers that prove the same.
func NewClient(key []byte) (*Client, error) {
	cfg, err := tlsConfig(key)
	if err != nil {
		return nil, err
	}
	return &Client{tls: cfg, dialTimeout: 2 * time.Second, conns: map[string]*conn{}, dialing: map[string]chan struct{}{},
		reach: map[string]Reach{}}, nil
}

// ErrClosed is returned after Close.
var ErrClosed = errors.New("peer: client closed")

type conn struct {
	c       *tls.Conn
	writeMu sync.Mutex

	mu      sync.Mutex
	nextID  uint32
	pending map[uint32]chan response // mu guards nextID, pending and err
	err     error
	done    chan struct{} // closed when the reader goroutine ends

	lastAnswer atomic.Int64 // unix nanoseconds of the last response
	onEnd      func()       // run by read as it ends; set before it starts
}

type response struct {
	results []Result
	err     error
}

// Fetch asks the peer at addr for items and waits for the answer or ctx.
func (cl *Client) Fetch(ctx context.Context, addr string, items []Item) ([]Result, error) {
	return cl.fetch(ctx, addr, items, false)
}

// FetchCached asks the peer at addr for items it holds in its caches: it
// answers StatusMissing for the rest, and never reads the PFS for them.
func (cl *Client) FetchCached(ctx context.Context, addr string, items []Item) ([]Result, error) {
	return cl.fetch(ctx, addr, items, true)
}

func (cl *Client) fetch(ctx context.Context, addr string, items []Item, cached bool) ([]Result, error) {
	if len(items) == 0 || len(items) > MaxItems {
		return nil, fmt.Errorf("peer: %d items in one request (1 to %d)", len(items), MaxItems)
	}
	cn, err := cl.get(ctx, addr)
	if err != nil {
		return nil, err
	}
	ch := make(chan response, 1)
	cn.mu.Lock()
	if cn.err != nil {
		err := cn.err
		cn.mu.Unlock()
		return nil, err
	}
	cn.nextID++
	id := cn.nextID
	cn.pending[id] = ch
	cn.mu.Unlock()
	sent := time.Now()
	cn.writeMu.Lock()
	if d, ok := ctx.Deadline(); ok {
		cn.c.SetWriteDeadline(d) // a peer that stops reading must not block the writer for ever
	}
	err = writeFrame(cn.c, encodeRequest(id, items, cached))
	cn.c.SetWriteDeadline(time.Time{})
	cn.writeMu.Unlock()
	if err != nil {
		cn.fail(fmt.Errorf("peer: send to %s: %w", addr, err))
	}
	select {
	case r := <-ch:
		if r.err == nil && len(r.results) != len(items) {
			return nil, fmt.Errorf("%w: %d results for %d items", ErrWire, len(r.results), len(items))
		}
		return r.results, r.err
	case <-ctx.Done():
		cn.mu.Lock()
		delete(cn.pending, id)
		cn.mu.Unlock()
		// A peer that answered nothing since this request went out is
		// taken as stuck: the connection is dropped, and the next request
		// dials again. One that answers others is only busy.
		if cn.lastAnswer.Load() < sent.UnixNano() {
			cn.fail(fmt.Errorf("peer: %s answered nothing in time: %w", addr, ctx.Err()))
		}
		return nil, ctx.Err()
	}
}

// get returns a live connection to addr, dialling and authenticating a new
// one if needed. One dial to an address runs at a time: the requests that
// find none wait for it (a burst of them dialling at once filled the
// peer's handshake slots, and the ones refused went to the PFS).
func (cl *Client) get(ctx context.Context, addr string) (*conn, error) {
	for {
		cl.mu.Lock()
		if cl.closed {
			cl.mu.Unlock()
			return nil, ErrClosed
		}
		if cn := cl.conns[addr]; cn != nil && cn.alive() {
			cl.mu.Unlock()
			return cn, nil
		}
		if wait, ok := cl.dialing[addr]; ok {
			cl.mu.Unlock()
			select {
			case <-wait:
				continue // look again: it may have failed
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		done := make(chan struct{})
		cl.dialing[addr] = done
		cl.mu.Unlock()
		cn, err := cl.dial(ctx, addr)
		cl.mu.Lock()
		delete(cl.dialing, addr)
		close(done)
		cl.noteReach(addr, err)
		if err == nil {
			if cl.closed {
				cn.c.Close()
				err = ErrClosed
			} else {
				cn.onEnd = func() { cl.drop(addr, cn) }
				go cn.read()
				cl.conns[addr] = cn
			}
		}
		cl.mu.Unlock()
		if err != nil {
			return nil, err
		}
		return cn, nil
	}
}

// noteReach records how a dial to addr went; a dial its caller gave up
// on says nothing of the peer. Called with cl.mu held.
func (cl *Client) noteReach(addr string, err error) {
	if errors.Is(err, context.Canceled) || errors.Is(err, ErrClosed) {
		return
	}
	if _, ok := cl.reach[addr]; !ok && len(cl.reach) >= maxReach {
		for a := range cl.reach { // forget one: a bound, not a policy
			delete(cl.reach, a)
			break
		}
	}
	r := Reach{OK: err == nil, At: time.Now()}
	if err != nil {
		r.Err = err.Error()
	}
	cl.reach[addr] = r
}

// Reachability returns how the last dial to addr went, if there was one.
func (cl *Client) Reachability(addr string) (Reach, bool) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	r, ok := cl.reach[addr]
	return r, ok
}

// Connect makes sure there is a live, authenticated connection to addr,
// dialling one if needed: a probe of the peer's data port.
func (cl *Client) Connect(ctx context.Context, addr string) error {
	_, err := cl.get(ctx, addr)
	return err
}

// dial connects to addr and runs the handshake, without the client's lock:
// a peer that hangs must not hold up requests to the others.
func (cl *Client) dial(ctx context.Context, addr string) (*conn, error) {
	d := net.Dialer{Timeout: cl.dialTimeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("peer: dial %s: %w", addr, err)
	}
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	tc := tls.Client(c, cl.tls)
	err = tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		c.Close()
		var alert tls.AlertError
		if errors.Is(err, ErrAuth) || errors.As(err, &alert) {
			return nil, fmt.Errorf("peer: %s: %w: %v", addr, ErrAuth, err)
		}
		return nil, fmt.Errorf("peer: %s: handshake: %w", addr, err)
	}
	return &conn{c: tc, pending: map[uint32]chan response{}, done: make(chan struct{})}, nil
}

// alive reports whether the connection has not failed.
func (cn *conn) alive() bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.err == nil
}

// read delivers responses until the connection fails; it owns no state
// beyond the connection and its entry in the client's table, which it
// drops (onEnd) as it ends.
func (cn *conn) read() {
	defer close(cn.done)
	if cn.onEnd != nil {
		defer cn.onEnd()
	}
	r := bufio.NewReader(cn.c)
	for {
		frame, err := readFrame(r)
		if err != nil {
			cn.fail(fmt.Errorf("peer: %s: %w", cn.c.RemoteAddr(), err))
			return
		}
		id, results, err := decodeResponse(frame)
		if err != nil {
			cn.fail(err)
			return
		}
		cn.lastAnswer.Store(time.Now().UnixNano())
		cn.mu.Lock()
		ch := cn.pending[id]
		delete(cn.pending, id)
		cn.mu.Unlock()
		if ch != nil {
			ch <- response{results: results}
		}
	}
}

// fail closes the connection and fails every pending request.
func (cn *conn) fail(err error) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.err != nil {
		return
	}
	cn.err = err
	cn.c.Close()
	for id, ch := range cn.pending {
		ch <- response{err: err}
		delete(cn.pending, id)
	}
}

// drop forgets cn, the connection to addr, once it has failed: a peer
// that died or left leaves nothing in the table.
func (cl *Client) drop(addr string, cn *conn) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.conns[addr] == cn {
		delete(cl.conns, addr)
	}
}

// Close closes every connection and waits for their readers.
func (cl *Client) Close() {
	cl.mu.Lock()
	cl.closed = true
	conns := cl.conns
	cl.conns = map[string]*conn{}
	cl.mu.Unlock()
	for _, cn := range conns {
		cn.fail(ErrClosed)
		<-cn.done
	}
}
