package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"
)

// systemd's readiness protocol (sd_notify(3)), without libsystemd: a
// service of Type=notify is started once it sends READY=1 on the datagram
// socket named by $NOTIFY_SOCKET, so units ordered after dlfs@NAME (a
// training job's) start only when the mount is usable, and a mount that
// never becomes usable fails the start. The mount helper (mounthelper.go)
// waits the same way for the daemon it starts.

// notifySocketEnv names the socket the service manager listens on.
const notifySocketEnv = "NOTIFY_SOCKET"

// sdNotify sends state (newline-separated VAR=VALUE lines) to the service
// manager at $NOTIFY_SOCKET. It does nothing when that is unset. A name
// that starts with '@' is an abstract socket (Go's net package turns the
// '@' into the leading NUL byte). It does not block for long: a write
// that takes over a second fails.
func sdNotify(state string) error {
	path := os.Getenv(notifySocketEnv)
	if path == "" {
		return nil
	}
	if path[0] != '/' && path[0] != '@' {
		return fmt.Errorf("$%s %q: want an absolute path or an abstract socket name (@NAME)", notifySocketEnv, path)
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("notify %s: %w", path, err)
	}
	defer c.Close()
	c.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("notify %s: %w", path, err)
	}
	return nil
}

// notifyReady tells the service manager that the mount is usable
// (READY=1, with a STATUS line naming it), then, from a goroutine that
// ends with ctx, that the daemon is stopping (STOPPING=1) once ctx is
// done: ctx is the one a SIGTERM cancels. Errors are logged, never fatal:
// the mount works without a manager. It returns at once.
func notifyReady(ctx context.Context, log *slog.Logger, source, mountpoint string) {
	if os.Getenv(notifySocketEnv) == "" {
		return
	}
	if err := sdNotify(fmt.Sprintf("READY=1\nSTATUS=serving %s at %s", source, mountpoint)); err != nil {
		log.Warn("could not tell the service manager the mount is ready", "err", err)
	}
	go func() {
		<-ctx.Done()
		// The mount helper's socket is gone once it returned: not worth
		// a warning.
		if err := sdNotify("STOPPING=1\nSTATUS=unmounting " + mountpoint); err != nil {
			log.Debug("could not tell the service manager the mount is stopping", "err", err)
		}
	}()
}
