package loader

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/perfmodel"
	"github.com/dlfs/dlfs/ssdstore"
)

// # The chain of sources
//
// Past RAM, the stage and the blocks fetched ahead, a block is loaded
// through a chain: an ordered list of sources, tried in turn until one
// supplies the block. order chooses the list, a pure function of which
// sources exist, the model's view of each and who waits (see Choice of
// source in the package doc). Each source is a function with one job. One
// that does not hold the block, or fails, returns an error wrapping
// errMiss, and the chain falls through to the next; the PFS's own error
// falls through too, and is the chain's when no source after it has the
// block. A load whose ctx is done stops at the source it is in (each
// waits on ctx: the PFS in pfsCall, a peer in Remote, a busy packed
// container in readDemand) and tries none after it.

// errMiss means a source did not supply a block: the chain tries the next.
var errMiss = errors.New("loader: not supplied by this source")

// Sources the model measures; a peer is peerSource of its name.
const (
	srcSSD = "ssd"
	srcPFS = "pfs"
)

// peerSource is the model's name of the peer called name.
func peerSource(name string) string { return "peer:" + name }

// probeAfter is how long a cache source may go unmeasured before it is
// tried ahead of the PFS anyway.
const probeAfter = time.Second

// purpose says who a load is for.
type purpose int

const (
	forReader   purpose = iota // a read waits on it
	forPrefetch                // ahead of the reader: latency is hidden, PFS load is not
	forPeer                    // a peer asked this node, the owner: never ask another peer
)

// sourceKind is a kind of place a block is loaded from past RAM.
type sourceKind int

const (
	fromSSD      sourceKind = iota
	fromOwner               // the peer that owns the block
	fromPrevious            // the caches of the peer that owned it before
	fromPFS
)

// link is one source of the chain: a kind and, for a peer, its name.
type link struct {
	kind sourceKind
	peer string
}

// name is the source's name in the model.
func (s link) name() string {
	switch s.kind {
	case fromSSD:
		return srcSSD
	case fromPFS:
		return srcPFS
	}
	return peerSource(s.peer)
}

// choice is what the order of the sources for one block depends on.
type choice struct {
	ssd      bool   // an SSD tier exists
	owner    string // the peer that owns the block; "" when this node does, or none can serve it
	previous string // the peer that owned it before placement changed; "" if none
	why      purpose
	margin   float64 // Config.PFSMargin
	// est and since are the model's estimate of each source for the
	// block (perfmodel.Unreachable while it is skipped after a failure)
	// and how long ago it last measured each, by name.
	est, since map[string]time.Duration
}

// order is the chain of sources for a block:
//   - the cached copies (the SSD, and the owning peer unless a peer asks),
//     fastest estimate first, up to the first skipped after a failure or,
//     for a waiting reader with a margin set, expected margin times slower
//     than the PFS;
//   - with that margin, the first copy past them not measured for
//     probeAfter (to see whether it recovered);
//   - the previous owner's caches, another peer than the owner, unless
//     skipped after a failure: a cheap probe, not a copy the model ranks;
//   - the PFS;
//   - the copies left.
func order(c choice) []link {
	copies := make([]link, 0, 4)
	if c.ssd {
		copies = append(copies, link{kind: fromSSD})
	}
	owner := ""
	if c.owner != "" && c.why != forPeer {
		owner = c.owner
		copies = append(copies, link{kind: fromOwner, peer: owner})
	}
	sort.SliceStable(copies, func(i, j int) bool { return c.est[copies[i].name()] < c.est[copies[j].name()] })
	margin := c.why == forReader && c.margin > 0
	pfs := float64(c.est[srcPFS])
	k := 0
	for ; k < len(copies); k++ {
		est := c.est[copies[k].name()]
		if est == perfmodel.Unreachable || margin && float64(est) > c.margin*pfs {
			break
		}
	}
	if margin {
		for j := k; j < len(copies); j++ {
			if s := copies[j]; c.since[s.name()] > probeAfter && c.est[s.name()] != perfmodel.Unreachable {
				copy(copies[k+1:j+1], copies[k:j])
				copies[k] = s
				k++
				break
			}
		}
	}
	out := append([]link(nil), copies[:k]...)
	if c.previous != "" && c.previous != owner && c.est[peerSource(c.previous)] != perfmodel.Unreachable {
		out = append(out, link{kind: fromPrevious, peer: c.previous})
	}
	out = append(out, link{kind: fromPFS})
	return append(out, copies[k:]...)
}

