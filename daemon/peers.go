package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/peer"
	"github.com/dlfs/dlfs/perfmodel"
	"github.com/dlfs/dlfs/placement"
)

// errPeerSkipped fails blocks queued for a peer that failed meanwhile.
var errPeerSkipped = errors.New("skipped after a recent failure")

// A request to a peer has a deadline of peerSlack times the model's
// estimate for it, within [minPeerTimeout, maxPeerTimeout]; past it the
// reader tries the next source, and the peer is skipped for a while.
const (
	peerSlack      = 8
	minPeerTimeout = 5 * time.Second
	maxPeerTimeout = 15 * time.Second
)

// Block serves a peer's request (peer.Source): a block of a file of this
// node's catalog whose tag, dataset and version included, is the asker's.
func (n *Node) Block(it peer.Item) ([]byte, uint32, byte) {
	e := n.servable(it)
	if e == nil {
		return nil, 0, peer.StatusMissing
	}
	b, sum, err := n.load.Serve(context.Background(), e, it.Block)
	if err != nil {
		n.log.Warn("peer: serving a block failed", "path", e.Path(), "err", err)
		return nil, 0, peer.StatusError
	}
	n.peerServed.Add(1)
	return b, sum, peer.StatusOK
}

// Cached serves a peer's cached request (peer.Source): the block only if
// this node's caches hold it. The asker owns the sample now; this node
// did before placement changed.
func (n *Node) Cached(it peer.Item) ([]byte, uint32, byte) {
	e := n.servable(it)
	if e == nil {
		return nil, 0, peer.StatusMissing
	}
	b, sum, ok := n.load.Cached(e, it.Block)
	if !ok {
		return nil, 0, peer.StatusMissing
	}
	n.peerServed.Add(1)
	return b, sum, peer.StatusOK
}

// servable returns the regular file it names if the block exists (checked
// without overflow: the index comes from the wire) and the asker's tag is
// this node's for it; nil otherwise.
func (n *Node) servable(it peer.Item) *catalog.Entry {
	e := n.cat.Snapshot().Lookup(it.Path)
	if e == nil || !e.IsRegular() || it.Block < 0 || it.Block > (max(e.Size, 1)-1)/n.load.BlockSize() {
		return nil
	}
	if it.Tag != n.load.Tag(e, loader.BlockKey(e.Path(), it.Block)) {
		return nil // another dataset, or another version of the file
	}
	return e
}

// item names block i of e for a peer, with this node's tag for it.
func (n *Node) item(e *catalog.Entry, i int64) peer.Item {
	return peer.Item{Path: e.Path(), Block: i, Tag: n.load.Tag(e, loader.BlockKey(e.Path(), i))}
}

// cachedTimeout bounds a cached request to a previous owner: it is a
// probe of its caches, and the PFS is the fallback.
const cachedTimeout = 2 * time.Second

// remote is the loader's peer tier: it asks the owner of a block, as
// placement over the alive members with a data address says.
type remote struct{ n *Node }

func (r remote) Owner(e *catalog.Entry) (string, bool) {
	m, ok := r.n.owner(e.Path())
	return m.Name, ok
}

func (r remote) Fetch(peerName string, e *catalog.Entry, i int64) ([]byte, uint32, error) {
	addr, ok := r.n.dataAddr(peerName)
	if !ok {
		return nil, 0, fmt.Errorf("peer %s: no longer a member with a data address", peerName)
	}
	size := min(r.n.load.BlockSize(), e.Size-i*r.n.load.BlockSize())
	res, err := r.n.batcherFor(addr, peerName).fetch(r.n.item(e, i), size)
	if err != nil {
		return nil, 0, fmt.Errorf("peer %s: %w", peerName, err)
	}
	if res.Status != peer.StatusOK {
		return nil, 0, fmt.Errorf("peer %s: status %d: %w", peerName, res.Status, loader.ErrNoBlock)
	}
	return res.Data, res.Sum, nil
}

// Previous names who may still cache e from before the last change of
// placement: its owner in the previous table, or, if that was this node
// (it has just joined), its owner among the other members.
func (r remote) Previous(e *catalog.Entry) (string, bool) {
	n := r.n
	n.tableMu.Lock()
	prev, prevPlaced := n.prevPlacement, n.prevPlaced
	others, othersPlaced := n.othersPlacement, n.othersPlaced
	n.tableMu.Unlock()
	name := ""
	if prev != nil {
		name = prevPlaced[prev.Owner(e.Path())].Name
	}
	if (name == "" || name == n.cfg.NodeName) && others != nil {
		name = othersPlaced[others.Owner(e.Path())].Name
	}
	if name == "" || name == n.cfg.NodeName {
		return "", false
	}
	if _, alive := n.dataAddr(name); !alive {
		return "", false
	}
	return name, true
}

