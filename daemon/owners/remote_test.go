package owners

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/cluster/peer"
	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/perfmodel"
	"github.com/dlfs/dlfs/placement"
)

// The read policy against a real peer server on loopback (package
// cluster/peer, TLS and all), serving multi-block files: the tests of the
// remote reader that single-block files cannot tell apart from a bug.

const (
	testDataset = integrity.Dataset(0x5eed)
	testBlock   = 4 << 10 // the policy's block size in these tests
)

// blockServer is a peer's Source over the files of a catalog, whose
// bytes content makes: it serves a block only under the tag the asker
// should have for it (its path, its block number, its version), as a
// real node does, and records what it was asked.
type blockServer struct {
	snap    *catalog.Snapshot
	block   int64
	cached  map[string]bool // paths its caches hold, for Cached
	missing map[string]bool // paths it answers StatusMissing for

	mu       sync.Mutex
	requests [][]peer.Item // every request, in the order sent
	hold     chan struct{} // if not nil, every request waits for it to close
}

// content is byte j of file p.
func content(p string, j int64) byte { return byte(int64(len(p))*31 + j*7 + j>>8) }

func (s *blockServer) serve(it peer.Item, cached bool) ([]byte, uint32, byte) {
	e := s.snap.Lookup(it.Path)
	if e == nil || s.missing[it.Path] || cached && !s.cached[it.Path] {
		return nil, 0, peer.StatusMissing
	}
	tag := loader.BlockTag(testDataset, e, loader.BlockKey(it.Path, it.Block))
	if it.Tag != tag || it.Block < 0 || it.Block*s.block >= e.Size {
		return nil, 0, peer.StatusMissing // another block's tag, or no such block
	}
	data := make([]byte, min(s.block, e.Size-it.Block*s.block))
	for j := range data {
		data[j] = content(it.Path, it.Block*s.block+int64(j))
	}
	return data, integrity.Sum(tag, data), peer.StatusOK
}

func (s *blockServer) Block(it peer.Item) ([]byte, uint32, byte)  { return s.serve(it, false) }
func (s *blockServer) Cached(it peer.Item) ([]byte, uint32, byte) { return s.serve(it, true) }

// recordingClient is the real client, which records each request whole
// in the server's log (the server calls its Source once per item) and
// holds it while the server's hold is set.
type recordingClient struct {
	*peer.Client
	srv   *blockServer
	calls atomic.Int64

	mu        sync.Mutex
	connected map[string]int // Connect calls by address
}

func (c *recordingClient) Connect(ctx context.Context, addr string) error {
	c.mu.Lock()
	if c.connected == nil {
		c.connected = map[string]int{}
	}
	c.connected[addr]++
	c.mu.Unlock()
	return c.Client.Connect(ctx, addr)
}

func (c *recordingClient) connects(addr string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.connected[addr]
}

func (c *recordingClient) Fetch(ctx context.Context, addr string, items []peer.Item) ([]peer.Result, error) {
	c.calls.Add(1)
	c.srv.mu.Lock()
	c.srv.requests = append(c.srv.requests, append([]peer.Item(nil), items...))
	hold := c.srv.hold
	c.srv.mu.Unlock()
	if hold != nil {
		<-hold
		// Held, its deadline ran on: the test is about batching, not a
		// slow peer.
		ctx = context.WithoutCancel(ctx)
	}
	return c.Client.Fetch(ctx, addr, items)
}

// switchModel is a performance model whose estimate for the peer the
// test sets: perfmodel.Unreachable once it failed.
type switchModel struct{ unreachable atomic.Bool }

func (m *switchModel) Estimate(source string, n int64) time.Duration {
	if m.unreachable.Load() && source == "peer:p" {
		return perfmodel.Unreachable
	}
	return time.Millisecond
}

// remoteFixture is this node, "me", and a peer, "p", serving the same
// catalog of multi-block files over a real peer server.
type remoteFixture struct {
	o       *Owners
	snap    *catalog.Snapshot
	srv     *blockServer
	client  *recordingClient
	model   *switchModel
	cluster *staticCluster
	addr    string
	files   []*catalog.Entry
}

