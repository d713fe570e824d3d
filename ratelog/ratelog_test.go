package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Every logs the first event, counts the rest of the interval, and the
// next line carries the count.
func TestEvery(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	e := Every{Interval: time.Hour}
	for range 1000 {
		e.Warn(log, "refused")
	}
	if n := strings.Count(buf.String(), "refused"); n != 1 {
		t.Fatalf("1000 events in one interval logged %d lines, want 1", n)
	}
	e.mu.Lock()
	e.start = time.Now().Add(-2 * time.Hour) // the interval has passed
	e.mu.Unlock()
	e.Warn(log, "refused")
	if !strings.Contains(buf.String(), "suppressed=999") {
		t.Fatalf("the next line does not count the 999 suppressed:\n%s", buf.String())
	}
	var zero Every
	buf.Reset()
	for range 3 {
		zero.Warn(log, "each")
	}
	if n := strings.Count(buf.String(), "each"); n != 3 {
		t.Fatalf("a zero interval logged %d of 3", n)
	}
}

// Handler limits each message on its own, passes what is below its level,
// and its derived handlers share the limits.
func TestHandler(t *testing.T) {
	var buf bytes.Buffer
	h := NewHandler(slog.NewTextHandler(&buf, nil), time.Hour, 3, slog.LevelWarn)
	log := slog.New(h)
	for i := range 100 {
		log.Warn("file changed", "path", i)
		log.With("op", "read").Warn("file changed", "path", i)
		log.Error("request failed", "n", i)
		log.Info("ok", "n", i)
	}
	out := buf.String()
	for msg, want := range map[string]int{`msg="file changed"`: 3, `msg="request failed"`: 3, "msg=ok": 100} {
		if n := strings.Count(out, msg); n != want {
			t.Errorf("%s: %d lines, want %d\n%s", msg, n, want, out)
		}
	}
	e := h.l.byMsg["file changed"]
	e.mu.Lock()
	e.start = time.Now().Add(-2 * time.Hour)
	e.mu.Unlock()
	log.Warn("file changed", "path", "x")
	if !strings.Contains(buf.String(), "suppressed=197") {
		t.Errorf("the next line does not count the 197 suppressed:\n%s", buf.String())
	}
}
