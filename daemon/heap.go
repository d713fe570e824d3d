package daemon

import (
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/dlfs/dlfs/ramcache"
)

// The heap's slack
//
// Most of the daemon's heap is the RAM tier's blocks: bytes that live
// until evicted and hold no pointers. Go's collector lets the heap grow by
// GOGC percent of everything live before it collects, so a 3 GB tier would
// let 3 GB of garbage pile up beside it: the daemon's memory would be
// twice its cache. The governor instead collects when the heap reaches
// what is live plus half of what is live outside the tier (at least
// headroom): GOGC 50 on the catalog, plans and buffers, none on the
// tier's blocks. It turns GOGC off and moves the soft memory limit, every
// tick, to that figure with the tier's current bytes. The limit is never
// below what is live, so the collector cannot be driven to run without
// end (and the runtime caps it at half the CPU if it were).
//
// The limit follows what the last collection found live, so it does not
// fall when the tier lets go of much of the heap at once (its blocks moved
// into backing files for passthrough, or dropped by a refresh): with the
// reads served by the kernel nothing may allocate, nothing collects, and
// the freed blocks would stay in the daemon's memory beside the backing
// files that replaced them. So when the tier's heap bytes fall by
// heapHeadroom from their highest since the last such release, the
// governor collects and returns the freed memory to the system.

const (
	heapTick     = 100 * time.Millisecond
	heapHeadroom = 64 << 20
)

// The governor is the process's: nodes in one process (tests, tools)
// register their tiers with it, and it runs while any is registered.
var governor struct {
	mu    sync.Mutex
	tiers map[*ramcache.Cache]bool
	stop  chan struct{} // closes the running governor
	done  chan struct{} // closed when it has restored the settings
}

// governHeap registers ram's blocks with the governor, starting it if it
// is not running; the returned function unregisters them, and stops the
// governor and restores the collector's settings after the last.
func governHeap(ram *ramcache.Cache) (release func() error) {
	governor.mu.Lock()
	defer governor.mu.Unlock()
	if governor.tiers == nil {
		governor.tiers = map[*ramcache.Cache]bool{}
		prev := governor.done // a run still restoring the settings, or nil
		governor.stop, governor.done = make(chan struct{}), make(chan struct{})
		go runGovernor(prev, governor.stop, governor.done)
	}
	governor.tiers[ram] = true
	return func() error {
		governor.mu.Lock()
		delete(governor.tiers, ram)
		var stop, done chan struct{}
		if len(governor.tiers) == 0 {
			stop, done, governor.tiers = governor.stop, governor.done, nil
		}
		governor.mu.Unlock()
		if stop != nil {
			close(stop)
			<-done
		}
		return nil
	}
}

// held is the heap bytes of every registered tier: not its backing
// files, which are memory files outside the heap.
func held() int64 {
	governor.mu.Lock()
	defer governor.mu.Unlock()
	var n int64
	for c := range governor.tiers {
		s := c.Stats()
		n += s.Bytes - s.Backing.Bytes
	}
	return n
}

// limit is the soft memory limit for live bytes of heap of which held are
// the tiers' now.
func limit(live, held int64) int64 {
	other := max(live-held, 0)
	return held + other + max(other/2, heapHeadroom)
}

// releaseDue reports whether the tier's heap bytes, now held, fell by
// heapHeadroom from their highest since the last release, peak, and
// returns the new peak.
func releaseDue(peak, held int64) (int64, bool) {
	if peak = max(peak, held); peak-held >= heapHeadroom {
		return held, true
	}
	return peak, false
}

func runGovernor(prev <-chan struct{}, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	if prev != nil {
		<-prev // its restore must not undo this run's settings
	}
	oldPercent := debug.SetGCPercent(-1)
	oldLimit := debug.SetMemoryLimit(-1)
	defer func() {
		debug.SetMemoryLimit(oldLimit)
		debug.SetGCPercent(oldPercent)
	}()
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	t := time.NewTicker(heapTick)
	defer t.Stop()
	var peak int64 // the tier's heap bytes at their highest since the last release
	for {
		h := held()
		var release bool
		if peak, release = releaseDue(peak, h); release {
			debug.FreeOSMemory()
		}
		metrics.Read(sample)
		var live int64
		if sample[0].Value.Kind() == metrics.KindUint64 {
			live = int64(sample[0].Value.Uint64())
		}
		// Blocks added since the last collection are live too.
		debug.SetMemoryLimit(limit(max(live, h), h))
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}