// newRemote starts the fixture: files of 3.5 blocks of testBlock bytes
// (the last short), and the policy's watcher, waited for until it has a
// table.
func newRemote(t *testing.T, files int) *remoteFixture { return newRemoteBlocks(t, files, testBlock) }

// newRemoteBlocks is newRemote with blocks of block bytes.
func newRemoteBlocks(t *testing.T, files int, block int64) *remoteFixture {
	t.Helper()
	list := make(listed, files)
	for i := range list {
		list[i] = catalog.File{Path: fmt.Sprintf("train/c%d/%04d.jpg", i%4, i), Mode: syscall.S_IFREG | 0o644, Size: 3*block + block/2 + int64(i%3), Mtime: int64(1 + i), Ino: uint64(1 + i)}
	}
	cfg := catalog.DefaultConfig(t.TempDir())
	cfg.Lister = list
	cat, err := catalog.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &remoteFixture{snap: cat.Snapshot(), model: &switchModel{}, cluster: &staticCluster{}}
	f.srv = &blockServer{snap: f.snap, block: block, cached: map[string]bool{}, missing: map[string]bool{}}
	key := []byte("owners-remote-test-key-0123456789")
	srv, err := peer.Listen("127.0.0.1:0", key, f.srv, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	f.addr = srv.Addr()
	cl, err := peer.NewClient(key)
	if err != nil {
		t.Fatal(err)
	}
	f.client = &recordingClient{Client: cl, srv: f.srv}
	f.cluster.set(remoteMembers(f.addr, "me", "p"))
	f.o, err = New(Config{NodeName: "me", Dataset: testDataset.String()}, Deps{Cluster: f.cluster, Jobs: &countingJobs{}, Peers: f.client, Model: f.model,
		Snapshot: cat.Snapshot, Tag: func(e *catalog.Entry, key string) uint64 { return loader.BlockTag(testDataset, e, key) }, BlockSize: block})
	if err != nil {
		t.Fatal(err)
	}
	f.o.Start()
	t.Cleanup(f.o.Close)
	for deadline := time.Now().Add(10 * time.Second); f.o.View().Table() == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no table after 10 s")
		}
	}
	f.snap.Walk(func(e *catalog.Entry) {
		if e.IsRegular() {
			f.files = append(f.files, e)
		}
	})
	return f
}

// remoteMembers are members of the test dataset; each but "me" serves at
// addr ("me" at a port nothing listens on: it must never be asked).
func remoteMembers(addr string, names ...string) []cluster.Member {
	ms := make([]cluster.Member, len(names))
	for i, n := range names {
		a := addr
		if n == "me" {
			a = "127.0.0.1:1"
		}
		ms[i] = cluster.Member{Name: n, Meta: cluster.Meta{DataAddr: a, Dataset: testDataset.String(), Placement: placement.HashVersion, RAM: 1 << 30}}
	}
	return ms
}

// ownedBy returns the fixture's files the table gives to name.
func (f *remoteFixture) ownedBy(name string) []*catalog.Entry {
	var out []*catalog.Entry
	for _, e := range f.files {
		if f.o.View().OwnerName(e.Path()) == name {
			out = append(out, e)
		}
	}
	return out
}

// want is block i of e as its owner has it, in testBlock blocks.
func want(e *catalog.Entry, i int64) []byte {
	b := make([]byte, min(testBlock, e.Size-i*testBlock))
	for j := range b {
		b[j] = content(e.Path(), i*testBlock+int64(j))
	}
	return b
}

// checkBlock fails unless data and sum are block i of e.
func checkBlock(t *testing.T, e *catalog.Entry, i int64, data []byte, sum uint32) {
	t.Helper()
	tag := loader.BlockTag(testDataset, e, loader.BlockKey(e.Path(), i))
	if string(data) != string(want(e, i)) || !integrity.Check(tag, sum, data) {
		t.Fatalf("%s block %d: %d bytes, sum ok %v; want its %d bytes", e.Path(), i, len(data), integrity.Check(tag, sum, data), len(want(e, i)))
	}
}

