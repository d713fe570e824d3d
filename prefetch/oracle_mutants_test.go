package prefetch

import (
	"testing"

	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/loader"
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
	waitFor(t, "both local ranks planned", func() bool {
		set := p.oracle.set.Load()
		return set != nil && len(set.streams) == 2 && len(set.others) == 1 && p.NextUse(e.Ino) == int64(k)
	})
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

// TestLargeSampleWaitsForABlockOfRoom: a sample larger than the stage
// that comes when the stage has less than a block of room waits for
// room; its head is staged once the reader frees some, not fetched as an
// empty head and passed by.
func TestLargeSampleWaitsForABlockOfRoom(t *testing.T) {
	const stage, block = 64 << 10, 16 << 10
	reg := sizedSamples(t, 60000, 1<<20)
	fl := &fakeLoader{fetches: map[string]int{}, blockSize: block}
	p := New(Config{Workers: 1, Staging: stage, BlockSize: block}, fl, reg)
	t.Cleanup(func() { checkInvariant(t, p) })
	t.Cleanup(p.Close)
	cmds, _ := control.Parse([]byte("job=j root=data sampler=sequential epoch=0 lookahead=1"))
	if err := reg.Apply(cmds[0].(control.Job)); err != nil {
		t.Fatal(err)
	}
	j := reg.Get("j")
	first, big := j.Samples[j.Order(0, 0)[0]].Entry, j.Samples[j.Order(0, 0)[1]].Entry
	if first.Size != 60000 || big.Size != 1<<20 {
		t.Fatalf("samples of %d and %d bytes, want 60000 and 1 MiB", first.Size, big.Size)
	}
	waitFor(t, "the first sample staged", func() bool { return p.stage.stagedBytes() == first.Size })
	p.ObserveRead(0, true, first, 0, 0)
	for i := int64(0); i < loader.Blocks(first.Size, block); i++ {
		p.Take(loader.BlockKey(first.Path(), i), 0, true)
	}
	waitFor(t, "the large sample's head staged", func() bool { return p.stage.has(big.Ino) })
}

// TestSkippedSampleWastedBytes: a staged sample its reader never reads
// (the page cache served it) is dropped once the cursor is well past it,
// and counted as wasted, in samples and in bytes.
func TestSkippedSampleWastedBytes(t *testing.T) {
	const files, size = 60, 10
	p, reg, fl := setupSized(t, files, func(int) int { return size }, "job=j root=data sampler=sequential epoch=0 lookahead=1",
		Config{Workers: 2, Staging: 1 << 20}, &fakeLoader{fetches: map[string]int{}})
	waitFor(t, "the epoch staged", func() bool { return fl.total.Load() == files })
	j := reg.Get("j")
	order := j.Order(0, 0)
	for _, i := range order[1:] { // all but the first, in order
		e := j.Samples[i].Entry
		p.ObserveRead(0, true, e, 0, 0)
		p.Take(loader.BlockKey(e.Path(), 0), 0, true)
	}
	waitFor(t, "the skipped sample dropped", func() bool { tot, _ := p.Stats(); return tot.Wasted > 0 })
	if tot, _ := p.Stats(); tot.WastedBytes != tot.Wasted*size {
		t.Errorf("%d samples wasted, %d bytes; want %d bytes each", tot.Wasted, tot.WastedBytes, size)
	}
}

// TestReplanTrimKeepsTwiceTheStage: after a plan change the stage keeps
// what the new order reads within twice the staging bound of its cursor
// (RAM has changed since the prefetcher passed them) and drops the rest.
func TestReplanTrimKeepsTwiceTheStage(t *testing.T) {
	const staging = 40 // samples of one byte
	fl := &fakeLoader{fetches: map[string]int{}}
	p, reg, _ := setupWith(t, 100, "job=j root=data seed=3 epoch=0 lookahead=1", Config{Workers: 4, Staging: staging}, fl)
	waitFor(t, "the stage to fill", func() bool { return fl.total.Load() == staging })
	was := p.stage.files()
	cmds, err := control.Parse([]byte("job=j root=data seed=3 epoch=5 lookahead=1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Apply(cmds[0].(control.Job)); err != nil {
		t.Fatal(err)
	}
	j := reg.Get("j")
	pos := map[uint64]int{}
	for k, i := range j.Order(0, 5) {
		if ino := j.Samples[i].Entry.Ino; was[ino] {
			if _, seen := pos[ino]; !seen {
				pos[ino] = k
			}
		}
	}
	var near, far []uint64 // staged before, read within twice the bound and past it
	for ino, k := range pos {
		switch {
		case k >= staging && k < 2*staging:
			near = append(near, ino)
		case k >= 2*staging:
			far = append(far, ino)
		}
	}
	if len(near) == 0 || len(far) == 0 {
		t.Fatalf("%d staged samples within twice the bound and %d past it in the new order; the test wants some of each", len(near), len(far))
	}
	waitFor(t, "the samples past twice the bound dropped", func() bool {
		for _, ino := range far {
			if p.stage.has(ino) {
				return false
			}
		}
		return true
	})
	for _, ino := range near {
		if !p.stage.has(ino) {
			t.Errorf("sample %d, at position %d of the new order (within twice the bound of %d), was dropped", ino, pos[ino], staging)
		}
	}
}
