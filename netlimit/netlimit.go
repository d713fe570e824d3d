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
// # Strangers and known hosts
//
// A connection from a host that Config.Known names (a cluster member's
// address) is a known host's; any other is a stranger's. Strangers hold
// at most MaxConns-Config.Reserve slots, so idle strangers cannot keep
// the known hosts out. With Config.Evict, a connection that finds no
// slot closes the oldest stranger's connection and takes its slot,
// instead of being refused: idle connections cannot keep a newcomer out
// either, as long as it finishes before that many more strangers arrive.
//
// # Bytes
//
// Conn.Charge counts what a connection makes the server hold (a frame
// it declared, say) against Config.Bytes: one budget for strangers, one
// of the same size for known hosts. A charge past it fails, and the
// server closes the connection; Close and Release give the bytes back.
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
	"container/list"
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
	// Reserve is how many of MaxConns only known hosts may hold.
	Reserve int
	// Known reports whether host (a source IP, see Host) is a known
	// host's. It is called once per connection, outside the limiter's
	// lock, and must not block. nil: every host is a stranger.
	Known func(host string) bool
	// Evict closes the oldest stranger's connection for a newcomer that
	// finds no slot (see package doc); false here takes the default's.
	Evict bool
	// Bytes is what strangers' connections may have charged at once, and
	// known hosts' as much again. 0: no budget.
	Bytes    int64
	LogEvery time.Duration // at most one refusal line per interval; default 10 s
	Logger   *slog.Logger  // nil: discard
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
// MaxConns; Reserve the same share of MaxConns as def's).
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
	if c.Reserve == 0 && def.MaxConns > 0 {
		c.Reserve = def.Reserve * c.MaxConns / def.MaxConns // the same share of MaxConns
	}
	if c.Known == nil {
		c.Known = def.Known
	}
	c.Evict = c.Evict || def.Evict
	if c.Bytes == 0 {
		c.Bytes = def.Bytes
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
	case c.Reserve < 0 || c.Reserve > c.MaxConns:
		return fmt.Errorf("%w: %s: Reserve %d must be 0 to MaxConns (%d)", ErrConfig, c.Name, c.Reserve, c.MaxConns)
	case c.Bytes < 0:
		return fmt.Errorf("%w: %s: Bytes %d is negative", ErrConfig, c.Name, c.Bytes)
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

	mu        sync.Mutex
	held      int            // mu guards held, byHost, strangers, charged and each Conn's held fields
	byHost    map[string]int // INVARIANT: sums to held; no zero values
	strangers list.List      // of *Conn: strangers' connections holding a slot, oldest first
	charged   [2]int64       // bytes charged by strangers' [0] and known hosts' [1] connections

	refused atomic.Int64
	evicted atomic.Int64
	overrun atomic.Int64
}

// ErrBudget is a charge past Config.Bytes.
var ErrBudget = errors.New("netlimit: over the byte budget")

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
// false when the server or c's source address holds all it may. With
// Config.Evict, it may close the oldest stranger's connection instead.
func (l *Limiter) Admit(c net.Conn) (*Conn, bool) {
	host := Host(c.RemoteAddr())
	known := l.cfg.Known != nil && l.cfg.Known(host)
	w := &Conn{Conn: c, l: l, host: host, known: known}
	l.mu.Lock()
	why := ""
	var victim *Conn
	full := l.held >= l.cfg.MaxConns || !known && l.strangers.Len() >= l.cfg.MaxConns-l.cfg.Reserve
	switch {
	case l.byHost[host] >= l.cfg.MaxPerHost:
		why = "too many connections from one address"
	case full && (!l.cfg.Evict || l.strangers.Len() == 0):
		why = "too many connections"
	default:
		if full {
			victim = l.strangers.Front().Value.(*Conn)
			l.releaseLocked(victim)
		}
		l.held++
		l.byHost[host]++
		if !known {
			w.elem = l.strangers.PushBack(w)
		}
	}
	l.mu.Unlock()
	if why != "" {
		c.Close()
		l.refused.Add(1)
		l.logs.Warn(l.cfg.Logger, l.cfg.Name+": refusing connections: "+why,
			"remote", c.RemoteAddr().String(), "max", l.cfg.MaxConns, "max_per_address", l.cfg.MaxPerHost, "reserved", l.cfg.Reserve)
		return nil, false
	}
	if victim != nil {
		victim.Conn.Close()
		l.evicted.Add(1)
		l.logs.Warn(l.cfg.Logger, l.cfg.Name+": no slot free: closing the oldest stranger's connection for a new one",
			"closed", victim.RemoteAddr().String(), "remote", c.RemoteAddr().String(), "max", l.cfg.MaxConns, "reserved", l.cfg.Reserve)
	}
	if l.cfg.Lifetime > 0 {
		w.end = time.Now().Add(l.cfg.Lifetime)
		_ = c.SetDeadline(w.end)
	}
	return w, true
}