// TestOwnerNeverThisNode: the policy names another member as the owner
// of the files the table gives it, and no owner for this node's own (it
// reads those itself: asking itself would wait on its own fetch).
func TestOwnerNeverThisNode(t *testing.T) {
	f := newRemote(t, 80)
	mine, theirs := f.ownedBy("me"), f.ownedBy("p")
	if len(mine) == 0 || len(theirs) == 0 {
		t.Fatalf("the table gives me %d files and p %d: want some each", len(mine), len(theirs))
	}
	for _, e := range mine {
		if name, ok := f.o.Owner(e); ok {
			t.Fatalf("%s is this node's, and Owner names %q", e.Path(), name)
		}
	}
	for _, e := range theirs {
		if name, ok := f.o.Owner(e); !ok || name != "p" {
			t.Fatalf("%s is p's, and Owner says %q, %v", e.Path(), name, ok)
		}
	}
	// The prober keeps a connection to p, and never dials this node.
	for deadline := time.Now().Add(10 * time.Second); f.client.connects(f.addr) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("p's data address was never probed")
		}
	}
	if n := f.client.connects("127.0.0.1:1"); n != 0 {
		t.Errorf("this node's own data address probed %d times", n)
	}
	// A member without a data address owns nothing to read from, is no
	// previous owner to ask, and gets no request.
	ms := remoteMembers(f.addr, "me", "p")
	ms[1].Meta.DataAddr = ""
	f.cluster.set(ms)
	f.o.CatalogChanged() // the watcher rebuilds
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if v := f.o.View(); len(v.Members()) == 2 && v.Members()[1].Meta.DataAddr == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the view never dropped p's data address")
		}
	}
	for _, e := range theirs {
		if name, ok := f.o.Owner(e); ok {
			t.Fatalf("%s: Owner names %q, which has no data address", e.Path(), name)
		}
		if name, ok := f.o.Previous(e); ok {
			t.Fatalf("%s: Previous names %q, which has no data address", e.Path(), name)
		}
	}
	if _, _, err := f.o.Fetch(context.Background(), "p", theirs[0], 0); err == nil || f.client.calls.Load() != 0 {
		t.Errorf("a fetch from p without a data address: %v, %d requests sent", err, f.client.calls.Load())
	}
}

// TestFetchEveryBlock: every block of multi-block files comes from the
// peer as its own bytes, under its own tag (the peer answers a block
// asked for under another block's tag StatusMissing), the short last
// block included, whether asked one at a time or all at once (batched:
// each reader gets its own block's answer).
func TestFetchEveryBlock(t *testing.T) {
	f := newRemote(t, 40)
	theirs := f.ownedBy("p")
	if len(theirs) < 4 {
		t.Fatalf("p owns %d files; want a few", len(theirs))
	}
	ctx := context.Background()
	e := theirs[0]
	for i := int64(0); i*testBlock < e.Size; i++ {
		data, sum, err := f.o.Fetch(ctx, "p", e, i)
		if err != nil {
			t.Fatalf("%s block %d: %v", e.Path(), i, err)
		}
		checkBlock(t, e, i, data, sum)
	}
	// All at once: they travel in batches, each answer to its reader.
	type got struct {
		e    *catalog.Entry
		i    int64
		data []byte
		sum  uint32
		err  error
	}
	var wg sync.WaitGroup
	out := make(chan got, 4*len(theirs))
	for _, e := range theirs {
		for i := int64(0); i*testBlock < e.Size; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				data, sum, err := f.o.Fetch(ctx, "p", e, i)
				out <- got{e, i, data, sum, err}
			}()
		}
	}
	wg.Wait()
	close(out)
	n := 0
	for g := range out {
		if g.err != nil {
			t.Fatalf("%s block %d: %v", g.e.Path(), g.i, g.err)
		}
		checkBlock(t, g.e, g.i, g.data, g.sum)
		n++
	}
	if n != 4*len(theirs) {
		t.Fatalf("%d blocks fetched, want %d", n, 4*len(theirs))
	}
}

