// Package accesslog streams one line per FUSE request to whoever reads
// the mount's .dlfs/accesslog (JuiceFS's .accesslog), and keeps nothing
// while nobody does.
//
// # The pipe
//
// Files on a dlfs mount are never opened (the kernel is told so once, for
// the whole mount, so that page-cached reads need no round trip), so a
// pseudo-file cannot hold a stream per reader. The access log is a named
// pipe instead: the kernel holds the pipe, the reader (cat, tail) opens
// its read end like any FIFO, and the daemon opens the write end itself,
// through its own mount. Run polls for a reader every PollInterval with a
// non-blocking open, which fails with ENXIO until one is waiting; opening
// blocks the reader until then.
//
// # Cost
//
// Add is one atomic load while nobody reads. While someone does, a
// request's line is formatted and appended to a buffer (at most
// Config.Buffer bytes: beyond, lines are dropped and counted, and the
// reader is told how many in a "# dropped N lines" line); Run writes the
// buffer into the pipe as the reader takes it. When the reader closes,
// the next write fails, the buffer is dropped and Run polls again.
//
// # Lines
//
//	2026-11-24T09:30:01.123456Z pid=4711 op=read path=train/c1/0001.jpg offset=0 bytes=131072 source=ram seconds=0.000045 status=ok
//
// pid is the calling thread's id, as FUSE gives it (a process's first
// thread has the process's id); paths are relative to the mount's root and quoted (Go syntax) when they
// hold a space, a quote, an equals sign or anything unprintable.
package accesslog

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode"

	"golang.org/x/sys/unix"
)

// Config configures a Log.
type Config struct {
	// Buffer bounds the bytes waiting for the reader; lines beyond are
	// dropped and counted.
	Buffer int // default 4 MiB
	// PollInterval is how often Run looks for a reader.
	PollInterval time.Duration // default 200ms
	Logger       *slog.Logger  // nil: discard
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Buffer: 4 << 20, PollInterval: 200 * time.Millisecond}
}

// Record is one FUSE request.
type Record struct {
	Start  time.Time
	Pid    uint32
	Op     string // lookup, getattr, read, readdir, ...
	Path   string // relative to the mount's root
	Offset int64  // reads: where; -1 for others
	Bytes  int    // bytes returned or written
	Source string // reads: the tier that served them
	Took   time.Duration
	Status syscall.Errno // 0: OK
}

// Log is the access log. Safe for concurrent use; Add never blocks.
type Log struct {
	cfg    Config
	log    *slog.Logger
	active atomic.Bool // a reader is attached

	mu      sync.Mutex
	buf     []byte // lines waiting for the reader (mu)
	dropped int    // lines dropped since the last written (mu)
	wake    chan struct{}

	lines, droppedAll, readers atomic.Int64 // for Stats
}

// Stats are the log's figures, as .dlfs/stats shows them.
type Stats struct {
	Attached bool  `json:"attached"` // a reader is attached now
	Readers  int64 `json:"readers"`  // readers attached so far
	Lines    int64 `json:"lines"`    // lines logged
	Dropped  int64 `json:"dropped"`  // lines dropped for a reader that fell behind
}

// Stats returns the log's figures. Safe for concurrent use.
func (l *Log) Stats() Stats {
	return Stats{Attached: l.Active(), Readers: l.readers.Load(), Lines: l.lines.Load(), Dropped: l.droppedAll.Load()}
}

// New returns a log with no reader.
func New(cfg Config) *Log {
	def := DefaultConfig()
	if cfg.Buffer <= 0 {
		cfg.Buffer = def.Buffer
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = def.PollInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Log{cfg: cfg, log: cfg.Logger, wake: make(chan struct{}, 1)}
}

// Active reports whether a reader is attached: only then is a Record
// worth making. A nil Log is never active.
func (l *Log) Active() bool { return l != nil && l.active.Load() }

// Add logs r if a reader is attached.
func (l *Log) Add(r Record) {
	if !l.Active() {
		return
	}
	var tmp [256]byte
	line := Format(tmp[:0], r)
	l.mu.Lock()
	if len(l.buf)+len(line) > l.cfg.Buffer {
		l.dropped++
		l.droppedAll.Add(1)
	} else {
		l.buf = append(l.buf, line...)
		l.lines.Add(1)
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Format appends r's line to b.
func Format(b []byte, r Record) []byte {
	b = r.Start.UTC().AppendFormat(b, "2006-01-02T15:04:05.000000Z")
	b = append(b, " pid="...)
	b = strconv.AppendUint(b, uint64(r.Pid), 10)
	b = append(b, " op="...)
	b = append(b, r.Op...)
	b = append(b, " path="...)
	b = appendPath(b, r.Path)
	if r.Offset >= 0 {
		b = append(b, " offset="...)
		b = strconv.AppendInt(b, r.Offset, 10)
	}
	b = append(b, " bytes="...)
	b = strconv.AppendInt(b, int64(r.Bytes), 10)
	if r.Source != "" {
		b = append(b, " source="...)
		b = append(b, r.Source...)
	}
	b = append(b, " seconds="...)
	b = strconv.AppendFloat(b, r.Took.Seconds(), 'f', 6, 64)
	b = append(b, " status="...)
	if r.Status == 0 {
		b = append(b, "ok"...)
	} else {
		b = append(b, errnoName(r.Status)...)
	}
	return append(b, '\n')
}

func appendPath(b []byte, p string) []byte {
	if p == "" {
		return append(b, '/')
	}
	for _, c := range p {
		if c == ' ' || c == '"' || c == '=' || c == '\\' || !unicode.IsPrint(c) {
			return strconv.AppendQuote(b, p)
		}
	}
	return append(b, p...)
}

// errnoName is an errno's symbol (ENOENT), or its number.
func errnoName(e syscall.Errno) string {
	if name := unix.ErrnoName(e); name != "" {
		return name
	}
	return "errno" + strconv.Itoa(int(e))
}

// Opener opens the pipe's write end without blocking; it fails with
// ENXIO while no reader has it open.
type Opener func() (io.WriteCloser, error)

// Run attaches readers as they come, through open, and writes the log to
// them until ctx ends. It returns when ctx ends, with the pipe closed.
func (l *Log) Run(ctx context.Context, open Opener) {
	t := time.NewTicker(l.cfg.PollInterval)
	defer t.Stop()
	for {
		w, err := open()
		switch {
		case err == nil:
			l.serve(ctx, w)
		case !errors.Is(err, syscall.ENXIO):
			l.log.Debug("access log: opening the pipe", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// serve writes the log to w until the reader goes or ctx ends.
func (l *Log) serve(ctx context.Context, w io.WriteCloser) {
	stop := context.AfterFunc(ctx, func() { _ = w.Close() }) // unblocks a write
	defer func() {
		stop()
		_ = w.Close()
		l.active.Store(false)
		l.mu.Lock()
		l.buf, l.dropped = nil, 0
		l.mu.Unlock()
	}()
	l.active.Store(true)
	l.readers.Add(1)
	var out []byte
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		}
		l.mu.Lock()
		out, l.buf = l.buf, out[:0]
		dropped := l.dropped
		l.dropped = 0
		l.mu.Unlock()
		if dropped > 0 {
			out = append([]byte("# dropped "+strconv.Itoa(dropped)+" lines: the reader fell behind\n"), out...)
		}
		if len(out) == 0 {
			continue
		}
		if _, err := w.Write(out); err != nil {
			return // EPIPE: the reader closed
		}
	}
}