// blockReq is a block to load: block i of e, n bytes, its key and tag,
// and who it is for.
type blockReq struct {
	e   *catalog.Entry
	i   int64
	key string
	tag uint64
	n   int64
	why purpose
}

// loadFrom loads block i of e through the chain of sources (see above).
func (l *Loader) loadFrom(ctx context.Context, e *catalog.Entry, i int64, tag uint64, why purpose) (fetch, error) {
	r := blockReq{e: e, i: i, key: BlockKey(e.Path(), i), tag: tag, n: blockEnd(e.Size, l.cfg.BlockSize, i) - i*l.cfg.BlockSize, why: why}
	var err error
	for _, s := range order(l.choice(r)) {
		f, serr := l.from(ctx, s, r)
		if serr == nil {
			return f, nil
		}
		if cerr := ctx.Err(); cerr != nil {
			return fetch{src: tierPFS}, cerr // its reader gave up: no source after
		}
		if !errors.Is(serr, errMiss) {
			err = serr
		}
	}
	if err == nil {
		err = fmt.Errorf("loader: %s block %d: no source supplied it", e.Path(), i)
	}
	return fetch{src: tierPFS}, err
}

// choice gathers what the order of sources for r depends on.
func (l *Loader) choice(r blockReq) choice {
	c := choice{ssd: l.ssd != nil, why: r.why, margin: l.cfg.PFSMargin}
	names := make([]string, 0, 4)
	names = append(names, srcPFS)
	if c.ssd {
		names = append(names, srcSSD)
	}
	if l.remote != nil {
		if p, ok := l.remote.Owner(r.e); ok {
			c.owner = p
			names = append(names, peerSource(p))
		}
		// After placement changed, the previous owner may still cache the
		// sample: asking its caches (never its PFS) saves a PFS read.
		if p, ok := l.remote.Previous(r.e); ok {
			c.previous = p
			names = append(names, peerSource(p))
		}
	}
	c.est = make(map[string]time.Duration, len(names))
	c.since = make(map[string]time.Duration, len(names))
	for _, n := range names {
		c.est[n] = l.model.Estimate(n, r.n)
		c.since[n] = l.model.Since(n)
	}
	return c
}

// from loads r from s.
func (l *Loader) from(ctx context.Context, s link, r blockReq) (fetch, error) {
	switch s.kind {
	case fromSSD:
		return l.fromSSD(r)
	case fromOwner:
		return l.fromOwner(ctx, l.remote, s.peer, r)
	case fromPrevious:
		return l.fromPrevious(ctx, l.remote, s.peer, r)
	default:
		return l.fromPFS(ctx, r)
	}
}

// fromSSD reads r from the SSD tier.
func (l *Loader) fromSSD(r blockReq) (fetch, error) {
	start := time.Now()
	b, ok, err := l.ssd.Get(r.key, r.tag)
	if err != nil && !errors.Is(err, ssdstore.ErrClosed) {
		l.log.Warn("loader: SSD read failed; trying the next source", "path", r.e.Path(), "err", err)
		l.model.Fail(srcSSD)
	}
	if !ok {
		return fetch{}, errMiss
	}
	l.model.Observe(srcSSD, r.n, time.Since(start))
	return fetch{b.Data, tierSSD, b.Sum}, nil
}

