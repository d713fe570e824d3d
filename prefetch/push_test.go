package prefetch

import (
	"errors"
	"math"
	"sync"
	"testing"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
)

// fakePusher stands in for the kernel's page cache: it records what was
// pushed, and refuses everything while fail is set.
type fakePusher struct {
	mu     sync.Mutex
	pushed map[uint64]int
	fail   bool
	cached bool // every file is in the page cache already: pushes store nothing (and count as asked)
}

func (f *fakePusher) Push(e *catalog.Entry, bs int64, block func(int64) ([]byte, bool)) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return 0, errors.New("refused")
	}
	if f.cached {
		f.pushed[e.Ino]++
		return 0, nil
	}
	b, ok := block(0)
	if !ok || int64(len(b)) != e.Size {
		return 0, errors.New("no bytes")
	}
	f.pushed[e.Ino]++
	return e.Size, nil
}

func (f *fakePusher) has(ino uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pushed[ino] > 0
}

// A reader that reaches dlfs only for the samples not pushed (the page
// cache serves the rest) still moves the pushes along, through the whole
// epoch: every sample but one in pushTrip is pushed, in order, and no trip
// sample before its read, not even for its occurrence in the next epoch;
// the stage and what was pushed ahead never exceed Staging.
func TestPushAheadOfAPageCacheReader(t *testing.T) {
	const files, staging = 400, 300 // files of 1 byte: the window reaches into epoch 1
	fp := &fakePusher{pushed: map[uint64]int{}}
	p, reg, _ := setup(t, files, "job=j root=data seed=3 epoch=0 batch=4 workers=1 lookahead=2", Config{Workers: 2, Staging: staging, Pusher: fp})
	p.StartPushing()
	j := reg.Get("j")
	order := j.Order(0, 0)
	stats := func() Stats { _, per := p.Stats(); return per["j"]["rank-0"] }
	waitFor(t, "the stream", func() bool { return stats().Predicted == files })
	var s *stream
	p.mu.Lock()
	s = p.streams[0]
	p.mu.Unlock()

	reads := 0
	for step := 0; step < files; step++ {
		pos := s.order.at(step)
		e := j.Samples[order[pos]].Entry
		if step%pushTrip == pushTrip-1 {
			if fp.has(e.Ino) {
				t.Fatalf("step %d: a trip sample was pushed", step)
			}
			p.ObserveRead(0, true, e, 0, 0) // a read through dlfs
			reads++
		} else {
			waitFor(t, "the push of step "+e.Path(), func() bool { return fp.has(e.Ino) })
		}
		tot, _ := p.Stats()
		if held := tot.PushedHeld + tot.StagedBytes; held > staging {
			t.Fatalf("step %d: %d bytes pushed ahead and %d staged, beyond staging %d", step, tot.PushedHeld, tot.StagedBytes, staging)
		}
	}
	tot, _ := p.Stats()
	// Epoch 1 (lookahead 2) may have begun: its pushes come on top.
	if want := int64(files - files/pushTrip); tot.Pushed < want {
		t.Errorf("pushed %d samples, want at least %d", tot.Pushed, want)
	}
	if reads != files/pushTrip {
		t.Errorf("%d reads reached dlfs, want %d", reads, files/pushTrip)
	}
}

// A pushed sample leaves the stage; a refused push leaves it there for
// the read, and is counted.
func TestPushRefused(t *testing.T) {
	fp := &fakePusher{pushed: map[uint64]int{}, fail: true}
	p, _, _ := setup(t, 50, "job=j root=data seed=3 epoch=0 batch=4 workers=1", Config{Workers: 2, Staging: 1 << 20, Pusher: fp})
	waitFor(t, "the stage", func() bool { tot, _ := p.Stats(); return tot.StagedBlocks == 50 })
	if tot, _ := p.Stats(); tot.PushFailed != 0 {
		t.Fatalf("%d pushes before StartPushing", tot.PushFailed)
	}
	p.StartPushing()
	waitFor(t, "the refusals", func() bool { tot, _ := p.Stats(); return tot.PushFailed >= 48 })
	if tot, _ := p.Stats(); tot.StagedBlocks != 50 || tot.Pushed != 0 || tot.PushedHeld != 0 {
		t.Fatalf("after refused pushes: %+v", tot)
	}
}

