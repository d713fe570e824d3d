package loader

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"
)

// # Deadlines
//
// A PFS that stops answering must not hang readers, the prefetcher or the
// daemon's exit. Every read of SOURCE runs on a goroutine of its own and
// holds one of Config.PFSCalls slots; its caller waits until the read
// ends, Config.PFSTimeout passes or the loader closes, whichever comes
// first. A system call blocked in a PFS client cannot be cancelled, so a
// read past its deadline is abandoned: its goroutine, its buffer and its
// slot stay taken until the kernel answers. The slots bound them: when a
// PFS hangs for good, later reads wait for a slot until their own
// deadline and fail, rather than pile up goroutines and memory.
//
// The reader that starts a fetch waits on SOURCE with its own context (a
// FUSE request's is done when the kernel interrupts it: Ctrl-C of the
// reader); readers that share the fetch wait with theirs, and fetch again
// if its starter gave up.

// ErrPFSTimeout means a read of SOURCE did not end by its deadline; the
// reader gets ETIMEDOUT.
var ErrPFSTimeout = fmt.Errorf("loader: the PFS did not answer in time (%w)", syscall.ETIMEDOUT)

// errNoSlot means a read of SOURCE found no slot by its deadline: it says
// nothing of the file it was for, so it is not remembered (failures.go).
var errNoSlot = fmt.Errorf("%w: no slot", ErrPFSTimeout)

// ErrClosed means the loader closed while a read waited; the reader gets
// EIO.
var ErrClosed = fmt.Errorf("loader: closed (%w)", syscall.EIO)

// pfsCall runs read, a read of SOURCE (what names it for errors), under a
// slot and a deadline (see Deadlines); it stops waiting early, with ctx's
// error, when ctx is done.
func pfsCall[T any](ctx context.Context, l *Loader, what string, read func() (T, error)) (T, error) {
	var zero T
	timer := time.NewTimer(l.cfg.PFSTimeout)
	defer timer.Stop()
	select {
	case l.pfsSlots <- struct{}{}:
	case <-timer.C:
		return zero, fmt.Errorf("%w: %s: all %d reads of SOURCE are taken, %d of them past their deadline; check the PFS, or raise --pfs-timeout (now %s)",
			errNoSlot, what, cap(l.pfsSlots), l.pfsStuck.Load(), l.cfg.PFSTimeout)
	case <-l.closed:
		return zero, fmt.Errorf("%w: %s", ErrClosed, what)
	case <-ctx.Done():
		return zero, ctx.Err()
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	var state atomic.Int32 // running, then finished or abandoned, whichever first
	go func() {
		defer func() { <-l.pfsSlots }()
		var r result
		func() {
			defer func() {
				if p := recover(); p != nil { // a decoder's bug must not kill the daemon
					r.err = fmt.Errorf("loader: internal error reading %s: %v", what, p)
				}
			}()
			r.v, r.err = read()
		}()
		done <- r
		if !state.CompareAndSwap(running, finished) {
			l.pfsStuck.Add(-1) // abandoned: the kernel answered at last
		}
	}()
	var err error
	select {
	case r := <-done:
		return r.v, r.err
	case <-timer.C:
		err = fmt.Errorf("%w: %s: no answer within %s; check the PFS, or raise --pfs-timeout", ErrPFSTimeout, what, l.cfg.PFSTimeout)
	case <-l.closed:
		err = fmt.Errorf("%w: %s", ErrClosed, what)
	case <-ctx.Done():
		err = ctx.Err()
	}
	l.pfsStuck.Add(1)
	if !state.CompareAndSwap(running, abandoned) {
		l.pfsStuck.Add(-1)
		r := <-done // it finished as the wait ended
		return r.v, r.err
	}
	return zero, err
}

// States of a PFS read.
const (
	running int32 = iota
	finished
	abandoned
)
