package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"sync"
	"time"

	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/fusefs"
)

// controlPlane serves the files of the control directory.
type controlPlane struct {
	n *Node

	mu      sync.Mutex // serializes commands; guards lastErr
	lastErr string
}

var _ fusefs.ControlPlane = (*controlPlane)(nil)

// ControlStatus is the document read from .dlfs/control.
type ControlStatus struct {
	Jobs      map[string]any `json:"jobs"`
	LastError string         `json:"last_error"`
}

func (c *controlPlane) List(dir string) ([]fusefs.PseudoEntry, error) {
	if dir != "" {
		return nil, fmt.Errorf("control: %s: %w", dir, fs.ErrNotExist)
	}
	return []fusefs.PseudoEntry{
		{Name: "control", Writable: true},
		{Name: "stats"},
		{Name: "stats.prom"},
	}, nil
}

func (c *controlPlane) Read(path string) ([]byte, error) {
	switch path {
	case "stats":
		return c.n.statsJSON()
	case "stats.prom":
		return c.n.statsProm()
	case "control":
		c.mu.Lock()
		st := ControlStatus{Jobs: map[string]any{}, LastError: c.lastErr}
		c.mu.Unlock()
		b, err := json.MarshalIndent(st, "", "  ")
		return append(b, '\n'), err
	}
	return nil, fmt.Errorf("control: %s: %w", path, fs.ErrNotExist)
}

func (c *controlPlane) Write(path string, data []byte) error {
	if path != "control" {
		return fmt.Errorf("control: %s: %w", path, fs.ErrPermission)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.exec(data)
	c.lastErr = ""
	if err != nil {
		c.lastErr = err.Error()
		c.n.log.Warn("control command failed", "err", err)
	}
	return err
}

// exec parses every line first, so a bad line changes nothing, then runs
// them in order.
func (c *controlPlane) exec(data []byte) error {
	cmds, err := control.Parse(data)
	if err != nil {
		return err
	}
	for _, cmd := range cmds {
		switch cmd.(type) {
		case control.Refresh:
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
			_, err := c.n.Refresh(ctx)
			cancel()
			if err != nil {
				return fmt.Errorf("refresh: %w", err)
			}
		}
	}
	return nil
}
