package loader

import (
	"sync"

	"github.com/dlfs/dlfs/ssdstore"
)

// flight deduplicates concurrent fetches of the same key: the first caller
// runs fn, later callers wait for its result. Unlike a context-aware group,
// a waiter that gives up does not cancel the shared fetch, whose result is
// cached for the next reader anyway.
type flight struct {
	mu    sync.Mutex
	calls map[string]*call // mu guards calls
}

type call struct {
	done chan struct{}
	val  []byte
	sum  uint32 // CRC-32C of val
	src  tier
	err  error
}

// do runs fn once per key at a time and reports whether this caller shared
// another's result.
func (f *flight) do(key string, fn func() ([]byte, tier, error)) (*call, bool) {
	f.mu.Lock()
	if f.calls == nil {
		f.calls = make(map[string]*call)
	}
	if c, ok := f.calls[key]; ok {
		f.mu.Unlock()
		<-c.done
		return c, true
	}
	c := &call{done: make(chan struct{})}
	f.calls[key] = c
	f.mu.Unlock()

	c.val, c.src, c.err = fn()
	if c.err == nil {
		c.sum = ssdstore.Checksum(c.val)
	}
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
func (f *flight) finish(key string, c *call, val []byte, src tier, err error) {
	c.val, c.src, c.err = val, src, err
	if err == nil {
		c.sum = ssdstore.Checksum(val)
	}
	f.mu.Lock()
	delete(f.calls, key)
	f.mu.Unlock()
	close(c.done)
}
