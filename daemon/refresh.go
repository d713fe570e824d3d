package daemon

import (
	"context"
	"sync"
	"time"

	"github.com/dlfs/dlfs/catalog"
)

// rescans are the node's rescans of SOURCE besides its keeper's.
type rescans struct {
	control *refresher // those `refresh` lines ask for
	catchUp catchUp    // those of requests that found a saved catalog behind SOURCE (checked.go)
}

// refresher runs the rescans that `refresh` lines ask for, one at a time
// and outside the control plane's lock: a refresh of 10 M files takes a
// minute and one of a PFS that hangs until the catalog's stall timeout,
// and neither may hold up job lines, reports or warm-ups. A request made
// while a rescan runs is served by the next one, which starts when it
// ends (the running one may have passed what changed already); every
// request made meanwhile shares that next one. The writer of a `refresh`
// line waits for its rescan, unless its write is interrupted: the rescan
// then goes on without it.
type refresher struct {
	run  func(context.Context) (catalog.Diff, error)
	ctx  context.Context // ends at Close
	stop context.CancelFunc

	mu      sync.Mutex
	running *refreshRun // (mu) the rescan under way
	next    *refreshRun // (mu) the one to start when it ends
	last    refreshStatus
	wg      sync.WaitGroup
}

// refreshRun is one rescan; err is set before done closes.
type refreshRun struct {
	done chan struct{}
	err  error
}

// refreshStatus is how the last rescan went, for stats.
type refreshStatus struct {
	Running bool      `json:"running"`
	Error   string    `json:"error,omitempty"` // the last rescan's error; "" if it succeeded
	Ended   time.Time `json:"ended"`
	// What the last rescan found: paths added, removed and changed
	// (a path whose type changed counts as removed and added), and how
	// long it took.
	Added   int     `json:"added"`
	Removed int     `json:"removed"`
	Changed int     `json:"changed"`
	Seconds float64 `json:"seconds"`
}

func newRefresher(run func(context.Context) (catalog.Diff, error)) *refresher {
	ctx, stop := context.WithCancel(context.Background())
	return &refresher{run: run, ctx: ctx, stop: stop}
}

// refresh asks for a rescan that starts no earlier than now and waits for
// it, or for ctx.
func (r *refresher) refresh(ctx context.Context) error {
	r.mu.Lock()
	run := r.next
	switch {
	case r.ctx.Err() != nil:
		r.mu.Unlock()
		return r.ctx.Err()
	case r.running == nil:
		run = &refreshRun{done: make(chan struct{})}
		r.start(run)
	case run == nil:
		run = &refreshRun{done: make(chan struct{})}
		r.next = run
	}
	r.mu.Unlock()
	select {
	case <-run.done:
		return run.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// start runs run; r.mu is held.
func (r *refresher) start(run *refreshRun) {
	r.running = run
	r.last.Running = true
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		began := time.Now()
		var d catalog.Diff
		d, run.err = r.run(r.ctx)
		r.mu.Lock()
		r.last = refreshStatus{Ended: time.Now(), Seconds: time.Since(began).Seconds()}
		if run.err != nil {
			r.last.Error = run.err.Error()
		} else {
			r.last.Added, r.last.Removed, r.last.Changed = len(d.Added), len(d.Removed), len(d.Changed)
		}
		next := r.next
		r.running, r.next = nil, nil
		if next != nil {
			r.start(next)
		}
		r.mu.Unlock()
		close(run.done)
	}()
}

// status reports how the last rescan went.
func (r *refresher) status() refreshStatus {
	if r == nil {
		return refreshStatus{} // not mounted yet
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// close cancels the rescan under way and waits for it (the catalog's
// scan gives up on SOURCE at once when its context ends). It may be
// called again.
func (r *refresher) close() {
	r.mu.Lock()
	r.stop() // under mu: refresh checks the context and starts a run under it
	r.mu.Unlock()
	r.wg.Wait()
}
