package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/conformance"
)

// TestGoneMemberForgotten: a member that went leaves .dlfs/stats and
// dlfs_cluster_members once the forget time has passed (finding of issue
// 27: dead members stayed for the daemon's life).
func TestGoneMemberForgotten(t *testing.T) {
	src := conformance.OddTree(t, t.TempDir())
	a, mntA := start(t, src, func(c *Config) {
		gossipOn(c, "a")
		c.ForgetDead = 500 * time.Millisecond
	})
	b, _ := start(t, src, func(c *Config) { gossipOn(c, "b", a.cluster.gossip.Addr()) })
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
