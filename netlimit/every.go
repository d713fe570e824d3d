package netlimit

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Every logs an event at most once per Interval: the first at once, the
// rest of the interval counted, and the count ("suppressed") carried by
// the next line. The zero Interval logs every event. Safe for concurrent
// use; it never blocks on more than its own lock.
type Every struct {
	Interval time.Duration

	mu         sync.Mutex
	last       time.Time // mu guards last and suppressed
	suppressed int64
}

// Warn logs msg with args at WARN, or counts it.
func (e *Every) Warn(log *slog.Logger, msg string, args ...any) {
	e.Log(log, slog.LevelWarn, msg, args...)
}

// Log logs msg with args at level, or counts it.
func (e *Every) Log(log *slog.Logger, level slog.Level, msg string, args ...any) {
	now := time.Now()
	e.mu.Lock()
	if !e.last.IsZero() && now.Sub(e.last) < e.Interval {
		e.suppressed++
		e.mu.Unlock()
		return
	}
	n := e.suppressed
	e.last, e.suppressed = now, 0
	e.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	log.Log(context.Background(), level, msg, args...)
}
