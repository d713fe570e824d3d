// Package cluster is the gossip membership of the dlfs nodes that mount
// the same dataset (hashicorp/memberlist).
//
// # What it does
//
// A node starts a memberlist on Config.Bind, advertises its data address,
// dataset identity and tier capacities as node metadata (Meta), and joins
// the nodes in Config.Join; with none, it is a cluster of one. Addresses
// bound on every interface are never advertised as such (addr.go); join
// names may resolve to several addresses, and a node none of them
// answers serves alone and keeps trying (join.go). Members()
// is the current view: every node alive, and those dead or gone for at
// most Config.ForgetDead, with its metadata. Subscribers hear of every
// change without blocking.
//
// There is no suspect state in the view: memberlist tells its delegate of
// joins, updates and leaves, not of suspicion, so a member it suspects
// stays alive here until memberlist declares it dead (after its
// suspicion timeout), and then dead until ForgetDead has passed.
//
// # Security
//
// With Config.Key (16, 24 or 32 bytes), all gossip is encrypted and
// authenticated (memberlist's keyring, with incoming and outgoing
// verification): a node without the key can neither join nor be heard.
// Anyone can still open TCP streams to the gossip port before the key is
// checked: the transport (transport.go, memberlist's NetTransport behind a
// netlimit.Limiter) holds at most Config.Streams of them, in all and from
// one address, each for a few seconds. A quarter of the slots are kept
// for the addresses of members alive; a stream that finds no slot closes
// the oldest stranger's, so idle strangers keep out neither a member nor
// a joiner. A stream's first frame may declare at most MaxFrame bytes,
// and the frames of the streams not yet proven hold at most
// Streams.Bytes in all (strangers' and members' addresses each), which
// bounds what memberlist buffers before it checks the key.
//
// # Lifetime
//
// Start returns a running member: it waits for the first round of joins
// at most a few seconds, and the rest goes on in the background
// (join.go). Close leaves the cluster (telling the others), ends the
// joins and dials in flight, and shuts memberlist down. Callbacks from
// memberlist never block: they record the change and notify.
package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/dlfs/dlfs/netlimit"
)

// Config configures a member.
type Config struct {
	NodeName  string   // unique in the cluster; required
	Bind      string   // HOST:PORT for gossip; port 0 picks one
	Advertise string   // HOST:PORT others reach this node on; default Bind
	Join      []string // HOST:PORT of members to join, HOST a name or an IP; empty: a cluster of one
	Key       []byte   // cluster key: gossip is encrypted and authenticated with it
	// Insecure lets a node gossip without a key: anyone who reaches the
	// port can join, read and forge gossip. Without it, Start refuses a
	// missing key.
	Insecure bool
	Meta     Meta
	// Local uses memberlist's loopback timings (fast failure detection),
	// for tests and single-machine clusters.
	Local bool
	// ForgetDead is how long a member dead or gone stays in the view
	// (Members, and so stats, the status page and metrics) before it is
	// forgotten; default memberlist's GossipToTheDeadTime (30 s, or 15 s
	// with Local), after which memberlist forgets it too.
	ForgetDead time.Duration
	// Streams bounds the inbound TCP streams of gossip, which anyone who
	// reaches the port can open: at once, from one address, and how long
	// each may stay. Zero fields take DefaultStreams'.
	Streams netlimit.Config
	Logger  *slog.Logger // nil: discard
}

// State of a member.
const (
	StateAlive = "alive"
	StateDead  = "dead" // failed: memberlist's suspicion ran out
	StateLeft  = "left" // left the cluster (Close)
)

// Member is a node in the view.
type Member struct {
	Name  string `json:"name"`
	Addr  string `json:"address"`
	State string `json:"state"`
	Meta  Meta   `json:"meta"`
}

// Cluster is a running member. Safe for concurrent use.
type Cluster struct {
	cfg Config
	log *slog.Logger
	ml  *memberlist.Memberlist
	tr  *transport // memberlist's, with its inbound streams bounded
	// hosts are the addresses of the other members alive: their streams
	// take the slots kept for members (transport.go).
	hosts *hostSet

	delegate *delegate
	// addr is the advertised gossip address, read once at Start: the
	// local node memberlist returns is updated under its own lock.
	addr string

	mu      sync.Mutex
	members map[string]member // mu guards members and subs
	subs    []chan struct{}
	closed  bool

	stop chan struct{} // closed by Close
	wg   sync.WaitGroup

	leave    sync.Once
	leaveErr error // (leave) the broadcast's
}

// member is a Member and when it entered its state.
type member struct {
	Member
	since time.Time
}

// ErrConfig wraps configuration errors.
var ErrConfig = errors.New("cluster: bad configuration")

