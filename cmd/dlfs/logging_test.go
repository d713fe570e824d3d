package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestLogFormat: --log-format json writes one JSON object a line, text
// slog's key=value lines, and anything else is refused.
func TestLogFormat(t *testing.T) {
	var b strings.Builder
	log, err := newLogger(&b, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("mounted", "mountpoint", "/mnt/data")
	log.Debug("hidden")
	var rec map[string]any
	if err := json.Unmarshal([]byte(b.String()), &rec); err != nil || rec["msg"] != "mounted" || rec["mountpoint"] != "/mnt/data" || rec["level"] != "INFO" {
		t.Errorf("json log: %q (%v)", b.String(), err)
	}
	b.Reset()
	if log, err = newLogger(&b, "debug", "text"); err != nil {
		t.Fatal(err)
	}
	log.Debug("shown", "k", 1)
	if !strings.Contains(b.String(), "level=DEBUG msg=shown k=1") {
		t.Errorf("text log: %q", b.String())
	}
	for _, c := range [][2]string{{"info", "xml"}, {"loud", "text"}} {
		if _, err := newLogger(&b, c[0], c[1]); err == nil {
			t.Errorf("--log-level %s --log-format %s accepted", c[0], c[1])
		}
	}
}
