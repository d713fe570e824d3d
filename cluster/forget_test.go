package cluster

import (
	"bytes"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// names returns the names in c's view.
func names(c *Cluster) []string {
	var out []string
	for _, m := range c.Members() {
		out = append(out, m.Name)
	}
	return out
}

// TestDeadForgotten: a member that is gone leaves the view (and so
// stats, the status page and dlfs_cluster_members) once ForgetDead has
// passed (finding of issue 27: dead members stayed for the daemon's
// life).
func TestDeadForgotten(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	a, err := Start(Config{NodeName: "node-a", Bind: "127.0.0.1:0", Key: key, Local: true, ForgetDead: 500 * time.Millisecond,
		Meta: Meta{DataAddr: "127.0.0.1:1", Dataset: "ds"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b := start(t, "node-b", key, a.Addr())
	c := start(t, "node-c", key, a.Addr())
	waitView(t, a, 3)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Equal(names(a), []string{"node-a", "node-c"}) {
		if time.Now().After(deadline) {
			t.Fatalf("a's view still holds %v after node-b went", a.Members())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := names(c); !slices.Contains(got, "node-a") || !slices.Contains(got, "node-c") {
		t.Fatalf("c's view %v lost a live member", got)
	}
}

// The rule: the view holds the members alive, and those dead or gone for
// at most ForgetDead; an update of a dead member does not restart its
// time.
func TestForgetRule(t *testing.T) {
	now := time.Now()
	c := &Cluster{cfg: Config{ForgetDead: time.Minute}, log: slog.New(slog.DiscardHandler), members: map[string]member{}}
	for _, m := range []member{
		{Member{Name: "alive-long", State: StateAlive}, now.Add(-time.Hour)},
		{Member{Name: "dead-long", State: StateDead}, now.Add(-2 * time.Minute)},
		{Member{Name: "dead-now", State: StateDead}, now.Add(-30 * time.Second)},
		{Member{Name: "left-long", State: StateLeft}, now.Add(-61 * time.Second)},
		{Member{Name: "left-now", State: StateLeft}, now},
	} {
		c.members[m.Name] = m
	}
	c.forget(now)
	if got, want := names(c), []string{"alive-long", "dead-now", "left-now"}; !slices.Equal(got, want) {
		t.Fatalf("view %v, want %v", got, want)
	}
	// memberlist tells of dead-now again: it keeps the time it died.
	(&events{c}).NotifyLeave(&memberlist.Node{Name: "dead-now", Addr: net.IPv4(127, 0, 0, 1), State: memberlist.StateDead})
	c.forget(now.Add(31 * time.Second))
	if got, want := names(c), []string{"alive-long", "left-now"}; !slices.Equal(got, want) {
		t.Fatalf("view %v, want %v: a repeated notice restarted a dead member's time", got, want)
	}
}
