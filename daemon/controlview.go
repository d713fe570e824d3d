package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dlfs/dlfs/access"
	"github.com/dlfs/dlfs/allocator"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/daemon/readers"
	"github.com/dlfs/dlfs/folder"
	"github.com/dlfs/dlfs/fusefs"
	"github.com/dlfs/dlfs/jobs"
	"github.com/dlfs/dlfs/prefetch"
)

// Who sees what in the control directory (--allow-other)
//
// Root and the mounting user see everything. Any other user sees, in
// stats, stats.prom and the control file's status, its own jobs (and
// their plans, streams, loader figures and gossiped lines) and no one
// else's; and of the paths listed there (warm-ups, checks, directories a
// scan could not read) only those in directories it may list. A job's
// directory under jobs/ belongs to the job's user, 0500 with files 0400,
// or 0555 and 0444 when every user may read every sample it plans
// (jobs.Job.Public). A job line makes the writer its owner (a write
// without a pid, from another pid namespace, makes it Foreign).

var _ fusefs.ViewControl = (*controlPlane)(nil)

// viewer is who reads a control file.
type viewer struct {
	cred access.Cred
	all  bool // root or the mounting user: sees everything
}

func (c *controlPlane) viewer(caller *fuse.Caller) viewer {
	cred := access.Cred{Uid: caller.Uid, Gid: caller.Gid}
	if caller.Pid != 0 {
		if pc, err := access.CredOf("/proc", int(caller.Pid)); err == nil && pc.Uid == cred.Uid {
			cred.Groups = pc.Groups
		}
	}
	return viewer{cred: cred, all: cred.IsRoot() || cred.Uid == c.n.cfg.Owner.Uid}
}

// owns reports whether v may see job name's entries: its own jobs.
func (c *controlPlane) owns(v viewer, name string) bool {
	if v.all {
		return true
	}
	j := c.n.jobs.Get(name)
	return j != nil && j.Owner.Uid == v.cred.Uid
}

// sees reports whether v may see the name of p (relative to the mount):
// it may list the directory that holds it.
func (c *controlPlane) sees(v viewer, snap *catalog.Snapshot, p string) bool {
	if v.all {
		return true
	}
	p = strings.Trim(path.Clean("/"+p), "/")
	if p == "" {
		return true
	}
	d, err := folder.Resolve(snap, path.Dir(p))
	return err == nil && v.cred.CanList(d)
}

// ReadFor renders a control file for the user who looks it up.
func (c *controlPlane) ReadFor(caller *fuse.Caller, p string) ([]byte, error) {
	v := c.viewer(caller)
	if v.all {
		return c.Read(p)
	}
	switch p {
	case "stats":
		b, err := json.MarshalIndent(c.statsFor(v), "", "  ")
		if err != nil {
			return nil, fmt.Errorf("stats: %w", err)
		}
		return append(b, '\n'), nil
	case "stats.prom":
		b, err := c.n.statsProm()
		if err != nil {
			return nil, err
		}
		return c.promFor(v, b), nil
	case "control":
		c.errMu.Lock()
		st := ControlStatus{LastError: c.lastErr, Checks: maps.Clone(c.checks)}
		by := c.lastErrBy
		c.errMu.Unlock()
		if by != v.cred.Uid {
			st.LastError = "" // another user's write
		}
		st.Jobs = c.n.jobs.Statuses()
		maps.DeleteFunc(st.Jobs, func(name string, _ jobs.Status) bool { return !c.owns(v, name) })
		snap := c.n.cat.Snapshot()
		maps.DeleteFunc(st.Checks, func(p string, _ CheckResult) bool { return !c.sees(v, snap, p) })
		b, err := json.MarshalIndent(st, "", "  ")
		return append(b, '\n'), err
	}
	return c.Read(p) // plans and advice: the kernel checks Perm's modes
}