// TestBatchLimits: blocks queued for one peer while its requests are out
// go in batches of at most maxBatch items and maxBatchBytes of blocks,
// and every one is answered.
func TestBatchLimits(t *testing.T) {
	for _, c := range []struct {
		name   string
		blocks int   // blocks asked for at once
		size   int64 // the block size
	}{
		{"many small blocks", 3 * maxBatch, testBlock},
		{"large blocks", 48, 1 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newRemoteBlocks(t, 160, c.size)
			theirs := f.ownedBy("p")
			hold := make(chan struct{}) // requests wait: the rest queue behind them
			var release sync.Once
			f.srv.mu.Lock()
			f.srv.hold = hold
			f.srv.mu.Unlock()
			t.Cleanup(func() { release.Do(func() { close(hold) }) }) // before Close, which waits for them

			var wg sync.WaitGroup
			errs := make(chan error, c.blocks)
			for k := range c.blocks {
				e, i := theirs[k%len(theirs)], int64(k/len(theirs))%3
				wg.Add(1)
				go func() {
					defer wg.Done()
					data, sum, err := f.o.Fetch(context.Background(), "p", e, i)
					if err != nil {
						errs <- fmt.Errorf("%s block %d: %w", e.Path(), i, err)
						return
					}
					if tag := loader.BlockTag(testDataset, e, loader.BlockKey(e.Path(), i)); !integrity.Check(tag, sum, data) || int64(len(data)) != c.size {
						errs <- fmt.Errorf("%s block %d: %d bytes, not the block", e.Path(), i, len(data))
					}
				}()
			}
			// Every request sent waits, and every other block is in the
			// queue or in the one batch taken from it.
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
				f.o.batchMu.Lock()
				b := f.o.batchers.m[f.addr]
				f.o.batchMu.Unlock()
				f.srv.mu.Lock()
				reqs, sent := len(f.srv.requests), 0
				for _, r := range f.srv.requests {
					sent += len(r)
				}
				f.srv.mu.Unlock()
				if b != nil && sent+len(b.q) >= c.blocks-min(maxBatch, int(maxBatchBytes/c.size)) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the blocks were never queued: %d requests of %d blocks", reqs, sent)
				}
			}
			f.srv.mu.Lock()
			f.srv.hold = nil
			f.srv.mu.Unlock()
			release.Do(func() { close(hold) })
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			f.srv.mu.Lock()
			defer f.srv.mu.Unlock()
			sent := 0
			for _, r := range f.srv.requests {
				bytes := int64(len(r)) * c.size // blocks 0 to 2: whole
				if len(r) > maxBatch || bytes > maxBatchBytes {
					t.Errorf("a request of %d blocks, %d bytes: over %d blocks or %d bytes", len(r), bytes, maxBatch, maxBatchBytes)
				}
				sent += len(r)
			}
			if sent != c.blocks {
				t.Errorf("%d blocks in %d requests, want %d", sent, len(f.srv.requests), c.blocks)
			}
		})
	}
}

// TestMissingIsNoData: a block the owner answers StatusMissing for (it
// has another version, or not the file) is an error the loader knows
// (loader.ErrNoBlock: read it elsewhere), never data, from the owner and
// from a previous owner's caches alike.
func TestMissingIsNoData(t *testing.T) {
	f := newRemote(t, 40)
	e := f.ownedBy("p")[0]
	f.srv.missing[e.Path()] = true
	data, _, err := f.o.Fetch(context.Background(), "p", e, 1)
	if !errors.Is(err, loader.ErrNoBlock) || data != nil {
		t.Errorf("Fetch of a block p has not: %d bytes, error %v; want loader.ErrNoBlock", len(data), err)
	}
	data, _, err = f.o.FetchCached(context.Background(), "p", e, 1)
	if !errors.Is(err, loader.ErrNoBlock) || data != nil {
		t.Errorf("FetchCached of a block p has not: %d bytes, error %v; want loader.ErrNoBlock", len(data), err)
	}
	// Cached, it comes: block 2 of another file.
	e = f.ownedBy("p")[1]
	f.srv.cached[e.Path()] = true
	data, sum, err := f.o.FetchCached(context.Background(), "p", e, 2)
	if err != nil {
		t.Fatalf("FetchCached of a block p caches: %v", err)
	}
	checkBlock(t, e, 2, data, sum)
}

