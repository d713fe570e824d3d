package loader

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/perfmodel"
	"github.com/dlfs/dlfs/ramcache"
)

// TestOrder: the chain of sources for each case the choice of source
// handles.
func TestOrder(t *testing.T) {
	const ms = time.Millisecond
	never := time.Duration(1<<63 - 1)
	down := perfmodel.Unreachable
	ssd := link{kind: fromSSD}
	pfs := link{kind: fromPFS}
	peer := func(p string) link { return link{kind: fromOwner, peer: p} }
	prev := func(p string) link { return link{kind: fromPrevious, peer: p} }
	for _, c := range []struct {
		name string
		c    choice
		want []link
	}{
		{"PFS only", choice{est: map[string]time.Duration{"pfs": ms}}, []link{pfs}},
		{"SSD only", choice{ssd: true, est: map[string]time.Duration{"ssd": 50 * ms, "pfs": ms}}, []link{ssd, pfs}},
		{"SSD skipped after a failure", choice{ssd: true, est: map[string]time.Duration{"ssd": down, "pfs": ms}}, []link{pfs, ssd}},
		{"owner peer", choice{owner: "b", est: map[string]time.Duration{"peer:b": 2 * ms, "pfs": ms}}, []link{peer("b"), pfs}},
		{"SSD and owner, fastest first", choice{ssd: true, owner: "b",
			est: map[string]time.Duration{"ssd": 3 * ms, "peer:b": 2 * ms, "pfs": ms}}, []link{peer("b"), ssd, pfs}},
		{"equal estimates keep the SSD first", choice{ssd: true, owner: "b",
			est: map[string]time.Duration{"ssd": ms, "peer:b": ms, "pfs": ms}}, []link{ssd, peer("b"), pfs}},
		{"a peer asks: never another peer", choice{ssd: true, owner: "b", why: forPeer,
			est: map[string]time.Duration{"ssd": ms, "peer:b": ms, "pfs": ms}}, []link{ssd, pfs}},
		{"unreachable owner after the PFS", choice{owner: "b",
			est: map[string]time.Duration{"peer:b": down, "pfs": ms}}, []link{pfs, peer("b")}},
		{"previous owner probed before the PFS", choice{ssd: true, owner: "b", previous: "c",
			est: map[string]time.Duration{"ssd": ms, "peer:b": ms, "peer:c": ms, "pfs": ms}}, []link{ssd, peer("b"), prev("c"), pfs}},
		{"previous owner, a peer asks", choice{owner: "b", previous: "c", why: forPeer,
			est: map[string]time.Duration{"peer:b": ms, "peer:c": ms, "pfs": ms}}, []link{prev("c"), pfs}},
		{"previous owner that is the owner", choice{owner: "b", previous: "b",
			est: map[string]time.Duration{"peer:b": ms, "pfs": ms}}, []link{peer("b"), pfs}},
		{"previous owner is the owner, a peer asks", choice{owner: "b", previous: "b", why: forPeer,
			est: map[string]time.Duration{"peer:b": ms, "pfs": ms}}, []link{prev("b"), pfs}},
		{"unreachable previous owner", choice{previous: "c",
			est: map[string]time.Duration{"peer:c": down, "pfs": ms}}, []link{pfs}},
		{"slow copy, no margin", choice{owner: "b",
			est: map[string]time.Duration{"peer:b": 50 * ms, "pfs": ms}}, []link{peer("b"), pfs}},
		{"margin excludes a slow copy", choice{owner: "b", margin: 8,
			est:   map[string]time.Duration{"peer:b": 50 * ms, "pfs": ms},
			since: map[string]time.Duration{"peer:b": 0}}, []link{pfs, peer("b")}},
		{"margin keeps a copy within it", choice{owner: "b", margin: 8,
			est: map[string]time.Duration{"peer:b": 5 * ms, "pfs": ms}}, []link{peer("b"), pfs}},
		{"margin leaves a prefetch waiting for the copy", choice{owner: "b", margin: 8, why: forPrefetch,
			est: map[string]time.Duration{"peer:b": 50 * ms, "pfs": ms}}, []link{peer("b"), pfs}},
		{"margin: the previous owner still before the PFS", choice{owner: "b", previous: "c", margin: 8,
			est:   map[string]time.Duration{"peer:b": 50 * ms, "peer:c": ms, "pfs": ms},
			since: map[string]time.Duration{"peer:b": 0}}, []link{prev("c"), pfs, peer("b")}},
		{"slow copy unmeasured for a while probed before the PFS", choice{ssd: true, owner: "b", margin: 8,
			est:   map[string]time.Duration{"ssd": 20 * ms, "peer:b": 50 * ms, "pfs": ms},
			since: map[string]time.Duration{"ssd": 0, "peer:b": 2 * time.Second}}, []link{peer("b"), pfs, ssd}},
		{"only the first unmeasured copy is probed", choice{ssd: true, owner: "b", margin: 8,
			est:   map[string]time.Duration{"ssd": 20 * ms, "peer:b": 50 * ms, "pfs": ms},
			since: map[string]time.Duration{"ssd": never, "peer:b": never}}, []link{ssd, pfs, peer("b")}},
		{"probed copy goes after the previous owner", choice{owner: "b", previous: "c", margin: 8,
			est:   map[string]time.Duration{"peer:b": 50 * ms, "peer:c": ms, "pfs": ms},
			since: map[string]time.Duration{"peer:b": never}}, []link{peer("b"), prev("c"), pfs}},
		{"unreachable copy never probed", choice{owner: "b", margin: 8,
			est:   map[string]time.Duration{"peer:b": down, "pfs": ms},
			since: map[string]time.Duration{"peer:b": never}}, []link{pfs, peer("b")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := order(c.c); !reflect.DeepEqual(got, c.want) {
				t.Errorf("order = %v, want %v", got, c.want)
			}
		})
	}
}

