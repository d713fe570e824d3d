package prefetch

import (
	"sync/atomic"
	"testing"

	"github.com/dlfs/dlfs/backing"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/ramcache"
)

// The backing files a stage keeps beside staged files (AdoptBacking): the
// staging bound counts them, the stage releases every one it lets go of,
// and hands one out only for the version it was built from.

// stagedWhole stages file a (three 10-byte blocks, tagged 7) and builds
// its backing file, whose descriptor's close sets closed. The builder's
// reference to it is released at cleanup (a no-op once it is closed).
func stagedWhole(t *testing.T) (*Stage, *catalog.Entry, *backing.File, *atomic.Bool) {
	t.Helper()
	a, _ := stageFiles(t)
	st := NewStage()
	var blocks []ramcache.Block
	for i := int64(0); i < 3; i++ {
		d := make([]byte, 10)
		d[0] = byte(i)
		b := ramcache.Block{ID: a.Ino, Tag: 7, Sum: integrity.Sum(7, d), Data: d}
		if !st.add(loader.BlockKey(a.Path(), i), b) {
			t.Fatalf("block %d not staged", i)
		}
		blocks = append(blocks, b)
	}
	f, err := backing.Build(a.Path(), 30, 10, func(i int64) (backing.Block, bool) {
		return backing.Block{Data: blocks[i].Data, Tag: blocks[i].Tag, Sum: blocks[i].Sum}, true
	})
	if err != nil {
		t.Fatal(err)
	}
	closed := new(atomic.Bool)
	if !f.OnClose(func() { closed.Store(true) }) {
		t.Fatal("a new backing file is closed")
	}
	t.Cleanup(f.Release)
	return st, a, f, closed
}

// adopt is AdoptBacking of f for a's three blocks under bound.
func adopt(st *Stage, a *catalog.Entry, f *backing.File, bound int64) bool {
	return st.AdoptBacking(a.Ino, 3, loader.BlockKey(a.Path(), 0), 7, f, bound)
}

// A backing file is kept only if it fits under the staging bound beside
// what the stage holds, and only for a file all of whose blocks are
// staged.
func TestAdoptBackingWithinTheBound(t *testing.T) {
	st, a, f, _ := stagedWhole(t)
	held := st.held() // the three blocks
	if st.AdoptBacking(a.Ino, 4, loader.BlockKey(a.Path(), 0), 7, f, 1<<20) {
		t.Error("a backing file kept for a file not all of whose blocks are staged")
	}
	if st.AdoptBacking(a.Ino, 3, loader.BlockKey(a.Path(), 0), 8, f, 1<<20) {
		t.Error("a backing file kept for another version of the file")
	}
	if adopt(st, a, f, held+f.Size()-1) {
		t.Fatalf("a backing file of %d bytes kept beside %d staged under a bound of %d", f.Size(), held, held+f.Size()-1)
	}
	if st.BackedFiles() != 0 || st.held() != held {
		t.Fatalf("a refused backing file changed the stage: %d kept, %d held", st.BackedFiles(), st.held())
	}
	if !adopt(st, a, f, held+f.Size()) {
		t.Fatal("a backing file that fits the bound exactly was refused")
	}
	if st.BackedFiles() != 1 || st.held() != held+f.Size() {
		t.Errorf("after adopting: %d kept, %d held, want 1 and %d", st.BackedFiles(), st.held(), held+f.Size())
	}
	if err := st.checkInvariant(); err != nil {
		t.Error(err)
	}
}

// Backing hands out the kept file only for the version it was built from
// (its first block's tag), with a reference of the caller's own.
func TestStageBackingOfItsVersion(t *testing.T) {
	st, a, f, _ := stagedWhole(t)
	if !adopt(st, a, f, 1<<20) {
		t.Fatal("not adopted")
	}
	if g := st.Backing(a.Ino, loader.BlockKey(a.Path(), 0), 8); g != nil {
		g.Release()
		t.Error("the backing file handed out for another version")
	}
	g := st.Backing(a.Ino, loader.BlockKey(a.Path(), 0), 7)
	if g != f {
		t.Fatalf("Backing of the file's own version: %v", g)
	}
	g.Release()
}

