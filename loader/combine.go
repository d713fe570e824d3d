package loader

import (
	"context"
	"slices"
	"sync"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/loader/runs"
)

// Demand reads of a packed container are combined when the container is
// busy: at most Config.DemandPerContainer of them run at once; a read that
// finds them all running waits, and when a slot frees, one waiter takes
// every read waiting on the container and reads them in runs of
// neighbours, one request per run (holes wider than the gap limit split a
// run). A read that finds a free slot goes at once, so combining adds no
// latency when the PFS keeps up, and saves requests when it does not. A
// waiting read whose ctx is done leaves at once; the one that serves a
// batch serves it whole (its reads end at the PFS's deadline).

// combiner holds the waiting demand reads per container.
type combiner struct {
	mu     sync.Mutex
	queues map[string]*demandQueue // mu guards queues and every queue
}

type demandQueue struct {
	active  int
	waiting []*demandRead
	cond    *sync.Cond // on combiner.mu: a slot freed, or a batch was served
}

// demandRead is one waiting read; val and err are set before done.
type demandRead struct {
	e     *catalog.Entry
	span  Span
	val   []byte
	err   error
	taken bool // in a batch someone is serving
	done  bool
}

// readDemand reads the whole single-block sample e, which lies at span in
// a container of c, combining with other waiting reads of the container.
func (l *Loader) readDemand(ctx context.Context, c Coalescer, e *catalog.Entry, span Span) ([]byte, error) {
	m := &l.combine
	m.mu.Lock()
	if m.queues == nil {
		m.queues = map[string]*demandQueue{}
	}
	q := m.queues[span.Container]
	if q == nil {
		q = &demandQueue{cond: sync.NewCond(&m.mu)}
		m.queues[span.Container] = q
	}
	limit := l.cfg.DemandPerContainer
	if q.active < limit {
		q.active++
		m.mu.Unlock()
		b, err := l.readPFS(ctx, e, 0, e.Size)
		l.release(span.Container, q)
		return b, err
	}
	me := &demandRead{e: e, span: span}
	q.waiting = append(q.waiting, me)
	stop := context.AfterFunc(ctx, func() { // wakes the wait below
		m.mu.Lock()
		defer m.mu.Unlock()
		q.cond.Broadcast()
	})
	defer stop()
	for !me.done && (me.taken || q.active >= limit) {
		if err := ctx.Err(); err != nil {
			// The reader gave up. Waiting, it leaves the queue; in a
			// batch another serves, its result goes unread. The queue
			// stays: a slot, or the batch, is taken.
			if !me.taken {
				q.waiting = slices.DeleteFunc(q.waiting, func(r *demandRead) bool { return r == me })
			}
			m.mu.Unlock()
			return nil, err
		}
		q.cond.Wait()
	}
	if me.done {
		m.mu.Unlock()
		return me.val, me.err
	}
	batch := q.waiting // me among them
	q.waiting = nil
	for _, r := range batch {
		r.taken = true
	}
	q.active++
	m.mu.Unlock()
	l.serveBatch(c, batch)
	m.mu.Lock()
	for _, r := range batch {
		r.done = true
	}
	q.cond.Broadcast()
	m.mu.Unlock()
	l.release(span.Container, q)
	return me.val, me.err
}

// release frees a slot of q and wakes its waiters; an idle queue is
// dropped.
func (l *Loader) release(container string, q *demandQueue) {
	m := &l.combine
	m.mu.Lock()
	defer m.mu.Unlock()
	q.active--
	q.cond.Broadcast()
	if q.active == 0 && len(q.waiting) == 0 {
		delete(m.queues, container)
	}
}

// serveBatch reads a batch of waiting reads of one container in runs and
// sets each one's result (not done: the caller marks the batch done). The
// reads are for others too: only the PFS's deadline ends them.
func (l *Loader) serveBatch(c Coalescer, batch []*demandRead) {
	spans := make([]Span, len(batch))
	for i, r := range batch {
		spans[i] = r.span
	}
	gap, limit := l.RunLimits()
	for _, run := range runs.Plan(spans, gap, limit) {
		if len(run) == 1 {
			r := batch[run[0]]
			r.val, r.err = l.readPFS(context.Background(), r.e, 0, r.e.Size)
			continue
		}
		es := make([]*catalog.Entry, len(run))
		for k, i := range run {
			es[k] = batch[i].e
		}
		bufs, errs := l.readRun(context.Background(), c, es)
		for k, i := range run {
			batch[i].val, batch[i].err = bufs[k], errs[k]
		}
	}
}