func (r remote) FetchCached(peerName string, e *catalog.Entry, i int64) ([]byte, uint32, error) {
	addr, ok := r.n.dataAddr(peerName)
	if !ok {
		return nil, 0, fmt.Errorf("peer %s: no longer a member with a data address", peerName)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cachedTimeout)
	defer cancel()
	start := time.Now()
	res, err := r.n.peers.FetchCached(ctx, addr, []peer.Item{r.n.item(e, i)})
	r.n.lat.peer.With(peerName).Since(start)
	if err != nil {
		return nil, 0, fmt.Errorf("peer %s: %w", peerName, err)
	}
	if res[0].Status != peer.StatusOK {
		return nil, 0, fmt.Errorf("peer %s: %w", peerName, loader.ErrNoBlock)
	}
	r.n.movedIn.Add(1)
	return res[0].Data, res[0].Sum, nil
}

// batcher sends the blocks wanted from one peer in batches: whatever is
// queued when a request goes out travels in it (up to maxBatch items),
// without waiting for more, so batching adds no latency. Up to
// batchesInFlight requests are pipelined on the connection.
type batcher struct {
	n    *Node
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

// batchers are the batchers by peer data address, and the placement
// table they were last checked against.
type batchers struct {
	m  map[string]*batcher
	of *placement.Table
}

// errPeerGone fails the blocks queued for a peer that is no longer a
// member.
var errPeerGone = errors.New("no longer a member with a data address")

// batcherFor returns the batcher of addr, starting it on first use. Its
// goroutine is owned by the Node and ends when n.stop closes, or once
// its peer is no longer placed: when placement changes, the batchers of
// the members gone are stopped, so they are never more than the members.
func (n *Node) batcherFor(addr, name string) *batcher {
	n.tableMu.Lock()
	defer n.tableMu.Unlock()
	if n.batchers.m == nil {
		n.batchers.m = map[string]*batcher{}
	}
	if n.batchers.of != n.placement {
		n.batchers.of = n.placement
		placed := map[string]bool{}
		for _, m := range n.placed {
			placed[m.Meta.DataAddr] = true
		}
		for a, b := range n.batchers.m {
			if !placed[a] {
				close(b.gone)
				delete(n.batchers.m, a)
			}
		}
	}
	b := n.batchers.m[addr]
	if b == nil {
		b = &batcher{n: n, addr: addr, name: name, q: make(chan batchItem, 4*maxBatch), gone: make(chan struct{})}
		n.batchers.m[addr] = b
		n.wg.Add(1)
		go b.run()
	}
	return b
}

func (b *batcher) fetch(it peer.Item, size int64) (peer.Result, error) {
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
	case <-b.n.stop:
		return peer.Result{}, peer.ErrClosed
	case <-b.gone:
		return peer.Result{}, errPeerGone
	}
	select {
	case r := <-reply:
		return r.res, r.err
	case <-b.n.stop:
		return peer.Result{}, peer.ErrClosed
	case <-b.gone:
		return peer.Result{}, errPeerGone
	}
}

func (b *batcher) run() {
	defer b.n.wg.Done()
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
			case <-b.n.stop:
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
		case <-b.n.stop:
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
			est := b.n.model.Estimate("peer:"+b.name, bytes)
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
				res, err = b.n.peers.Fetch(ctx, b.addr, items)
				b.n.lat.peer.With(b.name).Since(start)
				cancel()
			}
			b.n.peerBatches.Add(1)
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

// owner returns the member that owns path, if it is another alive node
// with a data address.
func (n *Node) owner(path string) (cluster.Member, bool) {
	n.tableMu.Lock()
	t, placed := n.placement, n.placed
	n.tableMu.Unlock()
	if t == nil {
		return cluster.Member{}, false
	}
	m := placed[t.Owner(path)]
	if m.Name == n.cfg.NodeName || m.Meta.DataAddr == "" {
		return cluster.Member{}, false
	}
	return m, true
}

// dataAddr returns the data address of the alive member called name.
func (n *Node) dataAddr(name string) (string, bool) {
	n.tableMu.Lock()
	defer n.tableMu.Unlock()
	for _, m := range n.placed {
		if m.Name == name && m.Meta.DataAddr != "" {
			return m.Meta.DataAddr, true
		}
	}
	return "", false
}

// probeEvery is how often probePeers checks the members' data ports.
const probeEvery = 10 * time.Second

// probePeers makes sure this node has a connection to the data address of
// every alive member, on each change of the view and every probeEvery,
// until stop closes: a member whose address cannot be reached shows in
// stats (members[].data) before a read needs it. It is owned by the Node.
func (n *Node) probePeers(changes <-chan struct{}, stop <-chan struct{}) {
	defer n.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // ends with probePeers: cancel closes ctx
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		for _, m := range n.cl.Alive() {
			if m.Name == n.cfg.NodeName || m.Meta.DataAddr == "" || ctx.Err() != nil {
				continue
			}
			pctx, pcancel := context.WithTimeout(ctx, minPeerTimeout)
			_ = n.peers.Connect(pctx, m.Meta.DataAddr) // the outcome is in Reachability
			pcancel()
		}
		select {
		case <-stop:
			return
		case <-changes:
		case <-t.C:
		}
	}
}
