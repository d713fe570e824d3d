package loader

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/loader/runs"
	"github.com/dlfs/dlfs/source"
)

// Coalescing: over a packed dataset, the prefetcher hands the loader a
// sample with the neighbours in its container that a plan still needs,
// and the loader reads them in one request (PrefetchRun). The limits come
// from the model's fit of the PFS (RunLimits). Demand reads are combined
// in combine.go.

// perSample reports whether a coalesced read's failure may be one
// sample's (a corrupt or changed record), so that reading the samples one
// by one is worth it; a PFS past its deadline, or a closing loader, fails
// them all alike, and another try of each would wait as long again.
func perSample(err error) bool {
	return !errors.Is(err, ErrPFSTimeout) && !errors.Is(err, ErrClosed)
}

// errRunLength means a Coalescer returned the wrong number of samples.
var errRunLength = errors.New("loader: a coalesced read returned the wrong number of samples")

// Coalesces reports whether SOURCE is a packed dataset whose neighbouring
// samples are read together.
func (l *Loader) Coalesces() bool {
	_, ok := l.pfs.(Coalescer)
	return ok && !l.cfg.NoCoalesce
}

// Locate says where e's bytes lie, if SOURCE is a packed dataset and e is
// one block.
func (l *Loader) Locate(e *catalog.Entry) (Span, bool) {
	if !l.Coalesces() || e.Size > l.cfg.BlockSize {
		return Span{}, false
	}
	return l.pfs.(Coalescer).Locate(e.Path())
}

// RunLimits are the thresholds for reading neighbouring samples in one
// request, from the model's measure of the PFS: a gap is worth reading
// through when it takes less time than a request's latency (gap =
// latency × bandwidth), and a run stops at ten times that, where
// transfer time dominates and a longer run saves little.
func (l *Loader) RunLimits() (gap, run int64) {
	latency, perByte := l.model.Fit(srcPFS)
	if perByte <= 0 {
		return 0, l.cfg.BlockSize
	}
	gap = int64(latency.Seconds() / perByte)
	return min(gap, 8<<20), min(max(10*gap, l.cfg.BlockSize), 32<<20)
}

// PrefetchRun fetches first and its neighbours in one container from the
// PFS with one request, sharing flights with concurrent reads. Each goes
// to keep (the stage: the prefetcher picks neighbours its plans need
// within the stage's horizon); a neighbour keep refuses is offered to
// RAM, which keeps it if its next use warrants. It returns, by inode, the samples it
// fetched and whether keep staged each. It leaves out samples RAM or the
// SSD holds, that a peer owns, that a demand read holds, or that another
// fetch is already bringing in: the caller prefetches those one by one.
// The holes they leave split the request where wider than the gap limit.
//
// It stops early when ctx is done: the samples not yet read fail with
// ctx's error (a demand read waiting on one of them fetches it again).
func (l *Loader) PrefetchRun(ctx context.Context, first *catalog.Entry, neighbours []*catalog.Entry, keep Keep) (map[uint64]bool, error) {
	c, ok := l.pfs.(Coalescer)
	if !ok {
		return nil, nil
	}
	es := append([]*catalog.Entry{first}, neighbours...)
	spans := make(map[uint64]Span, len(es))
	for _, e := range es {
		sp, ok := c.Locate(e.Path())
		if !ok {
			return nil, fmt.Errorf("loader: %s is not in a packed container", e.Path())
		}
		spans[e.Ino] = sp
	}
	var pick []*catalog.Entry
	for _, e := range es {
		key := BlockKey(e.Path(), 0)
		if e.Size > l.cfg.BlockSize || l.ram.Contains(key) || l.flight.held(key) {
			continue
		}
		if s, ok := l.ssd.(interface{ Contains(string) bool }); ok && s.Contains(key) {
			continue
		}
		if l.remote != nil {
			if _, remote := l.remote.Owner(e); remote {
				continue
			}
		}
		pick = append(pick, e)
	}
	keys := make([]string, len(pick))
	tags := make([]uint64, len(pick))
	for i, e := range pick {
		keys[i] = BlockKey(e.Path(), 0)
		tags[i] = l.Tag(e, keys[i])
	}
	calls := l.flight.claim(keys, tags)
	var (
		mine    []int // indexes of pick whose flight this fetch claimed
		claimed []Span
	)
	for i, e := range pick {
		if calls[i] != nil {
			mine = append(mine, i)
			claimed = append(claimed, spans[e.Ino])
		}
	}
	out := make(map[uint64]bool, len(mine))
	gap, _ := l.RunLimits() // first and its neighbours are within the length limit already
	for _, run := range runs.Plan(claimed, gap, math.MaxInt64) {
		part := make([]int, len(run))
		for k, i := range run {
			part[k] = mine[i]
		}
		l.finishRun(ctx, c, first, pick, keys, tags, calls, part, keep, out)
	}
	return out, nil
}

