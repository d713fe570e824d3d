package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// listenNotify listens on a datagram socket at name, as systemd does for
// $NOTIFY_SOCKET, and sets the variable for the test.
func listenNotify(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	t.Setenv(notifySocketEnv, name)
	return ln
}

func readNotify(t *testing.T, ln *net.UnixConn) string {
	t.Helper()
	ln.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	n, err := ln.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

// TestSdNotify: a path socket and an abstract one (@NAME) each get the
// state; without NOTIFY_SOCKET nothing is sent and nothing fails; a
// relative name is refused.
func TestSdNotify(t *testing.T) {
	for name, sock := range map[string]string{
		"path":     filepath.Join(t.TempDir(), "notify"),
		"abstract": fmt.Sprintf("@dlfs-test-%d-%d", os.Getpid(), time.Now().UnixNano()),
	} {
		t.Run(name, func(t *testing.T) {
			ln := listenNotify(t, sock)
			if err := sdNotify("READY=1"); err != nil {
				t.Fatal(err)
			}
			if got := readNotify(t, ln); got != "READY=1" {
				t.Errorf("got %q", got)
			}
		})
	}
	t.Run("unset", func(t *testing.T) {
		t.Setenv(notifySocketEnv, "")
		if err := sdNotify("READY=1"); err != nil {
			t.Error(err)
		}
	})
	t.Run("relative", func(t *testing.T) {
		t.Setenv(notifySocketEnv, "notify")
		if err := sdNotify("READY=1"); err == nil || !strings.Contains(err.Error(), "absolute path") {
			t.Errorf("got %v", err)
		}
	})
}

// TestNotifyReady: READY=1 with a status naming the mount, then
// STOPPING=1 once the signal context ends.
func TestNotifyReady(t *testing.T) {
	ln := listenNotify(t, filepath.Join(t.TempDir(), "notify"))
	ctx, cancel := context.WithCancel(context.Background())
	notifyReady(ctx, slog.New(slog.DiscardHandler), "/src", "/mnt")
	if got := readNotify(t, ln); got != "READY=1\nSTATUS=serving /src at /mnt" {
		t.Errorf("got %q", got)
	}
	cancel()
	if got := readNotify(t, ln); !strings.HasPrefix(got, "STOPPING=1\n") {
		t.Errorf("got %q", got)
	}
}