// statsFor is the stats document as v may see it.
func (c *controlPlane) statsFor(v viewer) Stats {
	s := c.n.Stats()
	mine := func(job string) bool { return c.owns(v, job) }
	maps.DeleteFunc(s.Jobs, func(job string, _ map[string]prefetch.Stats) bool { return !mine(job) })
	maps.DeleteFunc(s.Plans, func(job string, _ map[string]jobs.PlanStats) bool { return !mine(job) })
	s.Streams = slices.DeleteFunc(s.Streams, func(st readers.StreamStats) bool { return st.Uid != v.cred.Uid })
	s.Allocation.Ranks = slices.DeleteFunc(s.Allocation.Ranks, func(r allocator.RankStats) bool { return !mine(r.Job) })
	s.Allocation.Changes = slices.DeleteFunc(s.Allocation.Changes, func(ch allocator.Change) bool { return !mine(ch.Job) })
	for i := range s.Cluster.Members {
		m := &s.Cluster.Members[i]
		m.Meta.Jobs = slices.DeleteFunc(slices.Clone(m.Meta.Jobs), func(line string) bool { return !mine(jobOfLine(line)) })
	}
	snap := c.n.cat.Snapshot()
	hidden := func(p string) bool { return !c.sees(v, snap, p) }
	s.Warmup.Paths = slices.DeleteFunc(s.Warmup.Paths, hidden)
	s.Catalog.Unreadable = slices.DeleteFunc(s.Catalog.Unreadable, hidden)
	return s
}

// jobOfLine is the job a gossiped job line names.
func jobOfLine(line string) string {
	for _, f := range strings.Fields(line) {
		if name, ok := strings.CutPrefix(f, "job="); ok {
			return name
		}
	}
	return "default"
}

// jobLabel is the label naming a series' job (not "job", which is
// Prometheus's own).
const jobLabel = "dlfs_job"

// promJob finds a series' job label in the text format.
var promJob = regexp.MustCompile(`[{,]` + jobLabel + `="((?:[^"\\]|\\.)*)"`)

// promFor keeps of the metrics text b the series of v's jobs and those of
// no job.
func (c *controlPlane) promFor(v viewer, b []byte) []byte {
	var out bytes.Buffer
	for line := range bytes.Lines(b) {
		if m := promJob.FindSubmatch(line); m != nil && !c.owns(v, string(m[1])) {
			continue
		}
		out.Write(line)
	}
	return out.Bytes()
}

// Perm gives a job's directory and files under jobs/ to the job's user:
// readable by that user alone, unless every user may read every sample
// the job plans. Other entries keep the defaults.
func (c *controlPlane) Perm(p string) (fusefs.PseudoPerm, bool) {
	parts := strings.Split(p, "/")
	if len(parts) < 2 || parts[0] != "jobs" {
		return fusefs.PseudoPerm{}, false
	}
	j := c.n.jobs.Get(parts[1])
	if j == nil {
		return fusefs.PseudoPerm{}, false // a job that only reports: its advice names no file
	}
	perm := fusefs.PseudoPerm{Uid: j.Owner.Uid, Gid: j.Owner.Gid, Mode: 0o400}
	dir := len(parts) < 4 // jobs/JOB, jobs/JOB/rank-R
	switch {
	case dir && j.Public:
		perm.Mode = 0o555
	case dir:
		perm.Mode = 0o500
	case j.Public:
		perm.Mode = 0o444
	}
	return perm, true
}

// ownerOf is who a control write acts for: its caller, with the groups of
// its process; root for a write that did not come through the mount.
func ownerOf(ctx context.Context) jobs.Owner {
	caller, ok := fusefs.CallerOf(ctx)
	if !ok {
		return jobs.RootOwner
	}
	o := jobs.Owner{Cred: access.Cred{Uid: caller.Uid, Gid: caller.Gid}, Foreign: caller.Pid == 0}
	if caller.Pid != 0 {
		if pc, err := access.CredOf("/proc", int(caller.Pid)); err == nil && pc.Uid == caller.Uid {
			o.Groups = pc.Groups
		}
	}
	return o
}