// TestSkippedPeerGetsNoBatch: blocks queued for a peer the model has
// since marked unreachable (a request to it failed) fail at once with
// errPeerSkipped, and no request goes to it.
func TestSkippedPeerGetsNoBatch(t *testing.T) {
	f := newRemote(t, 40)
	e := f.ownedBy("p")[0]
	f.model.unreachable.Store(true)
	data, _, err := f.o.Fetch(context.Background(), "p", e, 0)
	if !errors.Is(err, errPeerSkipped) || data != nil {
		t.Errorf("a fetch from a skipped peer: %d bytes, %v; want errPeerSkipped", len(data), err)
	}
	if n := f.client.calls.Load(); n != 0 {
		t.Errorf("%d requests went to a skipped peer", n)
	}
	f.model.unreachable.Store(false)
	data, sum, err := f.o.Fetch(context.Background(), "p", e, 3)
	if err != nil {
		t.Fatalf("once reachable again: %v", err)
	}
	checkBlock(t, e, 3, data, sum)
	if n := f.client.calls.Load(); n != 1 || f.o.Requests() < 1 {
		t.Errorf("%d requests sent (policy counts %d), want 1", n, f.o.Requests())
	}
	// A name that is not a member is refused without a request.
	if _, _, err := f.o.Fetch(context.Background(), "stranger", e, 0); err == nil || f.client.calls.Load() != 1 {
		t.Errorf("a fetch from a non-member: %v, %d requests in all", err, f.client.calls.Load())
	}
}

// TestPreviousOwner: after a change, a sample's previous owner is the
// one to ask for what it may still cache: never this node, never a
// member gone, and, for a node that has just joined, the owner among the
// others. Its cached blocks come back whole.
func TestPreviousOwner(t *testing.T) {
	f := newRemote(t, 120)
	before := map[string]string{}
	for _, e := range f.files {
		before[e.Path()] = f.o.View().OwnerName(e.Path())
	}
	// q joins: a new table, the old one kept as the previous.
	f.cluster.set(remoteMembers(f.addr, "me", "p", "q"))
	f.o.CatalogChanged()
	for deadline := time.Now().Add(10 * time.Second); len(f.o.View().Members()) != 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("q never placed")
		}
	}
	var fromP, fromMe int
	for _, e := range f.files {
		name, ok := f.o.Previous(e)
		switch b := before[e.Path()]; {
		case b == "me":
			// This node owned it before the change: it may hold it itself;
			// the others' owner (by hash over the others) is who else may.
			others := f.o.View()
			if w := others.othersMembers[others.Others().Owner(e.Path())].Name; !ok || name != w {
				t.Fatalf("%s was this node's: Previous says %q, %v; want the others' owner %s", e.Path(), name, ok, w)
			}
			fromMe++
		case b == "p":
			if !ok || name != "p" {
				t.Fatalf("%s was p's: Previous says %q, %v", e.Path(), name, ok)
			}
			fromP++
		}
	}
	if fromP == 0 || fromMe == 0 {
		t.Fatalf("%d files were p's before, %d this node's: want some each", fromP, fromMe)
	}
	// FetchCached from the previous owner.
	var e *catalog.Entry
	for _, x := range f.files {
		if before[x.Path()] == "p" {
			e = x
			break
		}
	}
	f.srv.cached[e.Path()] = true
	data, sum, err := f.o.FetchCached(context.Background(), "p", e, 3)
	if err != nil {
		t.Fatal(err)
	}
	checkBlock(t, e, 3, data, sum)
	// p goes: it is no one's previous owner any more.
	f.cluster.set(remoteMembers(f.addr, "me", "q"))
	f.o.CatalogChanged()
	for deadline := time.Now().Add(10 * time.Second); len(f.o.View().Members()) != 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("p never dropped")
		}
	}
	for _, x := range f.files {
		if name, ok := f.o.Previous(x); ok && (name == "p" || name == "me") {
			t.Fatalf("%s: Previous names %q after p left", x.Path(), name)
		}
	}
	// q goes too: this node alone has no one to ask, itself least.
	f.cluster.set(remoteMembers(f.addr, "me"))
	f.o.CatalogChanged()
	for deadline := time.Now().Add(10 * time.Second); len(f.o.View().Members()) != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("q never dropped")
		}
	}
	for _, x := range f.files {
		if name, ok := f.o.Previous(x); ok {
			t.Fatalf("%s: Previous names %q with no other member", x.Path(), name)
		}
	}
}
