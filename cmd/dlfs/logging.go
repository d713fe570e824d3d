package main

import (
	"fmt"
	"io"
	"log/slog"
)

// newLogger returns the daemon's logger: level is --log-level (debug,
// info, warn or error), format --log-format (text, slog's key=value
// lines, or json, one object a line for log collectors).
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	l, err := parseLevel(level)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}
