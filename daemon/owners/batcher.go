package owners

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dlfs/dlfs/cluster/peer"
	"github.com/dlfs/dlfs/perfmodel"
)

// batcher sends the blocks wanted from one peer in batches: whatever is
// queued when a request goes out travels in it (up to maxBatch items),
// without waiting for more, so batching adds no latency. Up to
// batchesInFlight requests are pipelined on the connection.
type batcher struct {
	o    *Owners
	addr string
	name string // the peer's name, its source in the model
	q    chan batchItem
	gone chan struct{} // closed when the peer is no longer placed: run ends
}

type batchItem struct {
	it    peer.Item
	size  int64 // bytes expected
	reply chan batchReply
}

type batchReply struct {
	res peer.Result
	err error
}

// A batch holds at most maxBatch items and maxBatchBytes of expected
// block bytes, well inside what a peer answers in one response
// (peer.MaxResponseBytes): 64 blocks of 1 MiB made a frame over the
// limit, so every such batch failed and its samples were read from the
// PFS.
const (
	maxBatch        = 64
	maxBatchBytes   = 16 << 20
	batchesInFlight = 8
)

// batchers are the batchers by peer data address, and the view they
// were last checked against.
type batchers struct {
	m  map[string]*batcher
	of *View
}

// errPeerGone fails the blocks queued for a peer that is no longer a
// member.
var errPeerGone = errors.New("no longer a member with a data address")

// batcherFor returns the batcher of addr, starting it on first use. Its
// goroutine is owned by the Owners and ends at Close, or once its peer
// is no longer placed: when placement changes, the batchers of the
// members gone are stopped, so they are never more than the members.
func (o *Owners) batcherFor(addr, name string) *batcher {
	v := o.view.Load()
	o.batchMu.Lock()
	defer o.batchMu.Unlock()
	if o.batchers.m == nil {
		o.batchers.m = map[string]*batcher{}
	}
	if o.batchers.of != v {
		o.batchers.of = v
		placed := map[string]bool{}
		for _, m := range v.members {
			placed[m.Meta.DataAddr] = true
		}
		for a, b := range o.batchers.m {
			if !placed[a] {
				close(b.gone)
				delete(o.batchers.m, a)
			}
		}
	}
	b := o.batchers.m[addr]
	if b == nil {
		b = &batcher{o: o, addr: addr, name: name, q: make(chan batchItem, 4*maxBatch), gone: make(chan struct{})}
		o.batchers.m[addr] = b
		o.wg.Add(1)
		go b.run()
	}
	return b
}

// fetch queues it (size bytes expected) for the next batch and waits for
// its answer, until ctx is done: a reader that gives up leaves the batch
// to the others in it (its reply has room, so the batch never waits).
func (b *batcher) fetch(ctx context.Context, it peer.Item, size int64) (peer.Result, error) {
	// A batcher already stopped takes nothing: a select with a free queue
	// slot could otherwise pick the send.
	select {
	case <-b.gone:
		return peer.Result{}, errPeerGone
	default:
	}
	reply := make(chan batchReply, 1)
	select {
	case b.q <- batchItem{it, size, reply}:
	case <-ctx.Done():
		return peer.Result{}, ctx.Err()
	case <-b.o.stop:
		return peer.Result{}, peer.ErrClosed
	case <-b.gone:
		return peer.Result{}, errPeerGone
	}
	select {
	case r := <-reply:
		return r.res, r.err
	case <-ctx.Done():
		return peer.Result{}, ctx.Err()
	case <-b.o.stop:
		return peer.Result{}, peer.ErrClosed
	case <-b.gone:
		return peer.Result{}, errPeerGone
	}
}

func (b *batcher) run() {
	defer b.o.wg.Done()
	sem := make(chan struct{}, batchesInFlight)
	var inflight sync.WaitGroup
	defer inflight.Wait()
	var carry []batchItem // taken from the queue, for the next batch
	for {
		var batch []batchItem
		if len(carry) > 0 {
			batch, carry = carry, nil
		} else {
			select {
			case <-b.o.stop:
				return
			case <-b.gone:
				return
			case first := <-b.q:
				batch = append(batch, first)
			}
		}
		bytes := batch[0].size
	more:
		for len(batch) < maxBatch {
			select {
			case it := <-b.q:
				if bytes+it.size > maxBatchBytes {
					carry = append(carry, it)
					break more
				}
				batch = append(batch, it)
				bytes += it.size
			default:
				break more
			}
		}
		select {
		case sem <- struct{}{}:
		case <-b.o.stop:
			return
		case <-b.gone:
			return
		}
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			defer func() { <-sem }()
			items := make([]peer.Item, len(batch))
			var bytes int64
			for i, bi := range batch {
				items[i] = bi.it
				bytes += bi.size
			}
			var (
				res []peer.Result
				err error
			)
			est := b.o.d.Model.Estimate("peer:"+b.name, bytes)
			if est == perfmodel.Unreachable {
				// It failed after these blocks were queued: do not wait on
				// it again; the readers go to their next source.
				err = errPeerSkipped
			} else {
				timeout := maxPeerTimeout
				if est < maxPeerTimeout/peerSlack {
					timeout = max(peerSlack*est, minPeerTimeout)
				}
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				start := time.Now()
				res, err = b.o.d.Peers.Fetch(ctx, b.addr, items)
				b.o.d.Latency.With(b.name).Since(start)
				cancel()
			}
			b.o.requests.Add(1)
			for i, bi := range batch {
				var r batchReply
				if err != nil {
					r.err = err
				} else {
					r.res = res[i]
				}
				bi.reply <- r
			}
		}()
	}
}