// The stage releases the backing file it kept once the file's blocks
// leave it, whichever way they go (taken, served, dropped, the stage
// closed): with the builder's reference gone too, the file is closed.
func TestStageReleasesBackingItLetsGo(t *testing.T) {
	for _, tc := range []struct {
		name  string
		leave func(st *Stage, a *catalog.Entry)
	}{
		{"taken", func(st *Stage, a *catalog.Entry) {
			for i := int64(0); i < 3; i++ {
				st.Take(loader.BlockKey(a.Path(), i), 7, true)
			}
		}},
		{"served", func(st *Stage, a *catalog.Entry) {
			for i := int64(0); i < 3; i++ {
				st.Serve(loader.BlockKey(a.Path(), i), 7, 0, -1)
			}
		}},
		{"another version read", func(st *Stage, a *catalog.Entry) {
			for i := int64(0); i < 3; i++ {
				st.Take(loader.BlockKey(a.Path(), i), 8, false)
			}
		}},
		{"removed", func(st *Stage, a *catalog.Entry) { st.removeFile(a, 10) }},
		{"dropped", func(st *Stage, a *catalog.Entry) { st.dropIf(func(ramcache.Block) bool { return true }) }},
		{"the stage closed", func(st *Stage, a *catalog.Entry) { st.clear() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, a, f, closed := stagedWhole(t)
			if !adopt(st, a, f, 1<<20) {
				t.Fatal("not adopted")
			}
			f.Release() // the builder's reference: the stage's alone is left
			if closed.Load() {
				t.Fatal("the backing file closed while the stage keeps it")
			}
			tc.leave(st, a)
			if st.BackedFiles() != 0 || st.stagedBytes() != 0 {
				t.Errorf("%d backing files, %d bytes left on the stage", st.BackedFiles(), st.stagedBytes())
			}
			if !closed.Load() {
				t.Error("the stage let go of its backing file without releasing it: its descriptor stays open")
			}
			if err := st.checkInvariant(); err != nil {
				t.Error(err)
			}
		})
	}
}

// A block of a file with a backing file, read again onto the stage after
// a reader took it off, counts as that file's again: what the stage holds
// with no backing file beside it (unbacked) does not grow.
func TestStagedAgainBesideItsBackingFile(t *testing.T) {
	st, a, f, _ := stagedWhole(t)
	if !adopt(st, a, f, 1<<20) {
		t.Fatal("not adopted")
	}
	key := loader.BlockKey(a.Path(), 0)
	b, ok := st.Take(key, 7, true)
	if !ok || st.BackedFiles() != 1 {
		t.Fatalf("block 0 taken: %v, %d backing files kept", ok, st.BackedFiles())
	}
	if !st.add(key, b) {
		t.Fatal("block 0 not staged again")
	}
	if n := st.unbacked(); n != 0 {
		t.Errorf("%d bytes staged with no backing file beside them, want none", n)
	}
	if err := st.checkInvariant(); err != nil {
		t.Error(err)
	}
}

// A read's part of a staged block counts only the pages it covers whole:
// one starting inside a page does not count that page.
func TestServeCountsWholePagesOnly(t *testing.T) {
	st := NewStage()
	st.add("k", ramcache.Block{ID: 7, Data: make([]byte, 2*servedPage), Tag: 9})
	if _, ok, gone := st.Serve("k", 9, 100, -1); !ok || gone {
		t.Fatalf("a read from byte 100 to the end: ok %v, gone %v; want the block kept (its first page was read in part)", ok, gone)
	}
	if _, ok, gone := st.Serve("k", 9, 0, servedPage); !ok || !gone {
		t.Errorf("the first page read whole: ok %v, gone %v; want the block gone", ok, gone)
	}
}

// Hold stages a block a plan needs only while it fits the staging bound.
func TestHoldWithinTheBound(t *testing.T) {
	st := NewStage()
	p, reg, fl := setup(t, 6, "job=j root=data seed=3 epoch=0 world=2 rank=1 lookahead=1", Config{Workers: 2, Staging: 1 << 10, Stage: st})
	j := reg.Get("j")
	order := j.Order(1, 0)
	waitFor(t, "the epoch to be staged", func() bool { return fl.total.Load() == int64(len(order)) })
	e := j.Samples[order[0]].Entry
	key := loader.BlockKey(e.Path(), 0)
	if _, ok := st.Take(key, 0, true); !ok {
		t.Fatalf("%s was not staged", e.Path())
	}
	st.Hold(key, ramcache.Block{ID: e.Ino, Data: make([]byte, 1<<10)}) // needed, but past the bound
	if st.has(e.Ino) || st.stagedBytes() > p.cfg.Staging {
		t.Errorf("a block past the staging bound was held: %d bytes staged of %d", st.stagedBytes(), p.cfg.Staging)
	}
}