// releaseLocked gives c's slot and bytes back, once. l.mu must be held.
func (l *Limiter) releaseLocked(c *Conn) {
	if c.released {
		return
	}
	c.released = true
	l.held--
	if l.byHost[c.host]--; l.byHost[c.host] <= 0 {
		delete(l.byHost, c.host)
	}
	if c.elem != nil {
		l.strangers.Remove(c.elem)
		c.elem = nil
	}
	l.charged[c.pool()] -= c.charged
	c.charged = 0
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

// Charged returns the bytes charged now by strangers' connections and by
// known hosts'.
func (l *Limiter) Charged() (strangers, known int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.charged[0], l.charged[1]
}

// Refused returns how many connections were closed for want of a slot.
func (l *Limiter) Refused() int64 { return l.refused.Load() }

// Evicted returns how many strangers' connections were closed for a
// newcomer (Config.Evict).
func (l *Limiter) Evicted() int64 { return l.evicted.Load() }

// Overruns returns how many charges failed (Config.Bytes).
func (l *Limiter) Overruns() int64 { return l.overrun.Load() }

// Conn is an admitted connection. Close (or Release) gives its slot back.
type Conn struct {
	net.Conn
	l     *Limiter
	host  string
	known bool      // a known host's (Config.Known); read-only
	end   time.Time // with Config.Lifetime: no deadline beyond; read-only

	released bool          // l.mu guards released, elem and charged
	elem     *list.Element // in l.strangers while a stranger's holds a slot
	charged  int64
}

// Known reports whether c came from a known host (Config.Known).
func (c *Conn) Known() bool { return c.known }

func (c *Conn) pool() int {
	if c.known {
		return 1
	}
	return 0
}

// Charge counts n more bytes that c makes the server hold, against
// Config.Bytes. Past the budget it charges nothing and returns an error
// wrapping ErrBudget: the caller closes c. A released connection is
// charged nothing. Safe for concurrent use.
func (c *Conn) Charge(n int64) error {
	l := c.l
	l.mu.Lock()
	over := !c.released && l.cfg.Bytes > 0 && l.charged[c.pool()]+n > l.cfg.Bytes
	charged := l.charged[c.pool()]
	if !over && !c.released {
		c.charged += n
		l.charged[c.pool()] += n
	}
	l.mu.Unlock()
	if !over {
		return nil
	}
	l.overrun.Add(1)
	l.logs.Warn(l.cfg.Logger, l.cfg.Name+": refusing a connection: over the byte budget",
		"remote", c.RemoteAddr().String(), "bytes", n, "charged", charged, "budget", l.cfg.Bytes, "known", c.known)
	return fmt.Errorf("%w: %s: %s wants %d bytes, %d of %d are charged", ErrBudget, l.cfg.Name, c.RemoteAddr(), n, charged, l.cfg.Bytes)
}

// Release gives the slot and the bytes charged back and leaves the
// connection open: it is no longer a stranger's. Safe to call more than
// once, and with Close.
func (c *Conn) Release() {
	c.l.mu.Lock()
	c.l.releaseLocked(c)
	c.l.mu.Unlock()
}

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
