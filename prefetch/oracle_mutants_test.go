package prefetch

import (
	"testing"

	"github.com/dlfs/dlfs/control"
)

// TestOtherNodesRankCountsWithTheFurthestBehind: a rank another node runs
// (AllRanks) counts its samples' next use from the cursor of this node's
// furthest-behind rank of the same job, not its furthest ahead: that rank
// may still read them at the same pace.
func TestOtherNodesRankCountsWithTheFurthestBehind(t *testing.T) {
	p, reg, _ := setup(t, 60, "job=j root=data seed=3 epoch=0 world=3 rank=0 lookahead=1", Config{Workers: 1, Staging: 1 << 20, AllRanks: true})
	cmds, err := control.Parse([]byte("job=j world=3 rank=1 epoch=0"))
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Apply(cmds[0].(control.Job)); err != nil {
		t.Fatal(err)
	}
	j := reg.Get("j")
	if len(j.Spec.Ranks) != 2 {
		t.Fatalf("local ranks %v, want 0 and 1", j.Spec.Ranks)
	}
	// A sample of rank 2's, far into its epoch, that neither local rank
	// reads in the epochs planned (this one and the next).
	local := map[int32]bool{}
	for _, r := range []int{0, 1} {
		for epoch := 0; epoch < 2; epoch++ {
			for _, i := range j.Order(r, epoch) {
				local[i] = true
			}
		}
	}
	other := j.Order(2, 0)
	k := len(other) - 1
	for k >= 10 && local[other[k]] {
		k--
	}
	if k < 10 {
		t.Fatal("no sample of rank 2's past position 10 that no local rank reads: pick another seed")
	}
	e := j.Samples[other[k]].Entry
	waitFor(t, "both local ranks planned", func() bool { return p.NextUse(e.Ino) == int64(k) })
	for _, i := range j.Order(0, 0)[:10] { // rank 0 reads ten samples; rank 1 none
		p.ObserveRead(0, true, j.Samples[i].Entry, 0, 0)
	}
	if got := p.NextUse(e.Ino); got != int64(k) {
		t.Errorf("NextUse of rank 2's sample at position %d = %d after rank 0 read 10 and rank 1 none; want %d", k, got, k)
	}
}

// TestPageCachedBounded: the files found whole in the page cache are
// remembered up to maxPageCached, no more.
func TestPageCachedBounded(t *testing.T) {
	st := NewStage()
	for ino := uint64(0); ino < maxPageCached+10; ino++ {
		st.markPageCached(ino)
	}
	if n := len(st.pageCached); n != maxPageCached {
		t.Errorf("%d files remembered as page-cached, want at most %d", n, maxPageCached)
	}
}
