// Package control parses the commands written to MOUNTPOINT/.dlfs/control.
//
// # Protocol
//
// A write holds one or more lines; each non-blank line is one command.
// Blank lines and lines starting with '#' are ignored. A write is applied
// only if every line in it parses, so a bad line changes nothing. Errors say
// what was wrong and what is accepted, in one line, because they are shown
// to the person who wrote the command (reading the control file returns the
// last one).
//
// Commands:
//
//	refresh             rescan SOURCE; files that changed are invalidated in every tier
//	key=value ...       register or update a job (see Job for the keys)
//	end job=NAME        drop a job
//	warmup PATH...      fetch what lies under the paths into the caches
//	warmup stop         stop the warm-up under way
//	evict PATH...       drop what lies under the paths from this node's caches
//	check PATH...       report how much of each path the caches hold
//	report key=value... a rank's loader figures (see Report)
//
// PATHs are relative to the mount, separated by spaces (a path with a space
// cannot be named), and may not climb out of it.
package control

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// MaxWrite bounds the bytes of one control write.
const MaxWrite = 64 << 10

// ErrSyntax is wrapped by every parse error.
var ErrSyntax = errors.New("control: bad command")

// Command is a parsed control line.
type Command interface{ command() }

// Refresh asks for a rescan of SOURCE.
type Refresh struct{}

func (Refresh) command() {}

// Parse parses the lines of one write.
func Parse(data []byte) ([]Command, error) {
	if len(data) > MaxWrite {
		return nil, fmt.Errorf("%w: write of %d bytes exceeds %d", ErrSyntax, len(data), MaxWrite)
	}
	var cmds []Command
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		c, err := parseLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		cmds = append(cmds, c)
	}
	return cmds, nil
}

func parseLine(line string) (Command, error) {
	fields := strings.Fields(line)
	if strings.Contains(fields[0], "=") {
		j, err := parseJob(fields)
		if err != nil {
			return nil, err
		}
		if !j.Set["epoch"] {
			return nil, fmt.Errorf("%w: epoch=N is required in a job line", ErrSyntax)
		}
		return j, nil
	}
	switch fields[0] {
	case "end":
		j, err := parseJob(fields[1:])
		if err != nil && len(fields) > 1 {
			return nil, err
		}
		if len(j.Set) != 1 || !j.Set["job"] {
			return nil, fmt.Errorf("%w: end takes exactly job=NAME", ErrSyntax)
		}
		return End{Job: j.Name}, nil
	case "warmup", "evict", "check":
		if len(fields) < 2 {
			return nil, fmt.Errorf("%w: %s takes one or more paths relative to the mount", ErrSyntax, fields[0])
		}
		if fields[0] == "warmup" && len(fields) == 2 && fields[1] == "stop" {
			return WarmupStop{}, nil
		}
		if len(fields) > MaxPaths+1 {
			return nil, fmt.Errorf("%w: %s of %d paths; at most %d in one line", ErrSyntax, fields[0], len(fields)-1, MaxPaths)
		}
		paths := make([]string, 0, len(fields)-1)
		for _, f := range fields[1:] {
			p, err := cleanPath(f)
			if err != nil {
				return nil, fmt.Errorf("%w: %s %s: %v", ErrSyntax, fields[0], clip(f), err)
			}
			paths = append(paths, p)
		}
		switch fields[0] {
		case "warmup":
			return Warmup{Paths: paths}, nil
		case "evict":
			return Evict{Paths: paths}, nil
		}
		return Check{Paths: paths}, nil
	case "report":
		return parseReport(fields[1:])
	case "refresh":
		if len(fields) > 1 {
			return nil, fmt.Errorf("%w: refresh takes no arguments, got %q", ErrSyntax, strings.Join(fields[1:], " "))
		}
		return Refresh{}, nil
	}
	return nil, fmt.Errorf("%w: unknown command %q; known: refresh, end job=NAME, warmup, evict, check, report, or key=value pairs", ErrSyntax, clip(fields[0]))
}

// MaxPaths bounds the paths of one warmup, evict or check line.
const MaxPaths = 256

// Warmup fetches what lies under Paths (relative to the mount; "" is the
// whole dataset) into the caches.
type Warmup struct{ Paths []string }

// WarmupStop stops the warm-up under way.
type WarmupStop struct{}

// Evict drops what lies under Paths from this node's caches.
type Evict struct{ Paths []string }

// Check reports how much of each of Paths the caches hold.
type Check struct{ Paths []string }

func (Warmup) command()     {}
func (WarmupStop) command() {}
func (Evict) command()      {}
func (Check) command()      {}

// cleanPath checks a path relative to the mount and returns it cleaned
// ("" for the mount itself).
func cleanPath(p string) (string, error) {
	if strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("absolute; name it relative to the mount")
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("climbs out of the mount")
	}
	if c == "." {
		c = ""
	}
	return c, nil
}

// clip shortens user input quoted in errors.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
