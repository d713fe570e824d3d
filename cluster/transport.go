package cluster

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/dlfs/dlfs/netlimit"
)

// DefaultStreams returns the bounds on inbound gossip streams for a
// memberlist whose stream timeout is tcpTimeout.
func DefaultStreams(tcpTimeout time.Duration) netlimit.Config {
	c := netlimit.DefaultConfig("cluster: gossip")
	c.MaxConns = 128                            // a push-pull or a ping each; members open a few at once
	c.MaxPerHost = 16                           // one address takes an eighth
	c.Lifetime = min(5*time.Second, tcpTimeout) // a push-pull of a large cluster takes well under a second
	return c
}

// transport is memberlist's NetTransport with its inbound TCP streams
// bounded by a netlimit.Limiter: memberlist itself accepts any number of
// them, from anyone, and holds each for its TCP timeout before it knows
// whether the other end has the key. Packets (UDP) are the
// NetTransport's own.
type transport struct {
	*memberlist.NetTransport
	lim     *netlimit.Limiter // read-only after newTransport
	streams chan net.Conn     // admitted streams, for memberlist
	stop    chan struct{}     // closed by Shutdown: streams still arriving are closed
	drained chan struct{}     // closed once the NetTransport has shut down
	done    chan struct{}     // closed when run ends
	once    sync.Once
	err     error // the NetTransport's Shutdown error (once)
}

var _ memberlist.NodeAwareTransport = (*transport)(nil)

// newTransport binds memberlist's transport on mc's address and port, as
// memberlist.Create would (with retries for port 0), and sets mc's port
// to the one bound. It owns a goroutine until Shutdown.
func newTransport(mc *memberlist.Config, limits netlimit.Config) (*transport, error) {
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
	t := &transport{NetTransport: nt, lim: lim, streams: make(chan net.Conn),
		stop: make(chan struct{}), drained: make(chan struct{}), done: make(chan struct{})}
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
			select {
			case t.streams <- w:
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
		close(t.stop)
		t.err = t.NetTransport.Shutdown()
		close(t.drained)
		<-t.done
	})
	return t.err
}
