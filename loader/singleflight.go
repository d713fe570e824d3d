package loader

import "sync"

// flight deduplicates concurrent fetches of the same key: the first caller
// runs fn, later callers wait for its result. Unlike a context-aware group,
// a waiter that gives up does not cancel the shared fetch, whose result is
// cached for the next reader anyway.
type flight struct {
	mu    sync.Mutex
	calls map[string]*call // mu guards calls and unreported
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
func (f *flight) do(key string, why purpose, fn func() (fetch, error)) (*call, bool) {
	f.mu.Lock()
	if f.calls == nil {
		f.calls = make(map[string]*call)
	}
	if c, ok := f.calls[key]; ok {
		c.read = c.read || why == forReader
		f.mu.Unlock()
		<-c.done
		return c, true
	}
	c := &call{done: make(chan struct{}), read: why == forReader}
	f.calls[key] = c
	f.mu.Unlock()

	c.fetch, c.err = fn()
	f.mu.Lock()
	delete(f.calls, key)
	f.mu.Unlock()
	close(c.done)
	return c, false
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
