package owners

import (
	"fmt"
	"strings"
	"testing"

	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/jobs"
	"github.com/dlfs/dlfs/placement"
)

// jobAt is the job rank 1 of job j announces at epoch on its node.
func jobAt(t *testing.T, epoch int) *jobs.Job {
	t.Helper()
	cmds, err := control.Parse([]byte(fmt.Sprintf("job=j root=train seed=5 world=2 rank=1 epoch=%d\n", epoch)))
	if err != nil || len(cmds) != 1 {
		t.Fatalf("parse: %v", err)
	}
	spec := cmds[0].(control.Job).Merge(control.DefaultJob())
	return &jobs.Job{Spec: spec, RankEpoch: map[int]int{1: epoch}}
}

// TestJobLinesWindow: a job's gossip line carries the first epoch it was
// announced at, and keeps it as the job moves on (the demand window does
// not move); a job that ended is forgotten, so a new run of it starts a
// new window.
func TestJobLinesWindow(t *testing.T) {
	first := map[string]int{"x": 0}
	if l := jobLines([]*jobs.Job{jobAt(t, 1)}, first); len(l) != 1 || !strings.Contains(l[0], " epoch=1 ") {
		t.Fatalf("fresh lines after epoch 1: %q", l)
	}
	if _, ok := first["x"]; ok || len(first) != 1 {
		t.Fatalf("an ended job is still remembered: %v", first)
	}
	if l := jobLines([]*jobs.Job{jobAt(t, 2)}, first); len(l) != 1 || !strings.Contains(l[0], " epoch=1 ") || len(first) != 1 {
		t.Fatalf("lines after epoch 2: %q, want the window still at epoch 1", l)
	}
	if l := jobLines(nil, first); len(l) != 0 || len(first) != 0 {
		t.Fatalf("no job: lines %q, remembered %v", l, first)
	}
	if l := jobLines([]*jobs.Job{jobAt(t, 3)}, first); len(l) != 1 || !strings.Contains(l[0], " epoch=3 ") {
		t.Fatalf("a new run at epoch 3: %q, want a new window", l)
	}
}

// TestSameDataset: members of another dataset, or hashing placement
// another way, get no share.
func TestSameDataset(t *testing.T) {
	me := "d1"
	ms := []cluster.Member{
		{Name: "same", Meta: cluster.Meta{Dataset: me, Placement: placement.HashVersion}},
		{Name: "other-dataset", Meta: cluster.Meta{Dataset: me + "x", Placement: placement.HashVersion}},
		{Name: "old-hash", Meta: cluster.Meta{Dataset: me}},
	}
	same, foreign := sameDataset(me, ms)
	if len(same) != 1 || same[0].Name != "same" || len(foreign) != 2 {
		t.Errorf("same %v, foreign %v", same, foreign)
	}
}
