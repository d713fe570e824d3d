// Package ratelog bounds how often a repeated log line is written: the
// first at once, the rest of an interval counted, and the count carried
// by the next line ("suppressed"). A reader in a retry loop, or a
// stranger knocking on a port, then costs a line per interval, not one per
// try. Every limits one kind of event; Handler limits every message of a
// logger, each on its own.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Every logs an event at most Burst times per Interval (once, if Burst
// is 0): the first at once, the rest of the interval counted, and the
// count ("suppressed") carried by the next line. The zero Interval logs
// every event. Safe for concurrent use; it never blocks on more than its
// own lock.
type Every struct {
	Interval time.Duration
	Burst    int

	mu         sync.Mutex
	start      time.Time // mu guards start, written and suppressed: the interval's
	written    int
	suppressed int64
}

// Warn logs msg with args at WARN, or counts it.
func (e *Every) Warn(log *slog.Logger, msg string, args ...any) {
	e.Log(log, slog.LevelWarn, msg, args...)
}

// Log logs msg with args at level, or counts it.
func (e *Every) Log(log *slog.Logger, level slog.Level, msg string, args ...any) {
	n, ok := e.take(time.Now())
	if !ok {
		return
	}
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	log.Log(context.Background(), level, msg, args...)
}

// take reports whether an event at now is to be written, and how many
// were suppressed before it; an event not written is counted.
func (e *Every) take(now time.Time) (suppressed int64, write bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.start.IsZero() || now.Sub(e.start) >= e.Interval {
		e.start, e.written = now, 0 // a new interval
	}
	if e.written >= max(e.Burst, 1) {
		e.suppressed++
		return 0, false
	}
	n := e.suppressed
	e.written, e.suppressed = e.written+1, 0
	return n, true
}

// maxMessages bounds the messages a Handler keeps a state for; past it, a
// new message is written as it comes (messages are constants in code, so
// this is a guard, not a limit met in practice).
const maxMessages = 4096

// limits is the state a Handler and the handlers derived from it share.
type limits struct {
	interval time.Duration
	burst    int
	level    slog.Level
	mu       sync.Mutex
	byMsg    map[string]*Every // (mu)
}

// Handler passes a record at or above its level through at most burst
// times per interval for each message, counting the rest; records below
// the level pass as they come. A burst lets a few distinct events of one
// kind (three datasets skipped in one file) each say so, while a loop
// costs a few lines per interval.
type Handler struct {
	next slog.Handler
	l    *limits
}

// NewHandler limits next's records at or above level to burst per
// message per interval.
func NewHandler(next slog.Handler, interval time.Duration, burst int, level slog.Level) *Handler {
	return &Handler{next: next, l: &limits{interval: interval, burst: burst, level: level, byMsg: map[string]*Every{}}}
}

func (h *Handler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.next.Enabled(ctx, level)
}

func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < h.l.level {
		return h.next.Handle(ctx, r)
	}
	h.l.mu.Lock()
	e := h.l.byMsg[r.Message]
	if e == nil && len(h.l.byMsg) < maxMessages {
		e = &Every{Interval: h.l.interval, Burst: h.l.burst}
		h.l.byMsg[r.Message] = e
	}
	h.l.mu.Unlock()
	if e == nil {
		return h.next.Handle(ctx, r)
	}
	n, ok := e.take(time.Now())
	if !ok {
		return nil
	}
	if n > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int64("suppressed", n))
	}
	return h.next.Handle(ctx, r)
}

func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &Handler{next: h.next.WithAttrs(attrs), l: h.l}
}

func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{next: h.next.WithGroup(name), l: h.l}
}
