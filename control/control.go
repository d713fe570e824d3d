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
package control

import (
	"errors"
	"fmt"
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
	case "refresh":
		if len(fields) > 1 {
			return nil, fmt.Errorf("%w: refresh takes no arguments, got %q", ErrSyntax, strings.Join(fields[1:], " "))
		}
		return Refresh{}, nil
	}
	return nil, fmt.Errorf("%w: unknown command %q; known: refresh, end job=NAME, or key=value pairs", ErrSyntax, clip(fields[0]))
}

// clip shortens user input quoted in errors.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