// fromOwner fetches r from peer, its owner. A peer that fails, or sends a
// block that fails its length or its sum, is skipped for a while; one
// that only lacks the block is not.
func (l *Loader) fromOwner(ctx context.Context, rem Remote, peer string, r blockReq) (fetch, error) {
	start := time.Now()
	b, sum, err := rem.Fetch(ctx, peer, r.e, r.i)
	if err == nil && int64(len(b)) != r.n {
		err = fmt.Errorf("peer %s sent %d bytes of %d", peer, len(b), r.n)
	}
	if err == nil {
		err = l.checkPeer(peer, r, b, sum)
	}
	if err != nil {
		l.log.Debug("loader: peer fetch failed; trying the next source", "path", r.e.Path(), "peer", peer, "err", err)
		if !errors.Is(err, ErrNoBlock) && ctx.Err() == nil { // a reader giving up is not the peer's fault
			l.model.Fail(peerSource(peer))
		}
		return fetch{}, fmt.Errorf("%w: %w", errMiss, err)
	}
	// Timed per block, waiting in the batch included: that is what a read
	// from this peer costs the reader.
	l.model.Observe(peerSource(peer), r.n, time.Since(start))
	return fetch{b, tierPeer, sum}, nil
}

// fromPrevious asks peer, r's previous owner, for r from its caches (never
// its PFS), and queues what it sends for the SSD: the block is this
// node's own now.
func (l *Loader) fromPrevious(ctx context.Context, rem Remote, peer string, r blockReq) (fetch, error) {
	b, sum, err := rem.FetchCached(ctx, peer, r.e, r.i)
	if err == nil {
		err = l.checkPeer(peer, r, b, sum)
	}
	if err != nil && !errors.Is(err, ErrNoBlock) && ctx.Err() == nil {
		l.model.Fail(peerSource(peer))
	}
	if err == nil && int64(len(b)) != r.n {
		err = fmt.Errorf("peer %s sent %d bytes of %d", peer, len(b), r.n)
	}
	if err != nil {
		return fetch{}, fmt.Errorf("%w: %w", errMiss, err) // not cached there (or gone): the PFS then
	}
	f := fetch{b, tierMoved, sum}
	l.toSSD(r.e, r.key, r.tag, f)
	return f, nil
}

// checkPeer checks a block peer sent for r against the sum it sent, under
// this node's tag.
func (l *Loader) checkPeer(peer string, r blockReq, b []byte, sum uint32) error {
	if integrity.Check(r.tag, sum, b) {
		return nil
	}
	l.log.Warn("loader: a peer's block fails its checksum; not using it", "peer", peer, "path", r.e.Path(), "block", r.i)
	return fmt.Errorf("peer %s sent %s block %d failing its checksum", peer, r.e.Path(), r.i)
}

// fromPFS reads r from SOURCE, unless a read of its file failed lately
// (failures.go), and queues it for the SSD.
func (l *Loader) fromPFS(ctx context.Context, r blockReq) (fetch, error) {
	start := time.Now()
	fk := failKey{r.e.Path(), r.e.Version()}
	if err := l.failed.get(fk, start); err != nil {
		return fetch{}, err // a cache source after it may still hold the block
	}
	buf, err := l.readSource(ctx, r)
	if err != nil {
		l.failed.put(fk, err, time.Now(), l.cfg.FailureTTL)
		return fetch{}, err
	}
	l.model.Observe(srcPFS, r.n, time.Since(start))
	f := fetch{buf, tierPFS, integrity.Sum(r.tag, buf)} // the bytes passed SOURCE's version check
	l.toSSD(r.e, r.key, r.tag, f)
	return f, nil
}

// readSource reads r's bytes from SOURCE: a waiting reader's sample of a
// packed dataset combined with the other reads of its container when it
// is busy (combine.go); any other block with a small last block after it
// in the same request (readahead.go).
func (l *Loader) readSource(ctx context.Context, r blockReq) ([]byte, error) {
	if c, ok := l.pfs.(Coalescer); ok && r.why == forReader && !l.cfg.NoCoalesce && r.e.Size <= l.cfg.BlockSize {
		if span, ok := c.Locate(r.e.Path()); ok {
			return l.readDemand(ctx, c, r.e, span)
		}
		return l.readPFS(ctx, r.e, r.i, r.n)
	}
	return l.readPFSWithTail(ctx, r.e, r.i, r.n)
}
