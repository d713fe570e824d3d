package owners

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/cluster/peer"
	"github.com/dlfs/dlfs/placement"
)

// TestBatchersOfGoneMembersStop: when placement changes, the batchers of
// peers no longer placed stop, and what waits on them fails at once; the
// others stay. A node that outlives many members holds batchers for the
// current ones only.
func TestBatchersOfGoneMembersStop(t *testing.T) {
	o := &Owners{stop: make(chan struct{})}
	defer func() { close(o.stop); o.wg.Wait() }()
	pq := []cluster.Member{{Name: "p", Meta: cluster.Meta{DataAddr: "127.0.0.1:1"}}, {Name: "q", Meta: cluster.Meta{DataAddr: "127.0.0.1:2"}}}
	o.view.Store(&View{table: new(placement.Table), members: pq})
	p := o.batcherFor("127.0.0.1:1", "p")
	q := o.batcherFor("127.0.0.1:2", "q")
	if len(o.batchers.m) != 2 {
		t.Fatalf("%d batchers for 2 members", len(o.batchers.m))
	}
	o.view.Store(&View{table: new(placement.Table), members: pq[:1]}) // q went
	if got := o.batcherFor("127.0.0.1:1", "p"); got != p {
		t.Fatal("p's batcher was replaced although p stays")
	}
	if len(o.batchers.m) != 1 {
		t.Fatalf("%d batchers for 1 member", len(o.batchers.m))
	}
	if _, err := q.fetch(context.Background(), peer.Item{Path: "x"}, 1); !errors.Is(err, errPeerGone) {
		t.Fatalf("a fetch from a gone member: %v, want errPeerGone", err)
	}
}

// TestBatcherFetchCancelled: a reader whose ctx is done stops waiting for
// a batcher, whether its block is not queued yet or waits for its batch's
// answer.
func TestBatcherFetchCancelled(t *testing.T) {
	o := &Owners{stop: make(chan struct{})}
	defer close(o.stop)
	for _, c := range []struct {
		name  string
		queue int // room in the queue: 0, the block never goes in
	}{{"not queued", 0}, {"queued, waiting for its batch", 1}} {
		t.Run(c.name, func(t *testing.T) {
			b := &batcher{o: o, q: make(chan batchItem, c.queue), gone: make(chan struct{})} // no run: nothing answers
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := b.fetch(ctx, peer.Item{Path: "x"}, 1)
				done <- err
			}()
			if c.queue > 0 {
				for deadline := time.Now().Add(10 * time.Second); len(b.q) == 0; time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the block was never queued")
					}
				}
			}
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("a cancelled fetch: %v, want context.Canceled", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the fetch still waits 10 s after its ctx was cancelled")
			}
		})
	}
}
