package cluster

import (
	"context"
	"fmt"
	"net"

	sockaddr "github.com/hashicorp/go-sockaddr"
)

// Addresses that work between hosts.
//
// A node tells the others two addresses: its gossip address and its data
// address (Meta.DataAddr). Either may be bound on every interface
// (0.0.0.0 or ::), which no other host can dial, so neither is ever
// advertised as such. The gossip address advertised is --advertise's,
// else --bind's, else, for an unspecified bind, a private address of this
// host (memberlist's choice). The data address takes that host when it is
// bound on every interface. An address that could not work, such as
// loopback while --join names another host, is refused at Start with a
// line that says what to set.

// Addresses returns what a member started with cfg would advertise: the
// IP of its gossip address and its data address (Meta.DataAddr, as bound).
// The error is the one Start would stop with.
func Addresses(cfg Config) (net.IP, string, error) {
	bindHost, _, err := splitHostPort(cfg.Bind, "bind")
	if err != nil {
		return nil, "", err
	}
	ip, err := advertised(cfg, bindHost)
	if err != nil {
		return nil, "", err
	}
	if err := checkReach(cfg, ip); err != nil {
		return nil, "", err
	}
	data, err := dataAdvertised(cfg.Meta.DataAddr, ip)
	if err != nil {
		return nil, "", err
	}
	return ip, data, nil
}

// advertised returns the IP this node's gossip is advertised on.
func advertised(cfg Config, bindHost string) (net.IP, error) {
	if cfg.Advertise != "" {
		host, _, err := net.SplitHostPort(cfg.Advertise)
		if err != nil {
			return nil, fmt.Errorf("%w: --advertise %q: want HOST:PORT", ErrConfig, cfg.Advertise)
		}
		ip, err := resolveOne(host)
		if err != nil {
			return nil, fmt.Errorf("%w: --advertise %q: %v", ErrConfig, cfg.Advertise, err)
		}
		if ip.IsUnspecified() {
			return nil, fmt.Errorf("%w: --advertise %q: another host cannot reach an unspecified address (0.0.0.0, ::): give this host's address, such as --advertise 10.0.0.5:7946", ErrConfig, cfg.Advertise)
		}
		return ip, nil
	}
	ip := net.ParseIP(bindHost)
	if ip == nil {
		return nil, fmt.Errorf("%w: --bind %q: want an IP address (or 0.0.0.0) and a port", ErrConfig, cfg.Bind)
	}
	if !ip.IsUnspecified() {
		return ip, nil
	}
	private, err := sockaddr.GetPrivateIP()
	if err != nil || private == "" {
		return nil, fmt.Errorf("%w: --bind %q listens on every interface, and this host has no private address to advertise: give --advertise HOST:PORT with the address the other hosts reach it on", ErrConfig, cfg.Bind)
	}
	return net.ParseIP(private), nil
}

// checkReach refuses a loopback gossip address when a member to join is
// on another host: that member could never reach this node.
func checkReach(cfg Config, gossip net.IP) error {
	if !gossip.IsLoopback() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), resolveBudget)
	defer cancel()
	for _, entry := range cfg.Join {
		addrs, err := ResolveJoin(ctx, entry)
		if err != nil {
			continue // Join reports a bad entry; a name not resolvable yet is retried
		}
		for _, a := range addrs {
			host, _, _ := net.SplitHostPort(a)
			if ip := net.ParseIP(host); ip != nil && !ip.IsLoopback() {
				return fmt.Errorf("%w: this node would advertise the loopback address %s, but --join %s is another host: give --advertise (or --bind) with an address the other hosts reach", ErrConfig, gossip, entry)
			}
		}
	}
	return nil
}

// dataAdvertised is the data address to advertise for one bound at
// bound, when gossip is advertised on gossip.
func dataAdvertised(bound string, gossip net.IP) (string, error) {
	if bound == "" {
		return "", nil
	}
	host, port, err := net.SplitHostPort(bound)
	if err != nil {
		return "", fmt.Errorf("%w: --data-addr %q: want HOST:PORT", ErrConfig, bound)
	}
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		return bound, nil // a name: the others resolve it
	case ip.IsUnspecified():
		return net.JoinHostPort(gossip.String(), port), nil
	case ip.IsLoopback() && !gossip.IsLoopback():
		return "", fmt.Errorf("%w: --data-addr %q is a loopback address, but this node gossips on %s: the other hosts could not reach it; give --data-addr %s or 0.0.0.0:%s",
			ErrConfig, bound, gossip, net.JoinHostPort(gossip.String(), port), port)
	}
	return bound, nil
}

// resolveOne returns host's address, resolving a name.
func resolveOne(host string) (net.IP, error) {
	if ip := net.ParseIP(host); ip != nil {
		return ip, nil
	}
	ips, err := net.LookupIP(host)
	if err != nil {
		return nil, err
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("%s has no address", host)
	}
	return ips[0], nil
}
