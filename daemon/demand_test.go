package daemon

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/test/datagen"
)

// TestDemandPlacement: two nodes each run one rank of a job; both gossip
// it, compute the same table, and place samples on their most frequent
// reader: far more planned reads are local than hashing gives. A new
// epoch does not move samples (the window starts at the first epoch);
// with hashing asked for, the jobs are ignored.
func TestDemandPlacement(t *testing.T) {
	src := t.TempDir()
	if _, err := datagen.ImageFolder(filepath.Join(src, "train"), datagen.Spec{Classes: 4, Files: 400, MeanSize: 100, Seed: 2}); err != nil {
		t.Fatal(err)
	}
	a, mntA, b, mntB := startPair(t, src)
	nodes, mnts := []*Node{a, b}, []string{mntA, mntB}
	announce := func(epoch int) {
		for r, mnt := range mnts {
			line := []byte("job=j root=train seed=5 world=2 rank=" + string(rune('0'+r)) + " epoch=" + string(rune('0'+epoch)) + "\n")
			if err := os.WriteFile(filepath.Join(mnt, ".dlfs/control"), line, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	announce(0)
	// waitPlan polls until both nodes place by the two ranks' plans.
	waitPlan := func() []PlacementStats {
		deadline := time.Now().Add(20 * time.Second)
		for {
			var ps []PlacementStats
			for _, mnt := range mnts {
				var st Stats
				readJSON(t, filepath.Join(mnt, ".dlfs/stats"), &st)
				p := st.Cluster.Placement
				p.MovedSamples, p.MovedTotal = 0, 0 // each node's own history
				ps = append(ps, p)
			}
			// 400 samples, 2 ranks of 200 reads each per epoch, 4 epochs.
			if ps[0] == ps[1] && ps[0].PlannedSamples == 400 && ps[0].PlannedReads == 1600 {
				return ps
			}
			if time.Now().After(deadline) {
				t.Fatalf("placement never settled: %+v", ps)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ps := waitPlan()
	// Hashing makes half the reads local; demand over 4 epochs about 0.69.
	if ps[0].Mode != "demand" || ps[0].LocalReads < 0.62 {
		t.Errorf("placement %+v: want demand with local reads well above hashing's 0.5", ps[0])
	}
	owners := func() map[string]string {
		out := map[string]string{}
		for i, n := range nodes {
			tab := n.cluster.owners.View().Table()
			n.cat.Snapshot().Walk(func(e *catalog.Entry) {
				if e.IsRegular() {
					o := tab.Members()[tab.Owner(e.Path())].Name
					if i == 0 {
						out[e.Path()] = o
					} else if out[e.Path()] != o {
						t.Fatalf("%s: node a says %s owns it, node b %s", e.Path(), out[e.Path()], o)
					}
				}
			})
		}
		return out
	}
	before := owners()
	announce(1)
	announce(2)
	waitPlan()
	after := owners()
	for p, o := range before {
		if after[p] != o {
			t.Fatalf("%s moved from %s to %s when the epoch advanced", p, o, after[p])
		}
	}
}