// finishRun reads one run of PrefetchRun's picks (part indexes pick, keys,
// tags and calls), finishes their flights and fills out.
func (l *Loader) finishRun(ctx context.Context, c Coalescer, first *catalog.Entry, pick []*catalog.Entry, keys []string, tags []uint64, calls []*call,
	part []int, keep Keep, out map[uint64]bool) {
	es := make([]*catalog.Entry, len(part))
	for k, i := range part {
		es[k] = pick[i]
	}
	bufs, errs := l.readRun(ctx, c, es)
	for k, i := range part {
		e := pick[i]
		if errs[k] != nil {
			l.flight.finish(keys[i], tags[i], calls[i], fetch{src: tierPFS}, errs[k])
			continue
		}
		b := bufs[k]
		l.fetches[tierPFS].Add(1)
		l.fetched[tierPFS].Add(int64(len(b)))
		// The stage or RAM take the block before its flight ends (see Keep).
		tag := tags[i]
		f := fetch{b, tierPFS, integrity.Sum(tag, b)} // ReadRun checked the records
		blk := blockOf(e, tag, f)
		out[e.Ino] = keep(e, 0, blk)
		if !out[e.Ino] && e != first {
			l.ram.Put(keys[i], blk) // kept if its next use warrants
		}
		l.flight.finish(keys[i], tags[i], calls[i], f, nil)
		l.toSSD(e, keys[i], tag, f)
	}
}

// readRun reads es, samples of one container in offset order, with one
// request. If that fails in a way that may be one sample's fault
// (perSample), it reads each alone, and each fails alone; otherwise they
// all fail alike. It returns each sample's bytes or error.
func (l *Loader) readRun(ctx context.Context, c Coalescer, es []*catalog.Entry) ([][]byte, []error) {
	paths := make([]string, len(es))
	wants := make([]source.Version, len(es))
	for i, e := range es {
		paths[i], wants[i] = e.Path(), e.Version()
	}
	start := time.Now()
	bufs, err := pfsCall(ctx, l, paths[0], func() ([][]byte, error) { return c.ReadRun(paths, wants) })
	errs := make([]error, len(es))
	if err != nil && (ctx.Err() != nil || !perSample(err)) {
		for i := range errs {
			errs[i] = err // all alike: another try of each would wait as long
		}
		return make([][]byte, len(es)), errs
	}
	if err == nil && len(bufs) != len(es) {
		err = errRunLength
	}
	if err != nil {
		// One bad record (corrupt, changed) must not fail its neighbours:
		// read each alone, and let each fail on its own.
		l.log.Warn("loader: a coalesced read failed; reading its samples one by one", "samples", len(es), "err", err)
		bufs = make([][]byte, len(es))
		for i, e := range es {
			bufs[i], errs[i] = l.readPFS(ctx, e, 0, e.Size)
		}
		return bufs, errs
	}
	var total int64
	for _, b := range bufs {
		total += int64(len(b))
	}
	l.model.Observe(srcPFS, total, time.Since(start))
	if len(es) > 1 {
		l.runs.Add(1)
		l.runSamples.Add(int64(len(es)))
	}
	return bufs, errs
}