// A plan change keeps counting the pushes of a stream that kept its plan,
// and stops counting those a new plan has not reached.
func TestPushedAcrossPlanChanges(t *testing.T) {
	fp := &fakePusher{pushed: map[uint64]int{}}
	p, reg, _ := setup(t, 100, "job=j root=data seed=3 epoch=0 batch=4 workers=1", Config{Workers: 2, Staging: 1 << 20, Pusher: fp})
	p.StartPushing()
	held := func() int64 { tot, _ := p.Stats(); return tot.PushedHeld }
	waitFor(t, "the pushes", func() bool { return held() >= 100-100/pushTrip })
	fp.mu.Lock()
	fp.fail = true // nothing new is pushed: what is counted below was pushed for j
	fp.mu.Unlock()
	waitFor(t, "the pushes under way", func() bool { return p.stage.pushes() == 0 })
	checkInvariant(t, p)
	before := held()
	announce := func(line string) {
		cmds, err := control.Parse([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		if err := reg.Apply(cmds[0].(control.Job)); err != nil {
			t.Fatal(err)
		}
	}
	p.mu.Lock()
	kept := p.streams[0]
	p.mu.Unlock()
	announce("job=k root=data seed=4 epoch=0 batch=4 workers=1") // j keeps its plan
	waitFor(t, "the second job's stream", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return len(p.streams) == 2 })
	p.mu.Lock()
	same := p.streams[0] == kept || p.streams[1] == kept
	p.mu.Unlock()
	if !same {
		t.Fatal("job j's stream was rebuilt")
	}
	if h := held(); h != before {
		t.Errorf("after another job was announced: %d bytes pushed ahead counted, want %d", h, before)
	}
	checkInvariant(t, p)
	for _, name := range []string{"j", "k"} {
		if err := reg.End(name); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the pushes no plan needs to be let go", func() bool { return held() == 0 })
	checkInvariant(t, p)
}

// A trip sample of one rank is not pushed for another rank (which reads
// it in a later epoch), or that rank's trip read would be a page-cache
// hit and its cursor would never move.
func TestTripNotPushedForAnotherRank(t *testing.T) {
	const files = 256
	fp := &fakePusher{pushed: map[uint64]int{}}
	p, reg, _ := setup(t, files, "job=j root=data seed=3 epoch=0 world=2 ranks=0,1 batch=4 workers=1 lookahead=2", Config{Workers: 2, Staging: 1 << 20, Pusher: fp})
	p.StartPushing()
	// Every stream fetched and considered pushing each of its positions,
	// both epochs, and no push is under way.
	waitFor(t, "the pushes", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, s := range p.streams {
			if s.frontier < s.len() || s.pushStep < s.frontier {
				return false
			}
		}
		return len(p.streams) == 2 && p.stage.pushes() == 0
	})
	j := reg.Get("j")
	p.mu.Lock()
	streams := append([]*stream(nil), p.streams...)
	p.mu.Unlock()
	if len(streams) != 2 {
		t.Fatalf("%d streams, want 2", len(streams))
	}
	trips := 0
	for _, s := range streams {
		order := j.Order(s.id.rank, 0)
		for step := pushTrip - 1; step < len(order); step += pushTrip {
			e := j.Samples[order[s.order.at(step)]].Entry
			trips++
			if fp.has(e.Ino) {
				t.Errorf("rank %d: the trip sample at step %d (%s) was pushed", s.id.rank, step, e.Path())
			}
		}
	}
	if trips == 0 {
		t.Fatal("no trips checked")
	}
}

// Only samples of one block are pushed: a larger one is read from the
// stage (see Pushing).
func TestPushOnlyOneBlock(t *testing.T) {
	const files = 40
	size := func(i int) int { return 1 + 2*(i%2) } // 1 or 3 bytes
	fp := &fakePusher{pushed: map[uint64]int{}}
	p, reg, _ := setupSized(t, files, size, "job=j root=data seed=3 epoch=0 batch=4 workers=1",
		Config{Workers: 2, Staging: 1 << 20, BlockSize: 2, Pusher: fp}, &fakeLoader{fetches: map[string]int{}})
	p.StartPushing()
	j := reg.Get("j")
	order := j.Order(0, 0)
	var s *stream
	waitFor(t, "the stream", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.streams) > 0 {
			s = p.streams[0]
		}
		return s != nil
	})
	var small, large []*catalog.Entry
	for step := range files {
		e := j.Samples[order[s.order.at(step)]].Entry
		switch {
		case e.Size > 2:
			large = append(large, e)
		case step%pushTrip != pushTrip-1:
			small = append(small, e)
		}
	}
	for _, e := range small {
		waitFor(t, "the push of "+e.Path(), func() bool { return fp.has(e.Ino) })
	}
	for _, e := range large {
		if fp.has(e.Ino) {
			t.Errorf("%s, of %d bytes in blocks of 2, was pushed", e.Path(), e.Size)
		}
	}
}