// waitingRemote is a fakeRemote whose fetches, from owner or from
// previous's caches, wait for release or for their ctx.
type waitingRemote struct {
	*fakeRemote
	owner, previous string
	release         chan struct{}
	inside          atomic.Int64
}

func (r *waitingRemote) Owner(*catalog.Entry) (string, bool)    { return r.owner, r.owner != "" }
func (r *waitingRemote) Previous(*catalog.Entry) (string, bool) { return r.previous, r.previous != "" }

func (r *waitingRemote) wait(ctx context.Context) error {
	r.inside.Add(1)
	select {
	case <-r.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *waitingRemote) Fetch(ctx context.Context, peer string, e *catalog.Entry, i int64) ([]byte, uint32, error) {
	if err := r.wait(ctx); err != nil {
		return nil, 0, err
	}
	return r.fakeRemote.Fetch(ctx, peer, e, i)
}

func (r *waitingRemote) FetchCached(ctx context.Context, peer string, e *catalog.Entry, i int64) ([]byte, uint32, error) {
	if err := r.wait(ctx); err != nil {
		return nil, 0, err
	}
	return r.fakeRemote.Fetch(ctx, peer, e, i)
}

// TestReadCancelledWhileWaiting: a reader whose ctx is cancelled while it
// waits on a slow source gets ctx's error at once, and the chain tries no
// source after it: not the PFS after a peer, not a copy after the PFS. A
// peer the reader gave up on is not skipped for it.
func TestReadCancelledWhileWaiting(t *testing.T) {
	files := map[string][]byte{"f": data(1000), "g": data(1000)}
	type setup struct {
		l       *Loader
		waiting func() bool // the read waits on the slow source
		release func()
		after   func(t *testing.T) // checks once the read returned
	}
	for _, c := range []struct {
		name string
		make func(t *testing.T) setup
	}{
		{"owner peer", func(t *testing.T) setup {
			pfs := &fakePFS{files: files}
			r := &waitingRemote{fakeRemote: &fakeRemote{files: files, bs: 1 << 20}, owner: "b", release: make(chan struct{})}
			cfg := DefaultConfig()
			cfg.Remote = r
			l := New(cfg, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
			return setup{l, func() bool { return r.inside.Load() == 1 }, func() { close(r.release) }, func(t *testing.T) {
				if n := pfs.reads.Load(); n != 0 {
					t.Errorf("%d PFS reads after the reader gave up on the peer", n)
				}
				if l.Stats().Sources["peer:b"].Skipped {
					t.Error("the peer was skipped because its reader gave up")
				}
			}}
		}},
		{"previous owner's caches", func(t *testing.T) setup {
			pfs := &fakePFS{files: files}
			r := &waitingRemote{fakeRemote: &fakeRemote{files: files, bs: 1 << 20}, previous: "c", release: make(chan struct{})}
			cfg := DefaultConfig()
			cfg.Remote = r
			l := New(cfg, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
			return setup{l, func() bool { return r.inside.Load() == 1 }, func() { close(r.release) }, func(t *testing.T) {
				if n := pfs.reads.Load(); n != 0 {
					t.Errorf("%d PFS reads after the reader gave up on the previous owner", n)
				}
				if l.Stats().Sources["peer:c"].Skipped {
					t.Error("the previous owner was skipped because its reader gave up")
				}
			}}
		}},
		{"PFS, a slow copy after it", func(t *testing.T) setup {
			pfs := newHungPFS(files)
			m := perfmodel.New(perfmodel.DefaultConfig())
			for i := range 30 {
				m.Observe("peer:b", 1000+int64(i), 50*time.Millisecond)
				m.Observe("pfs", 1000+int64(i), time.Millisecond)
			}
			r := &fakeRemote{files: files, bs: 1 << 20}
			l := New(Config{Model: m, PFSMargin: 8, PFSTimeout: time.Hour, Remote: r}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
			return setup{l, func() bool { return pfs.inside.Load() == 1 }, func() { close(pfs.release) }, func(t *testing.T) {
				if n := r.fetches.Load(); n != 0 {
					t.Errorf("%d peer fetches after the reader gave up on the PFS", n)
				}
			}}
		}},
		{"busy packed container", func(t *testing.T) setup {
			pfs := &fakePacked{fakePFS: &fakePFS{files: files, gate: make(chan struct{})}, order: []string{"g", "f"}}
			l := New(Config{DemandPerContainer: 1}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
			blocker := make(chan error, 1)
			go func() { // holds the container's one slot
				_, err := l.ReadAt(context.Background(), entry("g", 1000), make([]byte, 1000), 0)
				blocker <- err
			}()
			waitFor(t, "the blocker to reach the PFS", func() bool { return pfs.reads.Load() == 1 })
			release := sync.OnceFunc(func() { close(pfs.gate) })
			return setup{l, func() bool { return l.waiting("shard") == 1 }, release, func(t *testing.T) {
				if n := l.waiting("shard"); n != 0 {
					t.Errorf("%d reads wait on the container after the reader gave up", n)
				}
				release()
				if err := <-blocker; err != nil {
					t.Errorf("the read holding the slot: %v", err)
				}
				if n := pfs.reads.Load() + pfs.runs.Load(); n != 1 {
					t.Errorf("%d reads of the PFS, want the blocker's alone", n)
				}
			}}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := c.make(t)
			defer s.l.Close()
			release := sync.OnceFunc(s.release)
			defer release()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := s.l.ReadAt(ctx, entry("f", 1000), make([]byte, 1000), 0)
				done <- err
			}()
			waitFor(t, "the read to wait on the slow source", s.waiting)
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("the cancelled read: %v, want context.Canceled", err)
				}
			case <-time.After(10 * time.Second):
				release()
				t.Fatal("the read still waits 10 s after its ctx was cancelled")
			}
			s.after(t)
		})
	}
}