// Start creates the member and joins the cluster.
func Start(cfg Config) (*Cluster, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.NodeName == "" {
		return nil, fmt.Errorf("%w: no node name", ErrConfig)
	}
	switch len(cfg.Key) {
	case 0:
		if !cfg.Insecure {
			return nil, fmt.Errorf("%w: no cluster key: anyone who reaches the gossip port could join; give a key file (--cluster-key-file), or --insecure on a network only trusted nodes reach", ErrConfig)
		}
		cfg.Logger.Warn("cluster: gossiping without a key (--insecure): anyone who reaches the port can join and forge gossip")
	case 16, 24, 32:
	default:
		return nil, fmt.Errorf("%w: the cluster key must be 16, 24 or 32 bytes, not %d", ErrConfig, len(cfg.Key))
	}
	if cfg.ForgetDead < 0 {
		return nil, fmt.Errorf("%w: ForgetDead %v is negative", ErrConfig, cfg.ForgetDead)
	}
	mc := memberlist.DefaultLANConfig()
	if cfg.Local {
		mc = memberlist.DefaultLocalConfig()
	}
	mc.Name = cfg.NodeName
	if cfg.ForgetDead == 0 {
		cfg.ForgetDead = mc.GossipToTheDeadTime
	}
	// A node that comes back after a crash binds new ports (port 0, or a
	// new machine): let it reclaim its name soon after it was declared
	// dead, instead of never (memberlist's default).
	mc.DeadNodeReclaimTime = 5 * time.Second
	if cfg.Local {
		mc.DeadNodeReclaimTime = time.Second
	}
	var err error
	if mc.BindAddr, mc.BindPort, err = splitHostPort(cfg.Bind, "bind"); err != nil {
		return nil, err
	}
	mc.AdvertisePort = mc.BindPort // newTransport sets the one bound, for port 0
	if cfg.Advertise != "" {
		if _, mc.AdvertisePort, err = splitHostPort(cfg.Advertise, "advertise"); err != nil {
			return nil, err
		}
	}
	// Never an unspecified address (addr.go).
	ip, data, err := Addresses(cfg)
	if err != nil {
		return nil, err
	}
	mc.AdvertiseAddr, cfg.Meta.DataAddr = ip.String(), data
	meta, err := cfg.Meta.Encode()
	if err != nil {
		return nil, err
	}
	if len(cfg.Key) > 0 {
		mc.SecretKey = cfg.Key
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	mc.Logger = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug)
	hosts := &hostSet{n: map[string]int{}}
	limits := streamLimits(cfg, mc.TCPTimeout)
	limits.Known = hosts.has
	tr, err := newTransport(mc, limits, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("cluster: start gossip on %s: %w", cfg.Bind, err)
	}
	mc.Transport = tr
	c := &Cluster{cfg: cfg, log: cfg.Logger, tr: tr, hosts: hosts, members: map[string]member{}, stop: make(chan struct{})}
	c.delegate = &delegate{meta: meta}
	mc.Delegate = c.delegate
	mc.Events = &events{c: c}
	c.ml, err = memberlist.Create(mc)
	if err != nil {
		tr.Shutdown()
		return nil, fmt.Errorf("cluster: start gossip on %s: %w", cfg.Bind, err)
	}
	local := c.ml.LocalNode()
	c.addr = net.JoinHostPort(local.Addr.String(), strconv.Itoa(int(local.Port)))
	if len(cfg.Join) > 0 {
		// The first round of joins runs in the background: Start waits
		// for its outcome at most joinWait (join.go).
		first := make(chan joinOutcome, 1)
		c.wg.Add(1)
		go c.keepJoining(first, mc.DeadNodeReclaimTime)
		select {
		case o := <-first:
			if o.n == 0 && o.err != nil {
				close(c.stop)
				c.tr.abort()
				c.wg.Wait()
				c.ml.Shutdown()
				return nil, fmt.Errorf("cluster: join %v: %w (is the cluster key the same on every node?)", cfg.Join, o.err)
			}
			if o.n == 0 {
				c.log.Warn("cluster: no member named by --join answered yet; serving alone and trying again", "join", cfg.Join)
			}
		case <-time.After(joinWait):
			c.log.Warn("cluster: no member named by --join answered within "+joinWait.String()+"; serving alone and trying in the background", "join", cfg.Join)
		}
	}
	return c, nil
}

// streamLimits returns cfg.Streams, its zero fields DefaultStreams'.
func streamLimits(cfg Config, tcpTimeout time.Duration) netlimit.Config {
	def := DefaultStreams(tcpTimeout)
	def.Logger = cfg.Logger
	return cfg.Streams.Or(def)
}

func splitHostPort(hp, what string) (string, int, error) {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, fmt.Errorf("%w: --%s %q: want HOST:PORT", ErrConfig, what, hp)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return "", 0, fmt.Errorf("%w: --%s %q: bad port", ErrConfig, what, hp)
	}
	return host, p, nil
}

// Addr returns the gossip address this member is reachable on.
func (c *Cluster) Addr() string { return c.addr }

