package daemon

import (
	"context"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/peer"
	"github.com/dlfs/dlfs/placement"
)

// peerTimeout bounds a fetch from a peer; past it the reader goes to the
// PFS instead.
const peerTimeout = 10 * time.Second

// Block serves a peer's request (peer.Source): by catalog identity only.
func (n *Node) Block(it peer.Item) ([]byte, byte) {
	e := n.cat.Snapshot().Lookup(it.Path)
	if e == nil || !e.IsRegular() || !e.SameIdentity(it.Size, it.Mtime) || it.Block*n.load.BlockSize() >= max(e.Size, 1) {
		return nil, peer.StatusMissing
	}
	b, err := n.load.Serve(e, it.Block)
	if err != nil {
		n.log.Warn("peer: serving a block failed", "path", e.Path, "err", err)
		return nil, peer.StatusError
	}
	n.peerServed.Add(1)
	return b, peer.StatusOK
}

// remote is the loader's peer tier: it asks the owner of a block, as
// placement over the alive members with a data address says.
type remote struct{ n *Node }

func (r remote) Fetch(e *catalog.Entry, i int64) ([]byte, bool) {
	owner, ok := r.n.owner(e.Path)
	if !ok {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), peerTimeout)
	defer cancel()
	res, err := r.n.peers.Fetch(ctx, owner.Meta.DataAddr, []peer.Item{{Path: e.Path, Size: e.Size, Mtime: e.Mtime, Block: i}})
	if err != nil || res[0].Status != peer.StatusOK {
		r.n.log.Debug("peer fetch failed; reading the PFS", "path", e.Path, "owner", owner.Name, "err", err)
		return nil, false
	}
	return res[0].Data, true
}

// owner returns the member that owns path, if it is another alive node
// with a data address.
func (n *Node) owner(path string) (cluster.Member, bool) {
	t, members := n.table()
	if t == nil {
		return cluster.Member{}, false
	}
	m := members[t.Owner(path)]
	if m.Name == n.cfg.NodeName || m.Meta.DataAddr == "" {
		return cluster.Member{}, false
	}
	return m, true
}

// table returns the placement table of the alive members, rebuilt when the
// view changed.
func (n *Node) table() (*placement.Table, map[int]cluster.Member) {
	n.tableMu.Lock()
	defer n.tableMu.Unlock()
	if n.tableDirty || n.placement == nil {
		alive := n.cl.Alive()
		ms := make([]placement.Member, len(alive))
		byName := map[string]cluster.Member{}
		for i, m := range alive {
			ms[i] = placement.Member{Name: m.Name, Capacity: max(m.Meta.RAM+m.Meta.SSD, 1)}
			byName[m.Name] = m
		}
		t, err := placement.New(ms)
		if err != nil {
			return nil, nil
		}
		n.placement, n.placed = t, map[int]cluster.Member{}
		for i, m := range t.Members() {
			n.placed[i] = byName[m.Name]
		}
		n.tableDirty = false
	}
	return n.placement, n.placed
}
