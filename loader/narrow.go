package loader

import (
	"context"
	"time"

	"github.com/dlfs/dlfs/catalog"
)

// Narrow reads.
//
// A block is the unit of caching: a miss reads the whole block, so that
// the reads after it find the rest there. For a random reader (rows of an
// HDF5 file, row groups of a Parquet file; readahead.go says which
// readers are random) of a file the caches cannot keep, that is a loss:
// the block is evicted before the reader comes back to it, and every read
// of a 128 KiB row costs the PFS a 1 MiB block. So a random reader's read
// of less than the blocks it touches, none of which a tier holds or is
// fetching (a row may straddle two blocks), of a file
// larger than half the RAM tier, on a node with no SSD tier and no peer
// owning the file, reads just its range from the PFS (its version checked
// as every read of SOURCE is) and caches nothing. With an SSD tier, or a
// RAM tier that holds the file, whole blocks are read: each is read from
// the PFS once, and the rows after the first find it cached.

// narrows says whether a random reader's misses in e read only their
// range (see above).
func (l *Loader) narrows(e *catalog.Entry) bool {
	if l.ssd != nil || e.Size <= l.ram.Stats().Capacity/2 {
		return false
	}
	if l.remote != nil {
		if _, ok := l.remote.Owner(e); ok {
			return false
		}
	}
	return true
}

// readNarrow reads [off, end) of e, which lies in blocks first..last,
// from the PFS alone, in one request, if no tier holds any of those
// blocks or is fetching it; ok false sends the read the usual way. The
// result is a buffer of its own.
func (l *Loader) readNarrow(ctx context.Context, e *catalog.Entry, first, last, off, end int64) (out []byte, waited time.Duration, ok bool, err error) {
	for i := first; i <= last; i++ {
		key := BlockKey(e.Path(), i)
		tag := l.Tag(e, key)
		if l.ram.Contains(key) || l.flight.busy(key, tag) || l.aheadHas(e, i) {
			return nil, 0, false, nil
		}
		if _, staged := l.staged(key, tag, e); staged {
			return nil, 0, false, nil
		}
	}
	start := time.Now()
	fk := failKey{e.Path(), e.Version()}
	if err := l.failed.get(fk, start); err != nil {
		return nil, 0, true, err
	}
	n := end - off
	buf, err := l.readRange(ctx, e, off, n)
	if err != nil {
		l.failed.put(fk, err, time.Now(), l.cfg.FailureTTL)
		return nil, 0, true, err
	}
	waited = time.Since(start)
	l.model.Observe(srcPFS, n, waited)
	l.fetches[tierPFS].Add(1)
	l.fetched[tierPFS].Add(n)
	l.narrowed.Add(n)
	return buf, waited, true, nil
}
