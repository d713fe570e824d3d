package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dlfs/dlfs/allocator"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
	"github.com/dlfs/dlfs/fusefs"
	"github.com/dlfs/dlfs/jobs"
)

// controlPlane serves the files of the control directory.
type controlPlane struct {
	n *Node

	mu      sync.Mutex // serializes commands
	errMu   sync.Mutex // guards lastErr and checks: a read of the status never waits for a command
	lastErr string
	checks  map[string]CheckResult // the last check command's, by path

	lastErrBy uint32 // errMu guards it too: the uid whose write failed (see controlview.go)
}

var _ fusefs.ControlPlane = (*controlPlane)(nil)

// ControlStatus is the document read from .dlfs/control.
type ControlStatus struct {
	Jobs      map[string]jobs.Status `json:"jobs"`
	LastError string                 `json:"last_error"`
	// Checks are the last check command's results, by path ("" is the
	// mount).
	Checks map[string]CheckResult `json:"checks,omitempty"`
}

// List serves the control tree:
//
//	control, stats, stats.prom
//	jobs/JOB/rank-R/epoch-E          the predicted read order, one path per line
//	jobs/JOB/rank-R/epoch-E.batches  its batch sizes, one per line (not for an
//	                                 inferred job whose reads have not shown them)
//	jobs/JOB/rank-R/advice           the rank's DataLoader settings (JSON), once it reports
func (c *controlPlane) List(dir string) ([]fusefs.PseudoEntry, error) {
	parts := strings.Split(dir, "/")
	switch {
	case dir == "":
		return []fusefs.PseudoEntry{
			{Name: accessLogName, Pipe: true},
			{Name: "control", Writable: true},
			{Name: "jobs", Dir: true},
			{Name: "stats"},
			{Name: "stats.prom"},
		}, nil
	case dir == "jobs":
		var out []fusefs.PseudoEntry
		for _, name := range c.jobNames() {
			out = append(out, fusefs.PseudoEntry{Name: name, Dir: true})
		}
		return out, nil
	case len(parts) == 3 && parts[0] == "jobs":
		rank, ok := parseRankDir(parts[2])
		if !ok {
			break
		}
		j, _, planned := c.jobRank(parts[1], parts[2])
		_, advised := c.n.alloc.Advice(allocator.Key{Job: parts[1], Rank: rank})
		if !planned && !advised {
			break
		}
		var out []fusefs.PseudoEntry
		if advised {
			out = append(out, fusefs.PseudoEntry{Name: "advice"})
		}
		if planned {
			for _, e := range j.Epochs(rank) {
				out = append(out, fusefs.PseudoEntry{Name: fmt.Sprintf("epoch-%d", e)})
				if j.BatchKnown() {
					out = append(out, fusefs.PseudoEntry{Name: fmt.Sprintf("epoch-%d.batches", e)})
				}
			}
		}
		return out, nil
	case len(parts) == 2 && parts[0] == "jobs":
		ranks := c.n.alloc.Ranks(parts[1])
		if j := c.n.jobs.Get(parts[1]); j != nil {
			ranks = append(ranks, j.Spec.Ranks...)
		}
		if len(ranks) == 0 {
			break
		}
		slices.Sort(ranks)
		var out []fusefs.PseudoEntry
		for _, r := range slices.Compact(ranks) {
			out = append(out, fusefs.PseudoEntry{Name: fmt.Sprintf("rank-%d", r), Dir: true})
		}
		return out, nil
	}
	return nil, fmt.Errorf("control: %s: %w", dir, fs.ErrNotExist)
}

