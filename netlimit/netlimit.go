// Package netlimit bounds what strangers can hold on a server's port:
// connections at once, in all and from one source address, and how long
// each may stay; and it logs refusals at a bounded rate.
//
// # Concepts
//
// A Limiter admits connections that a server has accepted. Each admitted
// connection holds a slot until it is closed or released (Conn.Release:
// it authenticated, and what it may hold is counted elsewhere). A
// connection past Config.MaxConns, or past Config.MaxPerHost from its
// source IP, is closed at once: one client, or one address, cannot take
// every slot, and descriptors stay bounded whatever arrives. With
// Config.Lifetime, no deadline set on an admitted connection reaches past
// that long after its admission.
//
// Listener applies a Limiter to a net.Listener (an HTTP server's); a
// server that accepts by itself (memberlist's transport) calls Admit.
// HTTPServer adds read, write and idle timeouts for net/http.
//
// # Logs
//
// Refusals are logged through ratelog.Every: the first at once, then at most one
// line per interval, which says how many were not logged since. A flood of
// connections costs a few lines, not one each.
package netlimit

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlfs/dlfs/ratelog"
)

// Config bounds the connections of one server. Zero fields take
// DefaultConfig's.
type Config struct {
	Name       string        // the server, in log lines (e.g. "metrics"); default "server"
	MaxConns   int           // connections held at once; default 128
	MaxPerHost int           // of them from one source IP; default 16
	Lifetime   time.Duration // 0: no cap on deadlines (see package doc)
	LogEvery   time.Duration // at most one refusal line per interval; default 10 s
	Logger     *slog.Logger  // nil: discard
}

// DefaultConfig returns the defaults for a server called name.
func DefaultConfig(name string) Config {
	return Config{
		Name:       name,
		MaxConns:   128,              // well under the descriptors a daemon has
		MaxPerHost: 16,               // one address takes at most an eighth
		LogEvery:   10 * time.Second, // a flood costs a line per 10 s
	}
}

// ErrConfig wraps configuration errors.
var ErrConfig = errors.New("netlimit: bad configuration")

// Or returns c with its zero fields taken from def (MaxPerHost at most
// MaxConns).
func (c Config) Or(def Config) Config {
	if c.Name == "" {
		c.Name = def.Name
	}
	if c.MaxConns == 0 {
		c.MaxConns = def.MaxConns
	}
	if c.MaxPerHost == 0 {
		c.MaxPerHost = min(def.MaxPerHost, c.MaxConns)
	}
	if c.Lifetime == 0 {
		c.Lifetime = def.Lifetime
	}
	if c.LogEvery == 0 {
		c.LogEvery = def.LogEvery
	}
	if c.Logger == nil {
		c.Logger = def.Logger
	}
	return c
}

// withDefaults fills zero fields and checks the rest.
func (c Config) withDefaults() (Config, error) {
	c = c.Or(DefaultConfig("server"))
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, c.Validate()
}

// Validate checks c after defaults; the error names the field.
func (c Config) Validate() error {
	switch {
	case c.MaxConns < 0:
		return fmt.Errorf("%w: %s: MaxConns %d is negative", ErrConfig, c.Name, c.MaxConns)
	case c.MaxPerHost < 0 || c.MaxPerHost > c.MaxConns:
		return fmt.Errorf("%w: %s: MaxPerHost %d must be 0 to MaxConns (%d)", ErrConfig, c.Name, c.MaxPerHost, c.MaxConns)
	case c.Lifetime < 0:
		return fmt.Errorf("%w: %s: Lifetime %v is negative", ErrConfig, c.Name, c.Lifetime)
	case c.LogEvery < 0:
		return fmt.Errorf("%w: %s: LogEvery %v is negative", ErrConfig, c.Name, c.LogEvery)
	}
	return nil
}

// Limiter admits connections within the bounds. Safe for concurrent use;
// nothing blocks.
type Limiter struct {
	cfg  Config // read-only after New
	logs ratelog.Every

	mu     sync.Mutex
	held   int            // mu guards held and byHost
	byHost map[string]int // INVARIANT: sums to held; no zero values

	refused atomic.Int64
}

