package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"time"
)

// Joining.
//
// Each entry of Config.Join is HOST:PORT, and HOST may be a DNS name with
// several addresses, such as a Kubernetes headless Service over the
// DaemonSet's pods. Every join resolves the names again, leaves this
// node's own address out, and tries the addresses in a random order,
// twice as many at once as it needs and at most joinFanout, until
// joinEnough of them have answered (a push-pull with each tells this node
// the whole cluster). An address that does not answer (a dial refused or
// that times out, or a stream closed with no reply, as a member with
// every slot taken closes it) holds up no other.
//
// The first round runs in the background from Start, which waits for it
// at most joinWait: the mount comes up then whatever the addresses do.
// A member that answers but will not gossip (another cluster key) within
// that wait fails Start: that is a configuration to fix; later, it is
// logged. When no member answers (the first pod of a DaemonSet, or a seed
// still starting), the node serves alone and keeps trying, from
// joinRetryMin to joinRetryMax apart, until one does. From then on it
// joins one member again every joinRetryMax, which heals partitions
// (keepJoining).

const (
	joinEnough    = 3
	joinFanout    = 8               // addresses tried at once
	joinWait      = 2 * time.Second // Start waits for the first round at most this long
	joinRetryMin  = time.Second
	joinRetryMax  = 30 * time.Second
	resolveBudget = 5 * time.Second
)

// errRefused is a member that answered and refused to gossip.
var errRefused = errors.New("a member answered but refused to gossip")

// joinOutcome is a round of joins: how many answered, and an error
// wrapping errRefused if none did and one refused.
type joinOutcome struct {
	n   int
	err error
}

// join joins up to enough of the members named in Config.Join, trying
// 2*enough addresses at once, at most joinFanout. It returns how many
// answered; an error wrapping errRefused if none did and one refused. It
// returns once every attempt it started has ended: each within
// memberlist's TCP timeout, at once after Close.
func (c *Cluster) join(enough int) (int, error) {
	addrs := c.resolveJoin()
	rand.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
	res := make(chan error, len(addrs))
	next, running, joined := 0, 0, 0
	var refused error
	stopped := false
	for {
		for !stopped && running < min(joinFanout, 2*enough) && next < len(addrs) && joined < enough {
			a := addrs[next]
			next++
			running++
			go func() { res <- c.joinOne(a) }()
		}
		if running == 0 {
			break
		}
		select {
		case err := <-res:
			running--
			switch {
			case err == nil:
				joined++
			case errors.Is(err, errRefused) && refused == nil:
				refused = err
			case err != nil:
				c.log.Debug("cluster: a --join address did not answer", "err", err)
			}
		case <-c.stop:
			stopped = true // the attempts running end at once: Close aborts the transport's dials
			for ; running > 0; running-- {
				<-res
			}
		}
	}
	if joined == 0 && refused != nil {
		return 0, refused
	}
	return joined, nil
}

// joinOne joins the member at addr: nil if it answered, an error wrapping
// errRefused if it replied and would not gossip, another if it never
// replied.
func (c *Cluster) joinOne(addr string) error {
	before := c.tr.replies(addr)
	n, err := c.ml.Join([]string{addr})
	switch {
	case err == nil && n > 0:
		return nil
	case c.tr.replies(addr) > before:
		return fmt.Errorf("%w: %s: %v", errRefused, addr, err)
	default:
		return fmt.Errorf("%s: no answer: %v", addr, err)
	}
}

// ResolveJoin returns the addresses a --join entry HOST:PORT names: HOST
// itself if it is an IP, else every address its name resolves to.
func ResolveJoin(ctx context.Context, entry string) ([]string, error) {
	host, port, err := net.SplitHostPort(entry)
	if err != nil {
		return nil, fmt.Errorf("%w: --join %q: want HOST:PORT", ErrConfig, entry)
	}
	ips := []string{host}
	if net.ParseIP(host) == nil {
		if ips, err = net.DefaultResolver.LookupHost(ctx, host); err != nil {
			return nil, err
		}
	}
	out := make([]string, len(ips))
	for i, ip := range ips {
		if p := net.ParseIP(ip); p != nil {
			ip = p.String() // as memberlist dials it: replies are counted by that address
		}
		out[i] = net.JoinHostPort(ip, port)
	}
	return out, nil
}

// resolveJoin returns the addresses of Config.Join, names resolved, this
// node's own address left out.
func (c *Cluster) resolveJoin() []string {
	ctx, cancel := context.WithTimeout(context.Background(), resolveBudget)
	defer cancel()
	seen := map[string]bool{c.addr: true}
	var out []string
	for _, entry := range c.cfg.Join {
		addrs, err := ResolveJoin(ctx, entry)
		if err != nil {
			c.log.Debug("cluster: a --join entry names no address yet", "entry", entry, "err", err)
			continue
		}
		for _, a := range addrs {
			if !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
	}
	return out
}

// keepJoining joins again, until Close. Until a member has answered it
// retries from joinRetryMin apart, backing off to joinRetryMax. Once one
// has, it joins again three times soon after (a node back from a crash
// under its old name at a new address is refused until the others have
// held its old self dead for reclaim), then every joinRetryMax: a
// push-pull that heals a partition which outlasted memberlist's gossip to
// the dead (30 s on a LAN), after which neither side would hear of the
// other again. It is owned by the Cluster.
func (c *Cluster) keepJoining(first chan<- joinOutcome, reclaim time.Duration) {
	defer c.wg.Done()
	n, err := c.join(joinEnough)
	first <- joinOutcome{n, err} // buffered: Start may have stopped waiting
	joined := n > 0
	if joined {
		c.log.Info("cluster: joined", "answered", n, "members", len(c.Alive()))
	}
	var lastErr string
	soon := 0 // the rejoins after the first answer
	wait := joinRetryMin
	for {
		if joined {
			if soon < 3 {
				soon++
				wait = time.Duration(soon)*reclaim + 500*time.Millisecond
			} else {
				wait = joinRetryMax
			}
		}
		select {
		case <-c.stop:
			return
		case <-time.After(wait):
		}
		enough := joinEnough
		if joined && soon >= 3 {
			enough = 1 // a partition heals with one; memberlist push-pulls every 30 s too
		}
		n, err := c.join(enough)
		switch {
		case n > 0 && !joined:
			joined = true
			c.log.Info("cluster: joined", "answered", n, "members", len(c.Alive()))
		case n == 0 && !joined:
			wait = min(2*wait, joinRetryMax)
			if err != nil && err.Error() != lastErr {
				c.log.Warn("cluster: still serving alone: "+err.Error()+" (is the cluster key the same on every node?)", "join", c.cfg.Join)
				lastErr = err.Error()
			}
		case err != nil:
			c.log.Debug("cluster: rejoin failed", "err", err)
		}
	}
}
