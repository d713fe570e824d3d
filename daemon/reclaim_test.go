package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/peer"
	"github.com/dlfs/dlfs/placement"
	"github.com/dlfs/dlfs/test/conformance"
)

// TestGoneMemberForgotten: a member that went leaves .dlfs/stats and
// dlfs_cluster_members once the forget time has passed (finding of issue
// 27: dead members stayed for the daemon's life).
func TestGoneMemberForgotten(t *testing.T) {
	src := conformance.OddTree(t, t.TempDir())
	a, mntA := start(t, src, func(c *Config) {
		c.NodeName, c.Cluster = "a", cluster.Config{Bind: "127.0.0.1:0", Key: testKey, Local: true, ForgetDead: 500 * time.Millisecond}
	})
	b, _ := start(t, src, func(c *Config) {
		c.NodeName, c.Cluster = "b", cluster.Config{Bind: "127.0.0.1:0", Join: []string{a.cl.Addr()}, Key: testKey, Local: true}
	})
	waitAlive(t, 2, a, b)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var st Stats
		readJSON(t, filepath.Join(mntA, ".dlfs/stats"), &st)
		prom, err := os.ReadFile(filepath.Join(mntA, ".dlfs/stats.prom"))
		if err != nil {
			t.Fatal(err)
		}
		gone := !strings.Contains(string(prom), `dlfs_cluster_members{state="dead"}`) &&
			!strings.Contains(string(prom), `dlfs_cluster_members{state="left"}`)
		if len(st.Cluster.Members) == 1 && st.Cluster.Members[0].Name == "a" && gone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b is still in a's view: %+v\n%s", st.Cluster.Members, prom)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCatalogTempsRemovedAtStart: the temporary file of a catalog save
// that a killed daemon left in the SSD cache directory is gone once the
// next mount has started (finding of issue 27: it stayed for ever,
// outside --ssd-cache-size).
func TestCatalogTempsRemovedAtStart(t *testing.T) {
	src := conformance.OddTree(t, t.TempDir())
	ssd := filepath.Join(t.TempDir(), "ssd")
	if err := os.MkdirAll(ssd, 0o700); err != nil {
		t.Fatal(err)
	}
	left := filepath.Join(ssd, ".catalog-2718281828")
	if err := os.WriteFile(left, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, src, func(c *Config) { c.SSDDir = ssd })
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("the killed daemon's temporary file is still there after the mount started: %v", err)
	}
}

// TestBatchersOfGoneMembersStop: when placement changes, the batchers of
// peers no longer placed stop, and what waits on them fails at once; the
// others stay. A node that outlives many members holds batchers for the
// current ones only.
func TestBatchersOfGoneMembersStop(t *testing.T) {
	n := &Node{stop: make(chan struct{})}
	defer func() { close(n.stop); n.wg.Wait() }()
	n.placement = new(placement.Table)
	n.placed = []cluster.Member{{Name: "p", Meta: cluster.Meta{DataAddr: "127.0.0.1:1"}}, {Name: "q", Meta: cluster.Meta{DataAddr: "127.0.0.1:2"}}}
	p := n.batcherFor("127.0.0.1:1", "p")
	q := n.batcherFor("127.0.0.1:2", "q")
	if len(n.batchers.m) != 2 {
		t.Fatalf("%d batchers for 2 members", len(n.batchers.m))
	}
	n.tableMu.Lock()
	n.placement = new(placement.Table) // q went
	n.placed = n.placed[:1]
	n.tableMu.Unlock()
	if got := n.batcherFor("127.0.0.1:1", "p"); got != p {
		t.Fatal("p's batcher was replaced although p stays")
	}
	if len(n.batchers.m) != 1 {
		t.Fatalf("%d batchers for 1 member", len(n.batchers.m))
	}
	if _, err := q.fetch(peer.Item{Path: "x"}, 1); !errors.Is(err, errPeerGone) {
		t.Fatalf("a fetch from a gone member: %v, want errPeerGone", err)
	}
}
