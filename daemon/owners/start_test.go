package owners

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/cluster/peer"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
	"github.com/dlfs/dlfs/jobs"
)

// countingCluster is a cluster of no one that counts the calls of Alive.
type countingCluster struct{ alive atomic.Int64 }

func (c *countingCluster) Alive() []cluster.Member    { c.alive.Add(1); return nil }
func (c *countingCluster) Subscribe() <-chan struct{} { return make(chan struct{}) }
func (c *countingCluster) StartMeta() cluster.Meta    { return cluster.Meta{} }
func (c *countingCluster) SetMeta(cluster.Meta) error { return nil }

// countingJobs is a registry of no jobs that counts the calls of All.
type countingJobs struct{ all atomic.Int64 }

func (j *countingJobs) All() []*jobs.Job                           { j.all.Add(1); return nil }
func (j *countingJobs) Subscribe() <-chan struct{}                 { return make(chan struct{}) }
func (j *countingJobs) Index(control.Job) ([]folder.Sample, error) { return nil, nil }
func (j *countingJobs) MaxPositions() int64                        { return 0 }
func (j *countingJobs) Relayout()                                  {}

// noPeers reaches no one.
type noPeers struct{}

func (noPeers) Fetch(context.Context, string, []peer.Item) ([]peer.Result, error) {
	return nil, context.Canceled
}
func (noPeers) FetchCached(context.Context, string, []peer.Item) ([]peer.Result, error) {
	return nil, context.Canceled
}
func (noPeers) Connect(context.Context, string) error  { return context.Canceled }
func (noPeers) Reachability(string) (peer.Reach, bool) { return peer.Reach{}, false }
func (noPeers) Close()                                 {}

type flatModel struct{}

func (flatModel) Estimate(string, int64) time.Duration { return time.Millisecond }

// TestStartAfterNew: New starts no goroutine (the daemon makes the policy
// before the loader that its watcher may read a job's list through):
// each of them asks the cluster or the jobs first thing, and none has
// once Close has waited for them all. Start starts them; Close stops
// them; Start after Close starts none.
func TestStartAfterNew(t *testing.T) {
	newOwners := func() (*Owners, *countingCluster, *countingJobs) {
		t.Helper()
		c, j := &countingCluster{}, &countingJobs{}
		o, err := New(Config{NodeName: "a", Dataset: "d"}, Deps{Cluster: c, Jobs: j, Peers: noPeers{}, Model: flatModel{},
			Snapshot: func() *catalog.Snapshot { return &catalog.Snapshot{} }, Tag: func(*catalog.Entry, string) uint64 { return 0 }, BlockSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		return o, c, j
	}

	o, c, j := newOwners()
	o.Close()
	if c.alive.Load() != 0 || j.all.Load() != 0 {
		t.Errorf("goroutines ran without Start: %d calls of Alive, %d of All", c.alive.Load(), j.all.Load())
	}
	o.Start() // after Close: nothing starts (Close has run; a goroutine would never be waited for)

	o, c, j = newOwners()
	o.Start()
	o.Start() // once only
	for deadline := time.Now().Add(10 * time.Second); c.alive.Load() < 2 || j.all.Load() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Start started nothing: %d calls of Alive, %d of All", c.alive.Load(), j.all.Load())
		}
	}
	o.Close()
}
