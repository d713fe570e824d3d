package accesslog

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestFormat(t *testing.T) {
	at := time.Date(2026, 11, 24, 9, 30, 1, 123456789, time.UTC)
	for _, c := range []struct {
		r    Record
		want string
	}{
		{Record{Start: at, Pid: 4711, Op: "read", Path: "train/c1/0001.jpg", Offset: 0, Bytes: 131072, Source: "ram", Took: 45 * time.Microsecond},
			"2026-11-24T09:30:01.123456Z pid=4711 op=read path=train/c1/0001.jpg offset=0 bytes=131072 source=ram seconds=0.000045 status=ok\n"},
		{Record{Start: at, Pid: 1, Op: "lookup", Path: "a b=\"c\"", Offset: -1, Took: time.Second, Status: syscall.ENOENT},
			"2026-11-24T09:30:01.123456Z pid=1 op=lookup path=\"a b=\\\"c\\\"\" bytes=0 seconds=1.000000 status=ENOENT\n"},
		{Record{Start: at, Op: "getattr", Offset: -1, Status: syscall.Errno(200)},
			"2026-11-24T09:30:01.123456Z pid=0 op=getattr path=/ bytes=0 seconds=0.000000 status=errno200\n"},
		{Record{Start: at, Op: "lookup", Path: "x\n", Offset: -1},
			"2026-11-24T09:30:01.123456Z pid=0 op=lookup path=\"x\\n\" bytes=0 seconds=0.000000 status=ok\n"},
	} {
		if got := string(Format(nil, c.r)); got != c.want {
			t.Errorf("got  %q\nwant %q", got, c.want)
		}
	}
}

// fifo makes a named pipe and an Opener for its write end, as the daemon
// opens the one on its mount.
func fifo(t *testing.T) (string, Opener) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "accesslog")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, func() (io.WriteCloser, error) {
		return os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestStream: nothing is kept while nobody reads; a reader gets a line per
// record from when it attached; when it closes, the log goes quiet again;
// a second reader is served too; Run ends with its context.
func TestStream(t *testing.T) {
	p, open := fifo(t)
	l := New(Config{PollInterval: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx, open) }()
	defer func() { cancel(); <-done }()

	l.Add(Record{Op: "read", Path: "before", Offset: 0})
	l.mu.Lock()
	kept := len(l.buf)
	l.mu.Unlock()
	if l.Active() || kept != 0 {
		t.Fatalf("no reader, yet active %v with %d bytes kept", l.Active(), kept)
	}
	for round := range 2 {
		f, err := os.Open(p) // blocks until Run opens the write end
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the reader to attach", l.Active)
		for i := range 3 {
			l.Add(Record{Op: "read", Path: "f" + string(rune('0'+i)), Pid: uint32(round), Offset: int64(i)})
		}
		sc := bufio.NewScanner(f)
		for i := range 3 {
			if !sc.Scan() {
				t.Fatalf("round %d: line %d: %v", round, i, sc.Err())
			}
			if line := sc.Text(); !strings.Contains(line, " path=f"+string(rune('0'+i))+" ") {
				t.Errorf("round %d: line %d: %q", round, i, line)
			}
		}
		f.Close()
		// The writer finds the reader gone at its next write.
		waitFor(t, "the log to go quiet", func() bool {
			l.Add(Record{Op: "getattr", Offset: -1})
			return !l.Active()
		})
	}
}

// TestDropped: a reader that falls behind loses lines, and is told how
// many.
func TestDropped(t *testing.T) {
	p, open := fifo(t)
	l := New(Config{PollInterval: 5 * time.Millisecond, Buffer: 300})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx, open) }()
	defer func() { cancel(); <-done }()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	waitFor(t, "the reader to attach", l.Active)
	l.mu.Lock() // hold the writer off while lines pile up
	for range 10 {
		l.buf = append(l.buf, "x\n"...)
	}
	l.buf = append(l.buf, make([]byte, 280)...)
	l.mu.Unlock()
	for range 5 {
		l.Add(Record{Op: "read", Path: "late", Offset: 0}) // each beyond the 300 bytes
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4096), 4096)
	found := false
	for !found && sc.Scan() {
		found = strings.HasPrefix(sc.Text(), "# dropped ")
	}
	if !found {
		t.Fatal("no line tells the reader of dropped lines")
	}
}

// BenchmarkFormat is what a logged request costs while a reader is
// attached: its line.
func BenchmarkFormat(b *testing.B) {
	r := Record{Start: time.Now(), Pid: 4711, Op: "read", Path: "train/n01440764/n01440764_10026.JPEG", Bytes: 131072, Source: "ram", Took: 45 * time.Microsecond}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for range b.N {
		buf = Format(buf[:0], r)
	}
}
