package prefetch

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/ramcache"
)

// stageFiles returns two files of a catalog: a, of three 10-byte blocks,
// and b, of one.
func stageFiles(t *testing.T) (a, b *catalog.Entry) {
	t.Helper()
	root := t.TempDir()
	for name, size := range map[string]int{"a": 30, "b": 10} {
		if err := os.WriteFile(filepath.Join(root, name), make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cat, err := catalog.Open(context.Background(), catalog.DefaultConfig(root))
	if err != nil {
		t.Fatal(err)
	}
	a, b = cat.Snapshot().Lookup("a"), cat.Snapshot().Lookup("b")
	if a == nil || b == nil {
		t.Fatal("the files are not in the catalog")
	}
	return a, b
}

// TestStage: the stage's bookkeeping holds through adding, taking,
// removing a file, dropping, reserving and pushing; what it reports
// follows.
func TestStage(t *testing.T) {
	a, b := stageFiles(t)
	st := NewStage()
	check := func(what string) {
		t.Helper()
		if err := st.checkInvariant(); err != nil {
			t.Fatalf("after %s: INVARIANT broken: %v", what, err)
		}
	}
	block := func(e *catalog.Entry, n int) ramcache.Block {
		return ramcache.Block{ID: e.Ino, Tag: 7, Data: make([]byte, n)}
	}
	key := func(e *catalog.Entry, i int64) string { return loader.BlockKey(e.Path(), i) }
	for i := int64(0); i < 3; i++ {
		if !st.add(key(a, i), block(a, 10)) {
			t.Fatalf("block %d of a not added", i)
		}
	}
	if st.add(key(a, 0), block(a, 10)) {
		t.Error("a block staged twice")
	}
	st.add(key(b, 0), block(b, 10))
	check("adding")
	if got := st.stagedBytes(); got != 40 {
		t.Errorf("staged %d bytes, want 40", got)
	}
	if _, ok := st.Take(key(a, 0), 7, false); !ok || !st.has(a.Ino) {
		t.Error("a read not done took a block off the stage, or found none")
	}
	if _, ok := st.Take(key(a, 0), 8, false); ok || len(st.blocks) != 3 {
		t.Error("a stale block was served, or left on the stage")
	}
	if _, ok := st.Take(key(a, 1), 7, true); !ok {
		t.Error("a staged block was not served")
	}
	check("taking")
	if got := st.removeFile(a, 10); len(got) != 1 || got[0].key != key(a, 2) || st.has(a.Ino) {
		t.Errorf("removing a gave %v; a still staged: %v", got, st.has(a.Ino))
	}
	check("removing a file")
	st.add(key(a, 0), block(a, 10))
	if got := st.dropIf(func(bl ramcache.Block) bool { return bl.ID == b.Ino }); len(got) != 1 || st.has(b.Ino) || !st.has(a.Ino) {
		t.Errorf("dropping b gave %v", got)
	}
	check("dropping")
	st.reserve(b.Ino, 10)
	if !st.busy(b.Ino) || st.reserved(b.Ino) != 10 || st.held() != 20 {
		t.Errorf("a reservation: busy %v, reserved %d, held %d", st.busy(b.Ino), st.reserved(b.Ino), st.held())
	}
	st.release(b.Ino)
	check("a fetch")
	st.reservePush(b.Ino, 10)
	if !st.pushBusy(b.Ino) || st.wasPushed(b.Ino) {
		t.Error("a push under way not seen, or seen as done")
	}
	st.pushDone(b.Ino)
	st.markPushed(b.Ino, 10)
	if !st.wasPushed(b.Ino) || st.held() != 20 {
		t.Errorf("a push: pushed %v, held %d", st.wasPushed(b.Ino), st.held())
	}
	check("a push")
	st.dropPushedIf(func(uint64) bool { return true })
	if st.wasPushed(b.Ino) || st.held() != 10 {
		t.Errorf("after dropping the pushes: pushed %v, held %d", st.wasPushed(b.Ino), st.held())
	}
	st.clear()
	check("clearing")
	if f := st.figures(); f != (stageFigures{}) {
		t.Errorf("a cleared stage: %+v", f)
	}
}

// TestStageCheckInvariant: checkInvariant finds each miscount.
func TestStageCheckInvariant(t *testing.T) {
	a, _ := stageFiles(t)
	for name, spoil := range map[string]func(st *Stage){
		"bytes":         func(st *Stage) { st.bytes++ },
		"blocks a file": func(st *Stage) { st.perIno[a.Ino]++ },
		"a file gone":   func(st *Stage) { delete(st.perIno, a.Ino) },
		"inflight":      func(st *Stage) { st.inflight[a.Ino]++ },
		"negative":      func(st *Stage) { st.inflight[a.Ino], st.inflightBytes = -1, -1 },
		"pushed":        func(st *Stage) { st.pushedBytes++ },
		"empty block":   func(st *Stage) { st.blocks["x"] = ramcache.Block{ID: a.Ino}; st.perIno[a.Ino]++ },
	} {
		t.Run(name, func(t *testing.T) {
			st := NewStage()
			st.add(loader.BlockKey(a.Path(), 0), ramcache.Block{ID: a.Ino, Data: make([]byte, 10)})
			st.reserve(a.Ino, 20)
			st.markPushed(a.Ino, 10)
			if err := st.checkInvariant(); err != nil {
				t.Fatalf("before: %v", err)
			}
			spoil(st)
			if err := st.checkInvariant(); err == nil {
				t.Error("not found")
			}
		})
	}
}

// TestStageHold: a stage made before its Prefetcher (as the daemon makes
// it, for the loader) holds nothing until New adopts it; then it holds a
// block that a plan needs, and not one that no plan does.
func TestStageHold(t *testing.T) {
	st := NewStage()
	st.Hold("early", ramcache.Block{ID: 1, Data: make([]byte, 1)})
	if st.stagedBytes() != 0 {
		t.Fatal("a stage no prefetcher adopted held a block")
	}
	p, reg, fl := setup(t, 6, "job=j root=data seed=3 epoch=0 world=2 rank=1 lookahead=1", Config{Workers: 2, Staging: 1 << 20, Stage: st})
	if p.stage != st {
		t.Fatal("New did not adopt the stage it was given")
	}
	j := reg.Get("j")
	order := j.Order(1, 0)
	waitFor(t, "the epoch to be staged", func() bool { return fl.total.Load() == int64(len(order)) })
	e := j.Samples[order[0]].Entry
	key := loader.BlockKey(e.Path(), 0)
	b, ok := st.Take(key, 0, true)
	if !ok {
		t.Fatalf("%s was not staged", e.Path())
	}
	st.Hold(key, b) // taken, not yet read: the plan still needs it
	if !st.has(e.Ino) {
		t.Error("a block the plan needs was not held")
	}
	st.Hold("unplanned", ramcache.Block{ID: 1 << 60, Data: make([]byte, 1)})
	if st.has(1 << 60) {
		t.Error("a block no plan needs was held")
	}
}

// TestServeOutOfOrder: a staged block leaves the stage once reads have
// read every page of it, in any order: the read that reaches its end may
// come first (the kernel sends a file's READs out of order), and a read
// that covers a page only in part does not count it.
func TestServeOutOfOrder(t *testing.T) {
	st := NewStage()
	const n = 1<<20 + 100
	b := ramcache.Block{ID: 7, Data: make([]byte, n), Tag: 9}
	st.add("k", b)
	serve := func(lo, hi int, wantGone bool) {
		t.Helper()
		got, ok, gone := st.Serve("k", 9, lo, hi)
		if !ok || len(got.Data) != n || gone != wantGone {
			t.Fatalf("Serve(%d, %d): ok %v, gone %v; want the block, gone %v", lo, hi, ok, gone, wantGone)
		}
	}
	serve(896<<10, -1, false) // the end first
	serve(0, 512<<10, false)
	serve(512<<10, 896<<10-1, false) // one byte short of a page: not counted
	serve(512<<10, 896<<10, true)
	if _, ok, _ := st.Serve("k", 9, 0, -1); ok || st.stagedBytes() != 0 {
		t.Fatal("the block is still staged after every page was read")
	}
	if err := st.checkInvariant(); err != nil {
		t.Fatal(err)
	}
	st.add("k", b)
	if _, ok, gone := st.Serve("k", 10, 0, 4096); ok || !gone || st.stagedBytes() != 0 {
		t.Fatal("a block of another version was served, or kept")
	}
}
