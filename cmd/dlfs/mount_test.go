package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlfs/dlfs/daemon"
)

func TestParseSize(t *testing.T) {
	cases := map[string]int64{
		"0": 0, "4096": 4096, "512MiB": 512 << 20, "4GiB": 4 << 30, "4gib": 4 << 30, "1.5G": 3 << 29,
		"100k": 100 << 10, "100KB": 100_000, "2 MiB": 2 << 20, "7b": 7, "1TiB": 1 << 40,
	}
	for in, want := range cases {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "12XB", "-1G", "G", "1e9", "NaN", "0x10", "1.2.3M", "Inf", "99999999999TiB"} {
		if _, err := parseSize(bad); err == nil {
			t.Errorf("parseSize(%q) succeeded", bad)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"512MiB", "1.5G", "-1", "1e3", "9999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSize(s)
		if err == nil && n < 0 {
			t.Fatalf("parseSize(%q) = %d", s, n)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Fatalf("multi-line error %q", err)
		}
	})
}

// TestMountFlags checks that flags reach the daemon's Config.
func TestMountFlags(t *testing.T) {
	var got daemon.Config
	cmd := newMountCmd(func(_ *cobra.Command, cfg daemon.Config, _ *mountOptions) error {
		got = cfg
		return nil
	})
	cmd.SetArgs([]string{"--ram-cache", "1GiB", "--ssd-cache", "/ssd", "--ssd-cache-size", "2GiB",
		"--allow-other", "--control-name", ".ctl", "--metrics-addr", "127.0.0.1:9", "src", "mnt"})
	cmd.SetOut(&bytes.Buffer{})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if got.Source != "src" || got.Mountpoint != "mnt" || got.RAMCache != 1<<30 || got.SSDDir != "/ssd" ||
		got.SSDCapacity != 2<<30 || !got.AllowOther || got.ControlName != ".ctl" || got.MetricsAddr != "127.0.0.1:9" {
		t.Errorf("config %+v", got)
	}
	// A control name with a slash is the Config's fault: Validate says so
	// (daemon's TestCheck).
	for _, bad := range [][]string{{"--control-name", "", "s", "m"}, {"--ram-cache", "lots", "s", "m"}} {
		cmd := newMountCmd(func(*cobra.Command, daemon.Config, *mountOptions) error { return nil })
		cmd.SetArgs(bad)
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		if err := cmd.Execute(); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// stuck is a node whose Close never ends.
type stuck struct{ release chan struct{} }

func (s stuck) Close() error { <-s.release; return nil }

// A Close that never ends (a request stuck where nothing can cancel it)
// does not keep the process: past the limit, the mount is detached and the
// error says so.
func TestCloseBounded(t *testing.T) {
	s := stuck{make(chan struct{})}
	defer close(s.release)
	cfg := daemon.DefaultConfig(t.TempDir(), t.TempDir())
	cfg.Logger = slog.New(slog.DiscardHandler)
	err := closeBounded(s, cfg, 10*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "--stop-timeout") || !strings.Contains(err.Error(), "detached it lazily") {
		t.Fatalf("a Close past --stop-timeout: %v", err)
	}
	if err := closeBounded(stuckFree{}, cfg, time.Hour); err != nil {
		t.Fatalf("a Close that ends: %v", err)
	}
}

type stuckFree struct{}

func (stuckFree) Close() error { return nil }
