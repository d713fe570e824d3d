package daemon

import (
	"context"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster/peer"
	"github.com/dlfs/dlfs/loader"
)

// Block serves a peer's request (peer.Source): a block of a file of this
// node's catalog whose tag, dataset and version included, is the asker's.
func (n *Node) Block(it peer.Item) ([]byte, uint32, byte) {
	e := n.servable(it)
	if e == nil {
		return nil, 0, peer.StatusMissing
	}
	b, sum, err := n.tiers.load.Serve(context.Background(), e, it.Block)
	if err != nil {
		n.log.Warn("peer: serving a block failed", "path", e.Path(), "err", err)
		return nil, 0, peer.StatusError
	}
	n.cluster.served.Add(1)
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
	b, sum, ok := n.tiers.load.Cached(e, it.Block)
	if !ok {
		return nil, 0, peer.StatusMissing
	}
	n.cluster.served.Add(1)
	return b, sum, peer.StatusOK
}

// servable returns the regular file it names if the block exists (checked
// without overflow: the index comes from the wire) and the asker's tag is
// this node's for it; nil otherwise.
func (n *Node) servable(it peer.Item) *catalog.Entry {
	e := n.cat.Snapshot().Lookup(it.Path)
	if e == nil || !e.IsRegular() || it.Block < 0 || it.Block > (max(e.Size, 1)-1)/n.tiers.load.BlockSize() {
		return nil
	}
	if it.Tag != n.tiers.load.Tag(e, loader.BlockKey(e.Path(), it.Block)) {
		return nil // another dataset, or another version of the file
	}
	return e
}