// Members returns the view, sorted by name: the members alive, and those
// dead or gone for less than Config.ForgetDead.
func (c *Cluster) Members() []Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forget(time.Now())
	out := make([]Member, 0, len(c.members))
	for _, m := range c.members {
		out = append(out, m.Member)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Alive returns the members currently alive, sorted by name.
func (c *Cluster) Alive() []Member {
	var out []Member
	for _, m := range c.Members() {
		if m.State == StateAlive {
			out = append(out, m)
		}
	}
	return out
}

// Subscribe returns a channel that receives a value (coalesced) whenever
// the view changes.
func (c *Cluster) Subscribe() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan struct{}, 1)
	c.subs = append(c.subs, ch)
	return ch
}

// Close leaves the cluster and stops gossiping. Safe to call twice.
// Leave tells the cluster at once that this node is leaving, waiting
// at most 2 s for the broadcast: the others re-place its share while it
// tears down, and it goes on answering gossip (and its peer server
// serving) until Close. It is done once; Close does it if nobody did.
func (c *Cluster) Leave() error {
	c.leave.Do(func() { c.leaveErr = c.ml.Leave(2 * time.Second) })
	return c.leaveErr
}

func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	close(c.stop)
	c.tr.abort() // joins waiting on a dial or a reply end now
	c.wg.Wait()
	err := c.Leave()
	if serr := c.ml.Shutdown(); err == nil {
		err = serr
	}
	return err
}

// record updates the view from a memberlist node. It never blocks.
func (c *Cluster) record(n *memberlist.Node, state string) {
	m := Member{Name: n.Name, Addr: net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port))), State: state}
	meta, err := DecodeMeta(n.Meta)
	if err != nil {
		c.log.Warn("cluster: ignoring a member's metadata", "node", n.Name, "err", err)
	} else {
		m.Meta = meta
		for _, err := range meta.jobErrs {
			c.log.Debug("cluster: ignoring a member's job", "node", n.Name, "err", err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	since := now
	old, ok := c.members[n.Name]
	if ok && old.State == m.State {
		since = old.since // an update, not a change of state
	}
	if n.Name != c.cfg.NodeName {
		if ok && old.State == StateAlive {
			c.hosts.add(hostOf(old.Addr), -1)
		}
		if m.State == StateAlive {
			c.hosts.add(n.Addr.String(), 1)
		}
	}
	c.members[n.Name] = member{m, since}
	c.forget(now)
	for _, ch := range c.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// forget drops the members dead or gone for longer than ForgetDead: the
// view holds at most the live members and those that died within it.
// c.mu must be held.
func (c *Cluster) forget(now time.Time) {
	for name, m := range c.members {
		if (m.State == StateDead || m.State == StateLeft) && now.Sub(m.since) > c.cfg.ForgetDead {
			delete(c.members, name)
		}
	}
}

// StartMeta is the metadata Start advertised: Config.Meta with its data
// address as the other hosts reach it (addr.go).
func (c *Cluster) StartMeta() Meta { return c.cfg.Meta }

// SetMeta replaces this node's metadata and gossips it. It waits up to
// a second for the update to go out.
func (c *Cluster) SetMeta(m Meta) error {
	b, err := m.Encode()
	if err != nil {
		return err
	}
	c.delegate.set(b)
	if err := c.ml.UpdateNode(time.Second); err != nil {
		return fmt.Errorf("cluster: gossip new metadata: %w", err)
	}
	return nil
}

// delegate serves this node's metadata. Messages are not used yet.
type delegate struct {
	mu   sync.Mutex
	meta []byte // mu guards meta
}

func (d *delegate) set(b []byte) {
	d.mu.Lock()
	d.meta = b
	d.mu.Unlock()
}

func (d *delegate) NodeMeta(limit int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.meta) > limit {
		return nil
	}
	return d.meta
}
func (d *delegate) NotifyMsg([]byte)                           {}
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}

// events turns memberlist's callbacks into view updates.
type events struct{ c *Cluster }

func (e *events) NotifyJoin(n *memberlist.Node)   { e.c.record(n, StateAlive) }
func (e *events) NotifyUpdate(n *memberlist.Node) { e.c.record(n, StateAlive) }
func (e *events) NotifyLeave(n *memberlist.Node) {
	state := StateDead
	if n.State == memberlist.StateLeft {
		state = StateLeft
	}
	e.c.record(n, state)
}

// hostSet counts the members alive at each IP. Safe for concurrent use;
// has never blocks for long (it is netlimit's Known). A nil set is empty
// and stays so.
type hostSet struct {
	mu sync.Mutex
	n  map[string]int // mu guards n; INVARIANT: no zero values
}

func (h *hostSet) add(host string, d int) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n[host] += d; h.n[host] <= 0 {
		delete(h.n, host)
	}
}

func (h *hostSet) has(host string) bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[host] > 0
}

// hostOf returns the IP of HOST:PORT.
func hostOf(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}
