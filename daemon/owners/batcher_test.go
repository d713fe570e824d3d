package owners

import (
	"errors"
	"testing"

	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/peer"
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
	if _, err := q.fetch(peer.Item{Path: "x"}, 1); !errors.Is(err, errPeerGone) {
		t.Fatalf("a fetch from a gone member: %v, want errPeerGone", err)
	}
}