// Over a packed dataset, a sample pushed into the page cache and not yet
// read is not joined to a later run as a neighbour: fetched again, its
// read (a page-cache hit) would never reach dlfs, and the copy would be
// dropped unread. No sample is fetched after its push. (A neighbour the
// stage has no room for when its run arrives, because fetches scheduled
// after the run took it, may be fetched twice: the loader offers it to
// RAM, which this test does not have.)
func TestPushedNotFetchedAgain(t *testing.T) {
	const files, staging = 400, 300
	fp := &fakePusher{pushed: map[uint64]int{}}
	var afterPush sync.Map // paths fetched after their push
	fl := &fakeLoader{fetches: map[string]int{}, packed: true, onFetch: func(e *catalog.Entry) {
		if fp.has(e.Ino) {
			afterPush.Store(e.Path(), true)
		}
	}}
	p, reg, _ := setupWith(t, files, "job=j root=data seed=3 epoch=0 batch=4 workers=1 lookahead=1",
		Config{Workers: 2, Staging: staging, Pusher: fp}, fl)
	p.StartPushing()
	j := reg.Get("j")
	order := j.Order(0, 0)
	waitFor(t, "the stream", func() bool { _, per := p.Stats(); return per["j"]["rank-0"].Predicted == files })
	p.mu.Lock()
	s := p.streams[0]
	p.mu.Unlock()
	for step := 0; step < files; step++ {
		e := j.Samples[order[s.order.at(step)]].Entry
		if step%pushTrip == pushTrip-1 {
			waitFor(t, "the fetch of "+e.Path(), func() bool {
				fl.mu.Lock()
				defer fl.mu.Unlock()
				return fl.fetches[e.Path()] > 0
			})
			p.ObserveRead(0, true, e, 0, 0) // a read through dlfs
		} else {
			waitFor(t, "the push of "+e.Path(), func() bool { return fp.has(e.Ino) })
		}
	}
	afterPush.Range(func(path, _ any) bool {
		t.Errorf("%s fetched again after its push", path)
		return true
	})
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if len(fl.runs) == 0 {
		t.Error("no coalesced reads: the test shows nothing")
	}
}

