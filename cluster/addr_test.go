package cluster

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// TestNeverAdvertiseUnspecified: an --advertise of 0.0.0.0 or :: is
// refused with a line naming --advertise; a bind on every interface
// advertises a private address of this host or is refused, never itself.
func TestNeverAdvertiseUnspecified(t *testing.T) {
	for _, adv := range []string{"0.0.0.0:7946", "[::]:7946"} {
		_, err := advertised(Config{Advertise: adv}, "0.0.0.0")
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "--advertise") || strings.Contains(err.Error(), "\n") {
			t.Errorf("--advertise %s: %v, want a one-line ErrConfig naming --advertise", adv, err)
		}
	}
	for _, bind := range []string{"0.0.0.0", "::"} {
		ip, err := advertised(Config{Bind: net.JoinHostPort(bind, "7946")}, bind)
		switch {
		case err != nil && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "--advertise")):
			t.Errorf("--bind %s: %v, want ErrConfig naming --advertise", bind, err)
		case err == nil && (ip.IsUnspecified() || ip.IsLoopback()):
			t.Errorf("--bind %s advertises %s", bind, ip)
		}
	}
	if ip, err := advertised(Config{Bind: "10.1.2.3:7946"}, "10.1.2.3"); err != nil || ip.String() != "10.1.2.3" {
		t.Errorf("--bind 10.1.2.3: %v, %v", ip, err)
	}
	if ip, err := advertised(Config{Advertise: "10.9.9.9:1", Bind: "0.0.0.0:7946"}, "0.0.0.0"); err != nil || ip.String() != "10.9.9.9" {
		t.Errorf("--advertise 10.9.9.9: %v, %v", ip, err)
	}
	if ip, err := advertised(Config{Advertise: "localhost:1"}, "0.0.0.0"); err != nil || !ip.IsLoopback() {
		t.Errorf("--advertise localhost (a name): %v, %v", ip, err)
	}
}

// TestLoopbackWithAnotherHost: a loopback gossip address is refused when
// --join names another host, and fine on one machine.
func TestLoopbackWithAnotherHost(t *testing.T) {
	lo := net.ParseIP("127.0.0.1")
	err := checkReach(Config{Join: []string{"127.0.0.1:7946", "10.20.30.40:7946"}}, lo)
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "10.20.30.40:7946") || !strings.Contains(err.Error(), "--advertise") {
		t.Errorf("loopback with a join on another host: %v", err)
	}
	if err := checkReach(Config{Join: []string{"127.0.0.1:7946", "localhost:7000"}}, lo); err != nil {
		t.Errorf("loopback joining loopback: %v", err)
	}
	if err := checkReach(Config{Join: []string{"10.20.30.40:7946"}}, net.ParseIP("10.0.0.1")); err != nil {
		t.Errorf("a routable address: %v", err)
	}
}

// TestDataAddrAdvertised: a data address bound on every interface is
// advertised on the gossip address's host; a loopback one with a
// routable gossip address is refused, saying what to give.
func TestDataAddrAdvertised(t *testing.T) {
	g := net.ParseIP("10.0.0.5")
	for bound, want := range map[string]string{"0.0.0.0:7947": "10.0.0.5:7947", "[::]:17947": "10.0.0.5:17947",
		"10.0.0.6:7947": "10.0.0.6:7947", "dlfs-0.example:7947": "dlfs-0.example:7947", "": ""} {
		if got, err := dataAdvertised(bound, g); err != nil || got != want {
			t.Errorf("data address %q: %q, %v; want %q", bound, got, err, want)
		}
	}
	_, err := dataAdvertised("127.0.0.1:7947", g)
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "--data-addr 10.0.0.5:7947 or 0.0.0.0:7947") {
		t.Errorf("a loopback data address with a routable gossip address: %v", err)
	}
	if got, err := dataAdvertised("127.0.0.1:7947", net.ParseIP("127.0.0.1")); err != nil || got != "127.0.0.1:7947" {
		t.Errorf("loopback on one machine: %q, %v", got, err)
	}
	if _, err := dataAdvertised("nonsense", g); !errors.Is(err, ErrConfig) {
		t.Errorf("a data address without a port: %v", err)
	}
	// Start advertises it so: to the others and in StartMeta.
	c, err := Start(Config{NodeName: "n", Bind: "127.0.0.1:0", Insecure: true, Local: true, Meta: Meta{DataAddr: "0.0.0.0:7947"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.StartMeta().DataAddr; got != "127.0.0.1:7947" {
		t.Errorf("StartMeta().DataAddr = %q, want 127.0.0.1:7947", got)
	}
	if ms := c.Members(); len(ms) != 1 || ms[0].Meta.DataAddr != "127.0.0.1:7947" {
		t.Errorf("the view advertises %+v", ms)
	}
}

// TestJoinRetriesUntilAnswered: a node whose --join answers nobody yet
// starts alone and joins once a member comes up there; its own address
// in the list does not count as an answer.
func TestJoinRetriesUntilAnswered(t *testing.T) {
	key := bytes.Repeat([]byte{3}, 16)
	// A free port for the seed to come.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seedAddr := l.Addr().String()
	l.Close()
	b, err := Start(Config{NodeName: "b", Bind: "127.0.0.1:0", Join: []string{seedAddr}, Key: key, Local: true})
	if err != nil {
		t.Fatalf("a node whose seed is not up yet did not start: %v", err)
	}
	defer b.Close()
	if n := len(b.Alive()); n != 1 {
		t.Fatalf("b sees %d members before the seed is up", n)
	}
	seed, err := Start(Config{NodeName: "seed", Bind: seedAddr, Key: key, Local: true})
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	waitView(t, b, 2)
	waitView(t, seed, 2)

	// Only itself in the list: alone, no error, trying again.
	self, err := Start(Config{NodeName: "self", Bind: "127.0.0.1:0", Key: key, Local: true})
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	self.cfg.Join = []string{self.Addr()}
	if n, err := self.join(joinEnough); n != 0 || err != nil {
		t.Errorf("joining only itself: %d answered, %v", n, err)
	}
}

// TestJoinRefusedFailsAtOnce: a member that answers but will not gossip
// (another key) fails Start at once, not after retries.
func TestJoinRefusedFailsAtOnce(t *testing.T) {
	a := start(t, "node-a", bytes.Repeat([]byte{1}, 16))
	begin := time.Now()
	_, err := Start(Config{NodeName: "wrong", Bind: "127.0.0.1:0", Join: []string{a.Addr()}, Local: true, Key: bytes.Repeat([]byte{2}, 16)})
	if !errors.Is(err, errRefused) || !strings.Contains(err.Error(), "cluster key") {
		t.Fatalf("another key: %v, want errRefused naming the cluster key", err)
	}
	t.Logf("refused after %v", time.Since(begin))
}
