package loader

import (
	"context"
	"fmt"
	"sync"
)

// flight deduplicates concurrent fetches of the same block: the first
// caller runs fn, later callers wait for its result. A fetch is shared
// only by callers that want the same version of the block (its key and
// tag): a reader of a file's new version never gets the bytes of a fetch
// of the old one still under way. A waiter that gives up leaves the fetch
// to the others; when the one that started it gives up, it ends, and the
// others fetch again (see do).
type flight struct {
	stop    <-chan struct{} // closed when the loader closes: waiters leave
	running sync.WaitGroup  // fetches running
	mu      sync.Mutex
	stopped bool                // (mu) Close began: no fetch starts
	calls   map[flightKey]*call // mu guards calls and unreported
	// unreported counts, per key, the demand reads that missed RAM and
	// the stage and have not yet returned, for their callers to report
	// them. Until then, the prefetcher has not seen the sample consumed,
	// and a prefetch of the key would read it a second time.
	unreported map[string]int
}

// flightKey names one version of a block.
type flightKey struct {
	key string
	tag uint64
}

type call struct {
	done chan struct{}
	fetch
	err error
	// read says a demand read ran the call or shares it. A read that ran
	// it keeps the block itself (in RAM, or on the stage if it read only
	// part of it), so a prefetch that shares the call must not stage it
	// again: the copy would sit on the stage, never taken, until the
	// cursor passed it.
	read bool // f.mu guards it
}

// fetch is a block as a flight returns it, with the tier that supplied it.
type fetch struct {
	val []byte
	src tier
	sum uint32 // integrity.Sum of val under the block's tag
}

// do runs fn once per key at a time and reports whether this caller shared
// another's result. why says who calls: a reader marks the call read.
//
// The caller that starts the call runs fn, with its own ctx: its reads of
// SOURCE end when ctx does (pfsCall), and the call then fails with ctx's
// error, which a caller that shared it takes as no answer (block fetches
// again). The callers that share a call wait for it until their own ctx is
// done (a reader interrupted by a signal, a warm-up stopped) or the
// flight stops. The error is ctx's, or errStopped; a call's own error is
// in the call.
func (f *flight) do(ctx context.Context, key string, tag uint64, why purpose, fn func(context.Context) (fetch, error)) (*call, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err // no fetch for a caller that gave up
	}
	fk := flightKey{key, tag}
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		return nil, false, errStopped
	}
	if f.calls == nil {
		f.calls = make(map[flightKey]*call)
	}
	if c, ok := f.calls[fk]; ok {
		c.read = c.read || why == forReader
		f.mu.Unlock()
		return c, true, f.wait(ctx, c)
	}
	c := &call{done: make(chan struct{}), read: why == forReader}
	f.calls[fk] = c
	f.running.Add(1)
	f.mu.Unlock()

	func() {
		defer f.running.Done()
		defer func() {
			f.mu.Lock()
			delete(f.calls, fk)
			f.mu.Unlock()
			close(c.done)
		}()
		c.fetch, c.err = fn(ctx)
	}()
	if c.err != nil && ctx.Err() != nil {
		return c, false, ctx.Err()
	}
	return c, false, nil
}

// errStopped means the flight was stopped (the loader closed) while a
// caller waited.
var errStopped = fmt.Errorf("%w: a fetch was waited for", ErrClosed)

// wait waits for c, ctx or stop, whichever comes first.
func (f *flight) wait(ctx context.Context, c *call) error {
	select {
	case <-c.done:
		return nil
	default:
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-f.stop:
		return errStopped
	}
}

// claim registers a call for every block (keys[i] of version tags[i]) no
// fetch is running for, and returns them by position (nil where another
// fetch runs: that block is left to it; all nil once stopped). Whoever
// claims must finish every call it got.
func (f *flight) claim(keys []string, tags []uint64) []*call {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*call, len(keys))
	if f.stopped {
		return out
	}
	if f.calls == nil {
		f.calls = make(map[flightKey]*call)
	}
	for i, k := range keys {
		fk := flightKey{k, tags[i]}
		if _, busy := f.calls[fk]; busy {
			continue
		}
		c := &call{done: make(chan struct{})}
		f.calls[fk] = c
		out[i] = c
	}
	return out
}

// finish completes a claimed call and wakes its waiters.
func (f *flight) finish(key string, tag uint64, c *call, v fetch, err error) {
	c.fetch, c.err = v, err
	f.mu.Lock()
	delete(f.calls, flightKey{key, tag})
	f.mu.Unlock()
	close(c.done)
}

// stopAndWait makes every later do and claim fail or claim nothing, and
// waits for the fetches running (each ends at once: Close ends their
// waits on SOURCE).
func (f *flight) stopAndWait() {
	f.mu.Lock()
	f.stopped = true
	f.mu.Unlock()
	f.running.Wait()
}

// hold marks key as fetched by a demand read not yet reported.
func (f *flight) hold(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unreported == nil {
		f.unreported = make(map[string]int)
	}
	f.unreported[key]++
}

// release ends a hold.
func (f *flight) release(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unreported[key]--; f.unreported[key] <= 0 {
		delete(f.unreported, key)
	}
}

// held reports whether a demand read holds key.
func (f *flight) held(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.unreported[key] > 0
}

// busy reports whether a fetch of key, tagged tag, is in flight.
func (f *flight) busy(key string, tag uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.calls[flightKey{key, tag}]
	return ok
}
