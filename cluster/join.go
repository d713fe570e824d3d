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
// node's own address out, and tries the addresses in a random order
// until joinEnough of them have answered (a push-pull with each tells
// this node the whole cluster).
//
// A member that answers but will not gossip (another cluster key) fails
// Start: that is a configuration to fix. When no member answers (the
// first pod of a DaemonSet, or a seed still starting), the node serves
// alone and keeps trying, from joinRetryMin to joinRetryMax apart, until
// one does. From then on it joins one member again every joinRetryMax,
// which heals partitions (keepJoining).

const (
	joinEnough    = 3
	joinRetryMin  = time.Second
	joinRetryMax  = 30 * time.Second
	resolveBudget = 5 * time.Second
	probeTimeout  = 2 * time.Second
)

// errRefused is a member that answered and refused to gossip.
var errRefused = errors.New("a member answered but refused to gossip")

// join joins up to enough of the members named in Config.Join. It
// returns how many answered; an error wrapping errRefused if none did and
// one refused.
func (c *Cluster) join(enough int) (int, error) {
	addrs := c.resolveJoin()
	rand.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
	joined := 0
	var refused error
	for _, a := range addrs {
		if joined >= enough {
			break
		}
		select {
		case <-c.stop:
			return joined, nil
		default:
		}
		if n, err := c.ml.Join([]string{a}); err == nil && n > 0 {
			joined++
			continue
		} else if refused == nil && answers(a) {
			refused = fmt.Errorf("%w: %s: %v", errRefused, a, err)
		}
	}
	if joined == 0 && refused != nil {
		return 0, refused
	}
	return joined, nil
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

// answers reports whether something accepts TCP connections at addr.
func answers(addr string) bool {
	conn, err := net.DialTimeout("tcp", addr, probeTimeout)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// keepJoining joins again, until Close. Until a member has answered it
// retries from joinRetryMin apart, backing off to joinRetryMax. Once one
// has, it joins again three times soon after (a node back from a crash
// under its old name at a new address is refused until the others have
// held its old self dead for reclaim), then every joinRetryMax: a
// push-pull that heals a partition which outlasted memberlist's gossip to
// the dead (30 s on a LAN), after which neither side would hear of the
// other again. It is owned by the Cluster.
func (c *Cluster) keepJoining(joined bool, reclaim time.Duration) {
	defer c.wg.Done()
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