// jobNames returns the announced jobs and the jobs whose DataLoaders
// report, sorted.
func (c *controlPlane) jobNames() []string {
	names := c.n.alloc.Jobs()
	for _, j := range c.n.jobs.All() {
		names = append(names, j.Spec.Name)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// parseRankDir parses "rank-R".
func parseRankDir(s string) (int, bool) {
	var r int
	if _, err := fmt.Sscanf(s, "rank-%d", &r); err != nil || fmt.Sprintf("rank-%d", r) != s {
		return 0, false
	}
	return r, true
}

// jobRank finds announced job name and its local rank called "rank-R".
func (c *controlPlane) jobRank(name, rankDir string) (*jobs.Job, int, bool) {
	r, ok := parseRankDir(rankDir)
	j := c.n.jobs.Get(name)
	if !ok || j == nil {
		return nil, 0, false
	}
	for _, lr := range j.Spec.Ranks {
		if lr == r {
			return j, r, true
		}
	}
	return nil, 0, false
}

// plan renders jobs/JOB/rank-R/epoch-E.
func (c *controlPlane) plan(p string) ([]byte, error) {
	parts := strings.Split(p, "/")
	if len(parts) != 4 || parts[0] != "jobs" {
		return nil, fmt.Errorf("control: %s: %w", p, fs.ErrNotExist)
	}
	j, rank, ok := c.jobRank(parts[1], parts[2])
	name, batches := strings.CutSuffix(parts[3], ".batches")
	var epoch int
	if !ok || func() bool { _, err := fmt.Sscanf(name, "epoch-%d", &epoch); return err != nil }() ||
		fmt.Sprintf("epoch-%d", epoch) != name || !j.Planned(rank, epoch) {
		return nil, fmt.Errorf("control: %s: %w", p, fs.ErrNotExist)
	}
	var b bytes.Buffer
	if batches && !j.BatchKnown() {
		return nil, fmt.Errorf("control: %s: the batch size of inferred job %s is not known yet: %w", p, j.Spec.Name, fs.ErrNotExist)
	}
	if batches {
		for _, n := range j.Batches(rank, epoch) {
			fmt.Fprintln(&b, n)
		}
		return b.Bytes(), nil
	}
	for _, i := range j.Order(rank, epoch) {
		b.WriteString(j.Samples[i].Path())
		b.WriteByte('\n')
	}
	return b.Bytes(), nil
}

// advice renders jobs/JOB/rank-R/advice: the rank's DataLoader settings
// (package allocator).
func (c *controlPlane) advice(job, rankDir string) ([]byte, error) {
	r, ok := parseRankDir(rankDir)
	adv, advised := c.n.alloc.Advice(allocator.Key{Job: job, Rank: r})
	if !ok || !advised {
		return nil, fmt.Errorf("control: jobs/%s/%s/advice: %w", job, rankDir, fs.ErrNotExist)
	}
	b, err := json.MarshalIndent(adv, "", "  ")
	return append(b, '\n'), err
}

func (c *controlPlane) Read(path string) ([]byte, error) {
	switch path {
	case "stats":
		return c.n.statsJSON()
	case "stats.prom":
		return c.n.statsProm()
	case "control":
		c.errMu.Lock()
		last, checks := c.lastErr, c.checks
		c.errMu.Unlock()
		st := ControlStatus{Jobs: c.n.jobs.Statuses(), LastError: last, Checks: checks}
		b, err := json.MarshalIndent(st, "", "  ")
		return append(b, '\n'), err
	}
	if strings.HasPrefix(path, "jobs/") {
		if parts := strings.Split(path, "/"); len(parts) == 4 && parts[3] == "advice" {
			return c.advice(parts[1], parts[2])
		}
		return c.plan(path)
	}
	return nil, fmt.Errorf("control: %s: %w", path, fs.ErrNotExist)
}

func (c *controlPlane) Write(ctx context.Context, path string, data []byte) error {
	if path != "control" {
		return fmt.Errorf("control: %s: %w", path, fs.ErrPermission)
	}
	if err := c.readLists(ctx, data); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.exec(ctx, data)
	c.errMu.Lock()
	c.lastErr = ""
	if err != nil {
		c.lastErr, c.lastErrBy = err.Error(), ownerOf(ctx).Uid
	}
	c.errMu.Unlock()
	if err != nil {
		c.n.log.Warn("control command failed", "err", err)
	}
	return err
}

// readLists reads the list files that the job lines of data name
// (dataset=list:PATH) into the caches, with the writer's context and
// before the control plane's lock: on a PFS that stopped answering, only
// this writer waits, and it can be interrupted. The job line then finds
// the list cached (a failure here is left for it to report).
func (c *controlPlane) readLists(ctx context.Context, data []byte) error {
	cmds, err := control.Parse(data)
	if err != nil {
		return nil // exec reports it
	}
	for _, cmd := range cmds {
		j, ok := cmd.(control.Job)
		if !ok || j.ListPath == "" {
			continue
		}
		e, err := folder.Resolve(c.n.cat.Snapshot(), j.ListPath)
		if err != nil || !e.IsRegular() || e.Size > jobs.DefaultMaxListBytes {
			continue
		}
		if _, err := c.n.tiers.load.ReadAt(ctx, e, make([]byte, e.Size), 0); ctx.Err() != nil {
			return fmt.Errorf("dataset=list:%s: %w", j.ListPath, err)
		}
	}
	return nil
}

// followTimeout bounds how long a job line waits for the prefetcher to
// take up its plans.
const followTimeout = 10 * time.Second

// exec parses every line first, so a bad line changes nothing, then runs
// them in order; a write with a job line returns once the prefetcher
// follows the new plans (or after followTimeout).
//
// c.mu is held, except while a refresh runs: a rescan takes as long as
// SOURCE makes it, and other writers must not wait for it (refresher).
func (c *controlPlane) exec(ctx context.Context, data []byte) error {
	cmds, err := control.Parse(data)
	if err != nil {
		return err
	}
	var names []string
	for _, cmd := range cmds {
		if j, ok := cmd.(control.Job); ok {
			names = append(names, j.Merge(control.DefaultJob()).Name)
		}
	}
	if err := c.n.jobs.CheckRoom(names); err != nil {
		return err
	}
	if len(names) > 0 {
		// The reader's first reads come right after its job line: let the
		// prefetcher follow the new plans first, or they go untracked.
		defer func() {
			if !c.n.pf.Follows(c.n.jobs.Version(), followTimeout) {
				c.n.log.Warn("control: the prefetcher did not take up the new plans in time; the first reads may not be tracked", "timeout", followTimeout)
			}
		}()
	}
	for _, cmd := range cmds {
		switch cmd := cmd.(type) {
		case control.Job:
			if err := c.n.jobs.ApplyAs(ownerOf(ctx), cmd); err != nil {
				return err
			}
		case control.End:
			// A job may only report (a dlfs.DataLoader that announced no
			// sampler); ending it ends its allocation.
			reported := c.n.alloc.End(cmd.Job)
			if err := c.n.jobs.EndAs(ownerOf(ctx), cmd.Job); err != nil && !reported {
				return err
			}
		case control.Report:
			if _, err := c.n.report(cmd); err != nil {
				return err
			}
		case control.Warmup:
			files, err := c.n.filesUnder(cmd.Paths)
			if err != nil {
				return fmt.Errorf("%w: warmup %v", control.ErrSyntax, err)
			}
			c.n.warmer.Start(cmd.Paths, files, c.n.cacheCapacity())
		case control.WarmupStop:
			c.n.warmer.Stop()
		case control.Evict:
			files, err := c.n.filesUnder(cmd.Paths)
			if err != nil {
				return fmt.Errorf("%w: evict %v", control.ErrSyntax, err)
			}
			for _, e := range files {
				c.n.tiers.load.Invalidate(e)
			}
		case control.Check:
			results := map[string]CheckResult{}
			for _, p := range cmd.Paths {
				r, err := c.n.check(p)
				if err != nil {
					return fmt.Errorf("%w: check %v", control.ErrSyntax, err)
				}
				results[p] = r
			}
			c.errMu.Lock()
			c.checks = results
			c.errMu.Unlock()
		case control.Refresh:
			c.mu.Unlock()
			err := c.n.rescans.control.refresh(ctx)
			c.mu.Lock()
			if err != nil {
				return fmt.Errorf("refresh: %w", err)
			}
		}
	}
	return nil
}