// A sample pushed into the page cache is next needed by dlfs after the
// read the push serves: NextUse skips that read (its copy in RAM is a
// spare until then), and counts it again once the read is behind the
// cursor. A sample not pushed counts from its read.
func TestPushedNextUseSkipsItsRead(t *testing.T) {
	const files = 40
	fp := &fakePusher{pushed: map[uint64]int{}}
	// One epoch in the window: a pushed sample has no later use.
	p, reg, _ := setup(t, files, "job=j root=data seed=3 epoch=0 batch=4 workers=1 lookahead=1", Config{Workers: 2, Staging: 1 << 20, Pusher: fp})
	j := reg.Get("j")
	order := j.Order(0, 0)
	at := func(k int) *catalog.Entry { return j.Samples[order[k]].Entry }
	waitFor(t, "the stage", func() bool { tot, _ := p.Stats(); return tot.StagedBlocks == files })
	if d := p.NextUse(at(5).Ino); d != 5 {
		t.Fatalf("NextUse of the 6th sample before pushing = %d, want 5", d)
	}
	p.StartPushing()
	waitFor(t, "the push of the 6th sample", func() bool { return fp.has(at(5).Ino) })
	if d := p.NextUse(at(5).Ino); d != math.MaxInt64 {
		t.Errorf("NextUse of the pushed 6th sample = %d, want none (the push serves its only read)", d)
	}
	// The trip sample (pushTrip-1) is never pushed: its read reaches dlfs.
	if trip := at(pushTrip - 1); fp.has(trip.Ino) {
		t.Fatal("the trip sample was pushed")
	} else if d := p.NextUse(trip.Ino); d != pushTrip-1 {
		t.Errorf("NextUse of the trip sample = %d, want %d", d, pushTrip-1)
	}
}

// A file a push found whole in the page cache is not asked about again
// (a warm epoch opens no file through the mount) until a read of it
// reaches dlfs; then it is.
func TestPageCachedNotAskedAgain(t *testing.T) {
	const files = 40
	fp := &fakePusher{pushed: map[uint64]int{}, cached: true}
	p, reg, _ := setup(t, files, "job=j root=data seed=3 epoch=0 batch=4 workers=1", Config{Workers: 2, Staging: 1 << 20, Pusher: fp})
	p.StartPushing()
	settled := func(what string, epoch int) {
		waitFor(t, what, func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			if len(p.streams) != 1 {
				return false
			}
			s := p.streams[0]
			return s.epochs[0] == epoch && s.frontier == s.len() && s.pushStep >= s.frontier && p.stage.pushes() == 0
		})
	}
	asked := func(ino uint64) int {
		fp.mu.Lock()
		defer fp.mu.Unlock()
		return fp.pushed[ino]
	}
	settled("epoch 0's pushes", 0)
	j := reg.Get("j")
	before := map[uint64]int{}
	for _, i := range j.Order(0, 0) {
		e := j.Samples[i].Entry
		if want := 1 - b2i(isTrip(p, e.Ino)); asked(e.Ino) != want {
			t.Fatalf("epoch 0: %s asked about %d times, want %d", e.Path(), asked(e.Ino), want)
		}
		before[e.Ino] = asked(e.Ino)
	}
	read := j.Samples[j.Order(0, 0)[0]].Entry
	p.ObserveRead(0, true, read, 0, 0) // a read through dlfs: the page cache lost it
	cmds, err := control.Parse([]byte("job=j root=data seed=3 epoch=1 batch=4 workers=1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Apply(cmds[0].(control.Job)); err != nil {
		t.Fatal(err)
	}
	settled("epoch 1's pushes", 1)
	again := 0
	for _, i := range j.Order(0, 1) {
		e := j.Samples[i].Entry
		// Asked again only if not known to be in the page cache: read
		// through dlfs since, or never asked (a trip of epoch 0).
		want := before[e.Ino]
		if (e.Ino == read.Ino || before[e.Ino] == 0) && !isTrip(p, e.Ino) {
			want++
		}
		if got := asked(e.Ino); got != want {
			t.Errorf("epoch 1: %s asked about %d times in all, want %d", e.Path(), got, want)
		}
		again += asked(e.Ino) - before[e.Ino]
	}
	if again == 0 {
		t.Error("no file was asked about again in epoch 1")
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// isTrip reports whether ino is a trip sample of a stream now.
func isTrip(p *Prefetcher, ino uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tripLocked(ino)
}
