package loader

import (
	"context"
	"fmt"
	"sync"
)

// flight deduplicates concurrent fetches of the same key: the first caller
// starts fn, later callers wait for its result. Unlike a context-aware group,
// a waiter that gives up does not cancel the shared fetch, whose result is
// cached for the next reader anyway.
type flight struct {
	stop    <-chan struct{} // closed when the loader closes: waiters leave
	running sync.WaitGroup  // fetches running on the flight's goroutines
	mu      sync.Mutex
	calls   map[string]*call // mu guards calls and unreported
	// unreported counts, per key, the demand reads that missed RAM and
	// the stage and have not yet reported the read to the stage. Until
	// they do, the prefetcher has not seen the sample consumed, and a
	// prefetch of the key would read it a second time.
	unreported map[string]int
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
// fn runs on a goroutine of the flight's, so that every caller, the one
// that started it included, can stop waiting when its ctx is done (a
// reader interrupted by a signal, a warm-up stopped) or the flight is
// stopped; fn goes on for the others, and its result is kept as usual.
// The error is ctx's, or errStopped; a call's own error is in the call.
func (f *flight) do(ctx context.Context, key string, why purpose, fn func() (fetch, error)) (*call, bool, error) {
	f.mu.Lock()
	if f.calls == nil {
		f.calls = make(map[string]*call)
	}
	if c, ok := f.calls[key]; ok {
		c.read = c.read || why == forReader
		f.mu.Unlock()
		return c, true, f.wait(ctx, c)
	}
	c := &call{done: make(chan struct{}), read: why == forReader}
	f.calls[key] = c
	f.running.Add(1)
	f.mu.Unlock()

	go func() {
		defer f.running.Done()
		defer func() {
			if p := recover(); p != nil {
				c.fetch, c.err = fetch{}, fmt.Errorf("loader: internal error fetching %q: %v", key, p)
			}
			f.mu.Lock()
			delete(f.calls, key)
			f.mu.Unlock()
			close(c.done)
		}()
		c.fetch, c.err = fn()
	}()
	return c, false, f.wait(ctx, c)
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

// claim registers a call for every key no fetch is running for, and
// returns them by position (nil where another fetch runs: that key is
// left to it). Whoever claims must finish every call it got.
func (f *flight) claim(keys []string) []*call {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls == nil {
		f.calls = make(map[string]*call)
	}
	out := make([]*call, len(keys))
	for i, k := range keys {
		if _, busy := f.calls[k]; busy {
			continue
		}
		c := &call{done: make(chan struct{})}
		f.calls[k] = c
		out[i] = c
	}
	return out
}

// finish completes a claimed call and wakes its waiters.
func (f *flight) finish(key string, c *call, v fetch, err error) {
	c.fetch, c.err = v, err
	f.mu.Lock()
	delete(f.calls, key)
	f.mu.Unlock()
	close(c.done)
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
