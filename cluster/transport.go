package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/dlfs/dlfs/netlimit"
	"github.com/dlfs/dlfs/ratelog"
)

// DefaultStreams returns the bounds on inbound gossip streams for a
// memberlist whose stream timeout is tcpTimeout.
func DefaultStreams(tcpTimeout time.Duration) netlimit.Config {
	c := netlimit.DefaultConfig("cluster: gossip")
	c.MaxConns = 128                            // a push-pull or a ping each; members open a few at once
	c.MaxPerHost = 16                           // one address takes an eighth
	c.Reserve = 32                              // for members' addresses: strangers hold at most 96
	c.Evict = true                              // a joiner closes the oldest stranger's stream rather than find none
	c.Bytes = 16 << 20                          // declared first frames: 4 at MaxFrame, thousands of a small cluster's
	c.Lifetime = min(5*time.Second, tcpTimeout) // a push-pull of a large cluster takes well under a second
	return c
}

// MaxFrame is the most a gossip stream's first frame may declare (its
// length, before memberlist has read it and checked the key). A push-pull
// carries every member, each with at most MaxMeta bytes of metadata and
// about 100 more: 4 MiB is over 6,000 members uncompressed. memberlist's
// own limit is 20 MiB, and it buffers that much before it checks the key.
const MaxFrame = 4 << 20

// transport is memberlist's NetTransport with its TCP streams bounded.
//
// Inbound, memberlist accepts any number of streams, from anyone, holds
// each for its TCP timeout before it knows whether the other end has the
// key, and buffers a first frame of up to 20 MiB to check it. Here a
// netlimit.Limiter admits them (slots kept for members' addresses, the
// oldest stranger's stream closed for a newcomer), and each one's first
// frame is read through firstFrame: a declared length past MaxFrame, or
// past what Streams.Bytes leaves, closes the stream before memberlist
// reads it.
//
// Outbound, it dials under a context that Close cancels, closes the
// streams still open then, counts the streams that got any reply from
// each address (join tells an answer from a stream closed unanswered),
// and caps the first frame of a reply at MaxFrame too. Packets (UDP) are
// the NetTransport's own.
type transport struct {
	*memberlist.NetTransport
	lim     *netlimit.Limiter // read-only after newTransport
	keyed   bool              // gossip is encrypted: every first frame declares its length
	streams chan net.Conn     // admitted streams, for memberlist
	stop    chan struct{}     // closed by Shutdown: streams still arriving are closed
	drained chan struct{}     // closed once the NetTransport has shut down
	done    chan struct{}     // closed when run ends
	once    sync.Once
	err     error // the NetTransport's Shutdown error (once)

	ctx    context.Context // dials; canceled by abort
	cancel context.CancelFunc
	log    *slog.Logger
	frames ratelog.Every // refused first frames, logged at most every 10 s

	dialing       atomic.Int64 // dials in flight
	framesRefused atomic.Int64 // streams closed for their first frame
	dialsAborted  atomic.Int64 // dials ended by abort
	// from is the bound IP when it is one address, not all: streams go
	// out from the address members know this node by, as packets do.
	from *net.TCPAddr

	mu      sync.Mutex
	out     map[*outConn]struct{} // mu guards out, replied and aborted: outbound streams open
	replied map[string]int64      // by address: outbound streams that got a reply
	aborted bool
}

var _ memberlist.NodeAwareTransport = (*transport)(nil)