// New returns a limiter for cfg.
func New(cfg Config) (*Limiter, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Limiter{cfg: cfg, logs: ratelog.Every{Interval: cfg.LogEvery}, byHost: map[string]int{}}, nil
}

// Host is the key a connection is counted under: its source IP.
func Host(a net.Addr) string {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.IP.String()
	case nil:
		return ""
	}
	if h, _, err := net.SplitHostPort(a.String()); err == nil {
		return h
	}
	return a.String()
}

// Admit gives c a slot and returns it wrapped, or closes it and returns
// false when the server or c's source address holds all it may.
func (l *Limiter) Admit(c net.Conn) (*Conn, bool) {
	host := Host(c.RemoteAddr())
	l.mu.Lock()
	why := ""
	switch {
	case l.held >= l.cfg.MaxConns:
		why = "too many connections"
	case l.byHost[host] >= l.cfg.MaxPerHost:
		why = "too many connections from one address"
	default:
		l.held++
		l.byHost[host]++
	}
	l.mu.Unlock()
	if why != "" {
		c.Close()
		l.refused.Add(1)
		l.logs.Warn(l.cfg.Logger, l.cfg.Name+": refusing connections: "+why,
			"remote", c.RemoteAddr().String(), "max", l.cfg.MaxConns, "max_per_address", l.cfg.MaxPerHost)
		return nil, false
	}
	w := &Conn{Conn: c, l: l, host: host}
	if l.cfg.Lifetime > 0 {
		w.end = time.Now().Add(l.cfg.Lifetime)
		_ = c.SetDeadline(w.end)
	}
	return w, true
}

func (l *Limiter) release(host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held--
	if l.byHost[host]--; l.byHost[host] <= 0 {
		delete(l.byHost, host)
	}
}

// Held returns how many connections hold a slot now.
func (l *Limiter) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}

// HeldBy returns how many connections from host hold a slot now.
func (l *Limiter) HeldBy(host string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byHost[host]
}

// Refused returns how many connections were closed for want of a slot.
func (l *Limiter) Refused() int64 { return l.refused.Load() }

// Conn is an admitted connection. Close (or Release) gives its slot back.
type Conn struct {
	net.Conn
	l    *Limiter
	host string
	end  time.Time // with Config.Lifetime: no deadline beyond; read-only
	once sync.Once
}

// Release gives the slot back and leaves the connection open: it is no
// longer a stranger's. Safe to call more than once, and with Close.
func (c *Conn) Release() { c.once.Do(func() { c.l.release(c.host) }) }

// Close closes the connection and gives its slot back.
func (c *Conn) Close() error {
	c.Release()
	return c.Conn.Close()
}

// clamp returns t, or the end of the connection's lifetime if that is
// sooner (a zero t, no deadline, included).
func (c *Conn) clamp(t time.Time) time.Time {
	if !c.end.IsZero() && (t.IsZero() || t.After(c.end)) {
		return c.end
	}
	return t
}

// SetDeadline sets the deadline, within the lifetime.
func (c *Conn) SetDeadline(t time.Time) error { return c.Conn.SetDeadline(c.clamp(t)) }

// SetReadDeadline sets the read deadline, within the lifetime.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.Conn.SetReadDeadline(c.clamp(t)) }

// SetWriteDeadline sets the write deadline, within the lifetime.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.Conn.SetWriteDeadline(c.clamp(t)) }

// Listener is a net.Listener whose Accept returns only admitted
// connections; it closes the others itself.
type Listener struct {
	net.Listener
	*Limiter
}

// NewListener applies a limiter for cfg to ln.
func NewListener(ln net.Listener, cfg Config) (*Listener, error) {
	l, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return &Listener{Listener: ln, Limiter: l}, nil
}

// Accept waits for the next connection that is admitted.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if w, ok := l.Admit(c); ok {
			return w, nil
		}
	}
}
