package daemon

import (
	"fmt"
	"sync"
	"time"

	"github.com/dlfs/dlfs/allocator"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/daemon/readers"
)

// report hands a rank's loader figures to the allocator, with dlfs's own
// time per file served to the rank's processes since its last report.
func (n *Node) report(r control.Report) (allocator.Advice, error) {
	k := allocator.Key{Job: r.Job, Rank: r.Rank}
	f := allocator.Figures{
		Epoch: r.Epoch, Batch: r.Batch, Workers: r.Workers, Prefetch: r.Prefetch,
		Step: r.Step, Wait: r.Wait, Decode: r.Decode, CPU: r.CPU, Samples: r.Samples, Start: r.Start, Length: r.Length,
	}
	f.Read, f.ReadBySource = n.alloc.readTimes.perFile(k, n.readers, r.Pid)
	adv, err := n.alloc.Report(k, f)
	if err != nil {
		return adv, fmt.Errorf("%w: %s: %v", control.ErrSyntax, r.Line(), err)
	}
	return adv, nil
}

// readTimes keeps, per reporting rank, its stream's figures at its last
// report, so that each report gets the read time of its own interval, and
// the process it reports from, for lastRead.
type readTimes struct {
	mu   sync.Mutex
	last map[allocator.Key]readers.StreamStats
	pids map[allocator.Key]int
}

// lastRead returns when dlfs last served a read to rank k's processes,
// as far as its reports named them (allocator's Config.LastRead).
func (n *Node) lastRead(k allocator.Key) time.Time {
	t := &n.alloc.readTimes
	t.mu.Lock()
	pid := t.pids[k]
	t.mu.Unlock()
	if pid <= 0 || n.readers == nil {
		return time.Time{}
	}
	st, ok := n.readers.Stream(pid)
	if !ok {
		return time.Time{}
	}
	return st.LastRead
}

// maxReadTimes bounds readTimes: past it, the intervals start anew.
const maxReadTimes = 4096

// perFile returns the mean seconds dlfs took per file it served to the
// stream of process pid since k's previous report, and per read request
// by the tier that served it; 0 and nil when it served none (or pid is 0:
// not given).
func (t *readTimes) perFile(k allocator.Key, tr *readers.Tracker, pid int) (float64, map[string]float64) {
	if pid <= 0 || tr == nil {
		return 0, nil
	}
	st, ok := tr.Stream(pid)
	if !ok {
		return 0, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last == nil || len(t.last) >= maxReadTimes {
		t.last = map[allocator.Key]readers.StreamStats{}
		t.pids = map[allocator.Key]int{}
	}
	t.pids[k] = pid
	prev, seen := t.last[k]
	t.last[k] = st
	if !seen || prev.Pid != st.Pid {
		prev = readers.StreamStats{} // the rank's first report, or a new process
	}
	files, secs := st.Files-prev.Files, st.ReadSeconds-prev.ReadSeconds
	if files <= 0 || secs < 0 {
		return 0, nil
	}
	by := map[string]float64{}
	for src, now := range st.Sources {
		was := prev.Sources[src]
		if n := now.Reads - was.Reads; n > 0 {
			by[src] = (now.Seconds - was.Seconds) / float64(n)
		}
	}
	return secs / float64(files), by
}
