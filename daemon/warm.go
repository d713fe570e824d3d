package daemon

import (
	"context"
	"fmt"
	"io/fs"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/ramcache"
)

// warmSource is the node as package warmup fetches through it.
type warmSource struct{ n *Node }

func (s warmSource) Locate(e *catalog.Entry) (loader.Span, bool) { return s.n.tiers.load.Locate(e) }
func (s warmSource) RunLimits() (gap, run int64)                 { return s.n.tiers.load.RunLimits() }

// Warm fetches first (and its packed neighbours, in one request) as the
// prefetcher does, and offers each block to RAM; a block a peer owns is
// kept by that peer, not here (loader.Offer).
func (s warmSource) Warm(ctx context.Context, first *catalog.Entry, neighbours []*catalog.Entry) error {
	keep := func(e *catalog.Entry, i int64, b ramcache.Block) bool {
		return s.n.tiers.load.Offer(loader.BlockKey(e.Path(), i), b)
	}
	if len(neighbours) > 0 {
		_, err := s.n.tiers.load.PrefetchRun(ctx, first, neighbours, keep)
		return err
	}
	_, err := s.n.tiers.load.Prefetch(ctx, first, keep)
	return err
}

// filesUnder returns the regular files at or under each path (relative to
// the mount), each once, or an error naming the first path missing.
func (n *Node) filesUnder(paths []string) ([]*catalog.Entry, error) {
	snap := n.cat.Snapshot()
	seen := map[uint64]bool{}
	var out []*catalog.Entry
	var walk func(e *catalog.Entry)
	walk = func(e *catalog.Entry) {
		switch {
		case e.IsDir():
			for c := range e.Children() {
				walk(c)
			}
		case e.IsRegular() && !seen[e.Ino]:
			seen[e.Ino] = true
			out = append(out, e)
		}
	}
	for _, p := range paths {
		e := snap.Lookup(p)
		if e == nil {
			return nil, fmt.Errorf("%s: %w in the dataset", p, fs.ErrNotExist)
		}
		walk(e)
	}
	return out, nil
}

// cacheCapacity is what the caches can hold for a warm-up: this node's
// RAM and SSD tiers, and in a cluster every alive member's.
func (n *Node) cacheCapacity() int64 {
	var placed []cluster.Member
	if n.cluster.owners != nil {
		placed = n.cluster.owners.View().Members()
	}
	if len(placed) == 0 {
		c := n.cfg.RAMCache
		if n.tiers.ssd != nil {
			c += n.cfg.SSDCapacity
		}
		return c
	}
	var c int64
	for _, m := range placed {
		c += m.Meta.RAM + m.Meta.SSD
	}
	return c
}

// CheckResult is how much of a path the caches hold, by bytes: shares of
// its files' bytes whose first block this node's RAM holds, its SSD holds,
// another node owns, or no tier holds.
type CheckResult struct {
	Files int     `json:"files"`
	Bytes int64   `json:"bytes"`
	RAM   float64 `json:"ram"`
	SSD   float64 `json:"ssd"`
	Peer  float64 `json:"peer"`
	None  float64 `json:"none"`
}

// check measures what the caches hold of the files under path.
func (n *Node) check(path string) (CheckResult, error) {
	files, err := n.filesUnder([]string{path})
	if err != nil {
		return CheckResult{}, err
	}
	var r CheckResult
	var ram, ssd, peer, none int64
	for _, e := range files {
		r.Files++
		r.Bytes = catalog.AddSize(r.Bytes, e.Size)
		switch {
		case n.tiers.load.InRAM(e):
			ram = catalog.AddSize(ram, e.Size)
		case n.tiers.ssd != nil && n.tiers.load.OnSSD(e):
			ssd = catalog.AddSize(ssd, e.Size)
		default:
			if n.peerOwns(e) {
				peer = catalog.AddSize(peer, e.Size)
			} else {
				none = catalog.AddSize(none, e.Size)
			}
		}
	}
	if r.Bytes > 0 {
		b := float64(r.Bytes)
		r.RAM, r.SSD, r.Peer, r.None = float64(ram)/b, float64(ssd)/b, float64(peer)/b, float64(none)/b
	}
	return r, nil
}

// peerOwns reports whether another node owns e.
func (n *Node) peerOwns(e *catalog.Entry) bool {
	if n.cluster.owners == nil {
		return false
	}
	_, ok := n.cluster.owners.Owner(e)
	return ok
}
