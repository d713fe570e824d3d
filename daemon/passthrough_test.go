package daemon

import (
	"strings"
	"testing"
)

// TestPassthroughMode: auto uses passthrough for a dataset of large
// files only; on and off are what they say.
func TestPassthroughMode(t *testing.T) {
	cases := []struct {
		mode       string
		files      int
		bytes      int64
		allowOther bool
		on         bool
	}{
		{"", 24, 24 << 25, false, true},              // 32 MiB files
		{"auto", 3000, 3000 * 110_000, false, false}, // 110 KB files
		{"auto", 10, 10 << 20, false, true},          // exactly 1 MiB on average
		{"auto", 0, 0, false, false},                 // empty
		{"on", 3000, 3000 * 110_000, false, true},
		{"off", 24, 24 << 25, false, false},
		// Open to other users: their mmaps would hold backing files past
		// the bound, so only on asks for it.
		{"", 24, 24 << 25, true, false},
		{"auto", 24, 24 << 25, true, false},
		{"on", 24, 24 << 25, true, true},
	}
	for _, c := range cases {
		on, why := passthroughMode(c.mode, c.files, c.bytes, c.allowOther)
		if on != c.on || on != (why == "") {
			t.Errorf("%q, %d files of %d bytes, allow-other %v: on %v (%q), want %v with a reason when off", c.mode, c.files, c.bytes, c.allowOther, on, why, c.on)
		}
	}
}

// TestCheckPassthrough: the check line says whether passthrough can work
// and why not: a kernel before 6.9, no CAP_SYS_ADMIN; a bad mode fails.
func TestCheckPassthrough(t *testing.T) {
	cases := []struct {
		mode, release string
		root          bool
		level         Level
		says          string
	}{
		{"", "6.18.4", true, OK, "auto"},
		{"on", "6.18.4", true, OK, "on"},
		{"auto", "6.1.0-28-amd64", true, OK, "6.9"},
		{"on", "6.1.0-28-amd64", true, Warn, "6.9"},
		{"auto", "6.18.4", false, OK, "CAP_SYS_ADMIN"},
		{"on", "6.18.4", false, Warn, "CAP_SYS_ADMIN"},
		{"off", "6.18.4", true, OK, "off"},
		{"yes", "6.18.4", true, Fail, "auto, on or off"},
		{"auto+allow-other", "6.18.4", true, OK, "off with --allow-other"},
	}
	for _, c := range cases {
		mode, other := strings.CutSuffix(c.mode, "+allow-other")
		cfg := Config{Passthrough: mode, AllowOther: other}
		ch := cfg.checkPassthrough(Host{Release: c.release, Root: c.root})
		if ch.Level != c.level || !strings.Contains(ch.Detail, c.says) {
			t.Errorf("%q on %s (root %v): %v %q; want %v saying %q", c.mode, c.release, c.root, ch.Level, ch.Detail, c.level, c.says)
		}
	}
}

// TestCheckShmemTHP: doctor says whether backing files get huge pages,
// and how to allow them; a warning only where passthrough is asked for.
func TestCheckShmemTHP(t *testing.T) {
	cases := []struct {
		mode, shmem string
		shown       bool
		level       Level
		says        string
	}{
		{"", "advise", true, OK, "2 MiB pages"},
		{"on", "always", true, OK, "2 MiB pages"},
		{"", "never", true, OK, "echo advise"},
		{"on", "never", true, Warn, "echo advise"},
		{"on", "deny", true, Warn, "4 KiB pages"},
		{"off", "never", false, OK, ""},
		{"on", "", false, OK, ""},
	}
	for _, c := range cases {
		cfg := Config{Passthrough: c.mode}
		ch, shown := cfg.checkShmemTHP(Host{ShmemTHP: c.shmem})
		if shown != c.shown || shown && (ch.Level != c.level || !strings.Contains(ch.Detail, c.says)) {
			t.Errorf("%q with shmem %q: shown %v, %v %q; want shown %v, %v saying %q", c.mode, c.shmem, shown, ch.Level, ch.Detail, c.shown, c.level, c.says)
		}
	}
}