// newTransport binds memberlist's transport on mc's address and port, as
// memberlist.Create would (with retries for port 0), and sets mc's port
// to the one bound. It owns a goroutine until Shutdown.
func newTransport(mc *memberlist.Config, limits netlimit.Config, log *slog.Logger) (*transport, error) {
	lim, err := netlimit.New(limits)
	if err != nil {
		return nil, fmt.Errorf("%w: gossip streams: %v", ErrConfig, err)
	}
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{mc.BindAddr}, BindPort: mc.BindPort, Logger: mc.Logger}
	tries := 1
	if mc.BindPort == 0 {
		tries = 10 // TCP and UDP on the same free port: another socket may take it between the two
	}
	var nt *memberlist.NetTransport
	for range tries {
		if nt, err = memberlist.NewNetTransport(nc); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	if mc.BindPort == 0 {
		mc.BindPort = nt.GetAutoBindPort()
		if mc.AdvertisePort == 0 {
			mc.AdvertisePort = mc.BindPort
		}
	}
	t := &transport{NetTransport: nt, lim: lim, keyed: len(mc.SecretKey) > 0, streams: make(chan net.Conn),
		stop: make(chan struct{}), drained: make(chan struct{}), done: make(chan struct{}),
		log: log, frames: ratelog.Every{Interval: limits.LogEvery},
		out: map[*outConn]struct{}{}, replied: map[string]int64{}}
	if ip := net.ParseIP(mc.BindAddr); ip != nil && !ip.IsUnspecified() {
		t.from = &net.TCPAddr{IP: ip}
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	go t.run()
	return t, nil
}

// run admits the NetTransport's streams and hands them to memberlist; it
// closes the rest. It never blocks the NetTransport for long: memberlist
// takes each stream at once (a goroutine each), and after Shutdown run
// closes them itself.
func (t *transport) run() {
	defer close(t.done)
	for {
		select {
		case c := <-t.NetTransport.StreamCh():
			select {
			case <-t.stop:
				c.Close()
				continue
			default:
			}
			w, ok := t.lim.Admit(c)
			if !ok {
				continue
			}
			f := &firstFrame{Conn: w, keyed: t.keyed, charge: w.Charge, refused: t.refusedFrame}
			select {
			case t.streams <- f:
			case <-t.stop:
				w.Close()
			}
		case <-t.drained:
			return
		}
	}
}

// StreamCh returns the admitted inbound streams.
func (t *transport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown stops the NetTransport and run. Safe to call twice.
func (t *transport) Shutdown() error {
	t.once.Do(func() {
		t.abort()
		close(t.stop)
		t.err = t.NetTransport.Shutdown()
		close(t.drained)
		<-t.done
	})
	return t.err
}

// DialAddressTimeout dials a member for memberlist, under the context
// abort cancels.
func (t *transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	t.dialing.Add(1)
	defer t.dialing.Add(-1)
	d := net.Dialer{Timeout: timeout, LocalAddr: t.from}
	c, err := d.DialContext(t.ctx, "tcp", a.Addr)
	if err != nil {
		if t.ctx.Err() != nil {
			t.dialsAborted.Add(1)
		}
		return nil, err
	}
	o := &outConn{firstFrame: firstFrame{Conn: c, keyed: t.keyed, refused: t.refusedFrame}, t: t, addr: a.Addr}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.aborted {
		c.Close()
		return nil, fmt.Errorf("cluster: dial %s: %w", a.Addr, net.ErrClosed)
	}
	t.out[o] = struct{}{}
	return o, nil
}

// DialTimeout dials addr for memberlist (see DialAddressTimeout).
func (t *transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// abort cancels the dials in flight and closes the outbound streams
// open: what waits on them ends now. Later dials fail. Safe to call twice.
func (t *transport) abort() {
	t.cancel()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.aborted = true
	for o := range t.out {
		o.Conn.Close()
	}
}

// replies returns how many outbound streams to addr got a reply.
func (t *transport) replies(addr string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.replied[addr]
}

// refusedFrame logs a first frame refused, at most every 10 s; the
// limiter logs those over its budget.
func (t *transport) refusedFrame(c net.Conn, err error) {
	t.framesRefused.Add(1)
	if errors.Is(err, netlimit.ErrBudget) {
		return
	}
	t.frames.Warn(t.log, "cluster: closing a gossip stream: "+err.Error(), "remote", c.RemoteAddr().String())
}

// outConn is an outbound stream: it counts its reply and leaves
// transport.out when closed.
type outConn struct {
	firstFrame
	t       *transport
	addr    string
	replied atomic.Bool
	closed  sync.Once
}

func (o *outConn) Read(b []byte) (int, error) {
	n, err := o.firstFrame.Read(b)
	if n > 0 && !o.replied.Swap(true) {
		o.t.mu.Lock()
		o.t.replied[o.addr]++
		o.t.mu.Unlock()
	}
	return n, err
}

func (o *outConn) Close() error {
	o.closed.Do(func() {
		o.t.mu.Lock()
		delete(o.t.out, o)
		o.t.mu.Unlock()
	})
	return o.Conn.Close()
}

// The first bytes of a memberlist stream (net.go): an optional label
// header (hasLabelMsg, a length byte, the label), then a message type;
// with a key, encryptMsg and the frame's length, 4 bytes big-endian.
const (
	hasLabelMsg = 244
	encryptMsg  = 10
)

// ErrFrame wraps a gossip stream's first frame refused: longer than
// MaxFrame, or than the byte budget of streams not yet proven leaves.
var ErrFrame = errors.New("cluster: gossip frame refused")

// firstFrame reads a stream's first frame header as memberlist reads
// it, and closes the stream before memberlist buffers a frame longer than
// MaxFrame, or one charge refuses. With a key, it charges the declared
// length; without one (--insecure), it charges every byte read, up to
// MaxFrame. It is read by one goroutine (memberlist's) at a time.
type firstFrame struct {
	net.Conn
	keyed   bool
	charge  func(int64) error     // nil: cap only (outbound)
	refused func(net.Conn, error) // told of a refusal
	state   int                   // frameType...frameDone
	skip    int                   // label bytes still to skip
	length  [4]byte               // declared length, as read
	got     int                   // of length
	read    int64                 // bytes read, without a key
	err     error                 // the refusal, once made
}

const (
	frameType = iota // the message type, or hasLabelMsg
	frameLabelLen
	frameLabel
	frameLength
	frameDone
)

func (f *firstFrame) Read(b []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	n, err := f.Conn.Read(b)
	if n > 0 {
		if ferr := f.check(b[:n]); ferr != nil {
			f.err = ferr
			f.Conn.Close() // the other end sees the stream closed, unanswered
			if f.refused != nil {
				f.refused(f, ferr)
			}
			return 0, ferr
		}
	}
	return n, err
}

// check follows the header through b and refuses a frame too long.
func (f *firstFrame) check(b []byte) error {
	if !f.keyed {
		if f.read += int64(len(b)); f.read > MaxFrame {
			return fmt.Errorf("%w: more than %d bytes (MaxFrame)", ErrFrame, MaxFrame)
		}
		if f.charge != nil {
			if err := f.charge(int64(len(b))); err != nil {
				return fmt.Errorf("%w: %w", ErrFrame, err)
			}
		}
		return nil
	}
	for _, c := range b {
		switch f.state {
		case frameType:
			switch c {
			case hasLabelMsg:
				f.state = frameLabelLen
			case encryptMsg:
				f.state = frameLength
			default:
				f.state = frameDone // memberlist refuses it unread
			}
		case frameLabelLen:
			f.skip, f.state = int(c), frameLabel
			if f.skip == 0 {
				f.state = frameDone // memberlist refuses it
			}
		case frameLabel:
			if f.skip--; f.skip == 0 {
				f.state = frameType
			}
		case frameLength:
			f.length[f.got] = c
			if f.got++; f.got < len(f.length) {
				continue
			}
			f.state = frameDone
			n := int64(binary.BigEndian.Uint32(f.length[:]))
			if n > MaxFrame {
				return fmt.Errorf("%w: it declares %d bytes, over the %d-byte limit (MaxFrame)", ErrFrame, n, MaxFrame)
			}
			if f.charge != nil {
				if err := f.charge(n); err != nil {
					return fmt.Errorf("%w: %w", ErrFrame, err)
				}
			}
		case frameDone:
			return nil
		}
	}
	return nil
}
