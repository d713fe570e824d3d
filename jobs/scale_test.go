package jobs

import (
	"runtime"
	"testing"
	"time"

	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
)

// TestBalancedPlanScale plans one epoch of ImageNet-1k (1,281,167 samples)
// for 64 ranks on 16 nodes under balance=locality, and reports the time and
// the memory the plan keeps. Skipped with -short.
func TestBalancedPlanScale(t *testing.T) {
	if testing.Short() {
		t.Skip("plans 1.28 M samples")
	}
	const n, world, nodes = 1281167, 64, 16
	spec := control.DefaultJob()
	spec.World, spec.Batch, spec.Balance, spec.Ranks, spec.Lookahead = world, 32, "locality", []int{0}, 1
	j := &Job{Spec: spec, Samples: make([]folder.Sample, n), RankEpoch: map[int]int{0: 0}}
	rankNode := make([]int, world)
	for r := range rankNode {
		rankNode[r] = r % nodes
	}
	j.layout = func(*Job) Layout {
		return Layout{RankNode: rankNode, Cached: n, ID: 1, Owner: func(i int) int { return int(uint64(i)*0x9e3779b97f4a7c15>>32) % nodes }}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	st, _ := j.Plan(0)
	took := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(j)
	t.Logf("1,281,167 samples, 64 ranks on 16 nodes: planned in %v, %d MB kept, %.1f bytes per planned position; %+v",
		took, (int64(after.HeapAlloc)-int64(before.HeapAlloc))>>20, float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(st.Reads), st)
	if st.Reads != int64(n+world-n%world) || st.Local < st.Reads*9/10 {
		t.Errorf("plan %+v", st)
	}
}
