package loader

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlfs/dlfs/source"
)

// # Failures
//
// A read of SOURCE that fails is remembered, by path and version, for
// Config.FailureTTL: a reader that retries a file that changed, vanished
// or cannot be read gets the same error at once, without an open on the
// PFS's metadata server per try. A refresh forgets the file (Invalidate),
// and a new version is another key. At most maxFailures are remembered;
// past that the expired go first, then any.

const maxFailures = 4096

type failKey struct {
	path string
	v    source.Version
}

type failure struct {
	err   error
	until time.Time
}

type failures struct {
	mu sync.Mutex
	m  map[failKey]failure // (mu)
}

// get returns the error remembered for key, if it has not expired.
func (f *failures) get(key failKey, now time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if x, ok := f.m[key]; ok {
		if now.Before(x.until) {
			return x.err
		}
		delete(f.m, key)
	}
	return nil
}

// put remembers err for key until now+ttl, unless it says nothing of the
// file (the loader closed, a reader gave up, no slot was free).
func (f *failures) put(key failKey, err error, now time.Time, ttl time.Duration) {
	if ttl <= 0 || errors.Is(err, ErrClosed) || errors.Is(err, errStopped) || errors.Is(err, errNoSlot) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[failKey]failure)
	}
	if len(f.m) >= maxFailures {
		for k, x := range f.m {
			if !now.Before(x.until) {
				delete(f.m, k)
			}
		}
		for k := range f.m {
			if len(f.m) < maxFailures {
				break
			}
			delete(f.m, k)
		}
	}
	f.m[key] = failure{fmt.Errorf("%w (the last read failed less than %s ago; not retried yet)", err, ttl), now.Add(ttl)}
}

// forget drops what is remembered of key.
func (f *failures) forget(key failKey) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, key)
}

// len is how many failures are remembered.
func (f *failures) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.m)
}
