package owners

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/cluster/peer"
	"github.com/dlfs/dlfs/loader"
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

// item names block i of e for a peer, with this node's tag for it.
func (o *Owners) item(e *catalog.Entry, i int64) peer.Item {
	return peer.Item{Path: e.Path(), Block: i, Tag: o.d.Tag(e, loader.BlockKey(e.Path(), i))}
}

// cachedTimeout bounds a cached request to a previous owner: it is a
// probe of its caches, and the PFS is the fallback.
const cachedTimeout = 2 * time.Second

// Owners is the loader's peer tier (loader.Remote): it asks the owner of
// a block, as placement over the alive members with a data address says.

// Owner names the member that owns e, if it is another alive node with a
// data address.
func (o *Owners) Owner(e *catalog.Entry) (string, bool) {
	m, ok := o.owner(e.Path())
	return m.Name, ok
}

// Fetch returns block i of e from peerName, batched with the other
// blocks wanted from it. It stops waiting when ctx is done; the batch
// goes on for the others in it.
func (o *Owners) Fetch(ctx context.Context, peerName string, e *catalog.Entry, i int64) ([]byte, uint32, error) {
	addr, ok := o.view.Load().dataAddr(peerName)
	if !ok {
		return nil, 0, fmt.Errorf("peer %s: no longer a member with a data address", peerName)
	}
	size := min(o.d.BlockSize, e.Size-i*o.d.BlockSize)
	res, err := o.batcherFor(addr, peerName).fetch(ctx, o.item(e, i), size)
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
func (o *Owners) Previous(e *catalog.Entry) (string, bool) {
	v := o.view.Load()
	name := ""
	if v.prev != nil {
		name = v.prevMembers[v.prev.Owner(e.Path())].Name
	}
	if (name == "" || name == o.cfg.NodeName) && v.others != nil {
		name = v.othersMembers[v.others.Owner(e.Path())].Name
	}
	if name == "" || name == o.cfg.NodeName {
		return "", false
	}
	if _, alive := v.dataAddr(name); !alive {
		return "", false
	}
	return name, true
}

// FetchCached asks peerName, a previous owner of e, for block i of e from
// its caches only, within cachedTimeout and until ctx is done.
func (o *Owners) FetchCached(ctx context.Context, peerName string, e *catalog.Entry, i int64) ([]byte, uint32, error) {
	addr, ok := o.view.Load().dataAddr(peerName)
	if !ok {
		return nil, 0, fmt.Errorf("peer %s: no longer a member with a data address", peerName)
	}
	ctx, cancel := context.WithTimeout(ctx, cachedTimeout)
	defer cancel()
	start := time.Now()
	res, err := o.d.Peers.FetchCached(ctx, addr, []peer.Item{o.item(e, i)})
	o.d.Latency.With(peerName).Since(start)
	if err != nil {
		return nil, 0, fmt.Errorf("peer %s: %w", peerName, err)
	}
	if res[0].Status != peer.StatusOK {
		return nil, 0, fmt.Errorf("peer %s: %w", peerName, loader.ErrNoBlock)
	}
	return res[0].Data, res[0].Sum, nil
}

// owner returns the member that owns path, if it is another alive node
// with a data address.
func (o *Owners) owner(path string) (cluster.Member, bool) {
	v := o.view.Load()
	if v.table == nil {
		return cluster.Member{}, false
	}
	m := v.members[v.table.Owner(path)]
	if m.Name == o.cfg.NodeName || m.Meta.DataAddr == "" {
		return cluster.Member{}, false
	}
	return m, true
}

// dataAddr returns the data address of the alive member called name.
func (v *View) dataAddr(name string) (string, bool) {
	for _, m := range v.members {
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
// until Close: a member whose address cannot be reached shows in stats
// (members[].data) before a read needs it.
func (o *Owners) probePeers(changes <-chan struct{}) {
	defer o.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // ends with probePeers: cancel closes ctx
		select {
		case <-o.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		for _, m := range o.d.Cluster.Alive() {
			if m.Name == o.cfg.NodeName || m.Meta.DataAddr == "" || ctx.Err() != nil {
				continue
			}
			pctx, pcancel := context.WithTimeout(ctx, minPeerTimeout)
			_ = o.d.Peers.Connect(pctx, m.Meta.DataAddr) // the outcome is in Reachability
			pcancel()
		}
		select {
		case <-o.stop:
			return
		case <-changes:
		case <-t.C:
		}
	}
}
