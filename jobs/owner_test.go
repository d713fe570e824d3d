package jobs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlfs/dlfs/access"
	"github.com/dlfs/dlfs/access/accesstest"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
)

// Users of the tests.
var (
	alice = Owner{Cred: access.Cred{Uid: 1001, Gid: 1001}}
	bob   = Owner{Cred: access.Cred{Uid: 1002, Gid: 1002}}
)

// sharedTree is an ImageFolder "data" with a public class, alice's
// private class (0700), a class bob may search but not list, and a file
// only alice may read in the public class; "lists/" holds a list of every
// file, readable by alice alone, and one everyone may read. Needs root.
func sharedTree(t *testing.T) *Registry {
	t.Helper()
	spec := map[string]string{
		"data/pub/mine.jpg":   "600 1001 1001",
		"data/alice/only.png": "644 1001 1001",
		"data/alice/":         "700 1001 1001",
		"data/hidden/":        "711 1001 1001",
		"lists/private.txt":   "600 1001 1001",
		"lists/open.txt":      "644 1001 1001",
	}
	for i := 0; i < 4; i++ {
		spec[fmt.Sprintf("data/pub/%d.jpg", i)] = "644 1001 1001"
		spec[fmt.Sprintf("data/alice/secret-%d.jpg", i)] = "644 1001 1001"
		spec[fmt.Sprintf("data/hidden/%d.jpg", i)] = "644 1001 1001"
	}
	root := accesstest.Tree(t, spec)
	all := "pub/0.jpg\nalice/secret-0.jpg\npub/mine.jpg\n"
	for _, l := range []string{"lists/private.txt", "lists/open.txt"} {
		if err := os.WriteFile(filepath.Join(root, l), []byte(all), 0); err != nil {
			t.Fatal(err)
		}
	}
	cat, err := catalog.Open(context.Background(), catalog.DefaultConfig(root))
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{Snapshot: cat.Snapshot, ReadFile: func(e *catalog.Entry) ([]byte, error) {
		return os.ReadFile(filepath.Join(root, e.Path()))
	}})
}

func applyAs(r *Registry, who Owner, line string) error {
	cmds, err := control.Parse([]byte(line))
	if err != nil {
		return err
	}
	return r.ApplyAs(who, cmds[0].(control.Job))
}

func paths(j *Job) string {
	var out []string
	for _, s := range j.Samples {
		out = append(out, s.Path())
	}
	return strings.Join(out, ",")
}

// TestPlansShowOnlyWhatTheOwnerReads: a job's samples, and so its plans
// and prefetches, are the files its owner may read by their paths: bob's
// job over the parent directory leaves out alice's 0700 class, the class
// he may not list and the file he may not read; alice's and root's hold
// everything; a list file bob may not read is refused without quoting
// it, and bob's job over a readable list keeps only what he may read.
// Only a job every user may read whole is public.
func TestPlansShowOnlyWhatTheOwnerReads(t *testing.T) {
	r := sharedTree(t)
	line := "root=data sampler=sequential epoch=0"
	if err := applyAs(r, bob, "job=b "+line); err != nil {
		t.Fatal(err)
	}
	if err := applyAs(r, alice, "job=a "+line); err != nil {
		t.Fatal(err)
	}
	if err := applyAs(r, RootOwner, "job=r "+line); err != nil {
		t.Fatal(err)
	}
	if got := paths(r.Get("b")); got != "data/pub/0.jpg,data/pub/1.jpg,data/pub/2.jpg,data/pub/3.jpg" {
		t.Errorf("bob's job reads %s", got)
	}
	if r.Get("a").N() != 14 || r.Get("r").N() != 14 {
		t.Errorf("alice's job has %d samples, root's %d; want 14", r.Get("a").N(), r.Get("r").N())
	}
	if !r.Get("b").Public || r.Get("a").Public {
		t.Errorf("public: bob's %v (every sample readable by all), alice's %v (not)", r.Get("b").Public, r.Get("a").Public)
	}
	if r.Get("a").Owner.Uid != alice.Uid || r.Get("b").Owner.Uid != bob.Uid {
		t.Errorf("owners %d %d", r.Get("a").Owner.Uid, r.Get("b").Owner.Uid)
	}
	err := applyAs(r, bob, "job=l root=data dataset=list:lists/private.txt epoch=0")
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("bob's job over alice's list: %v", err)
	}
	if err := applyAs(r, bob, "job=l root=data dataset=list:lists/open.txt epoch=0"); err != nil {
		t.Fatal(err)
	}
	if got := paths(r.Get("l")); got != "data/pub/0.jpg" {
		t.Errorf("bob's list job reads %s", got)
	}
	if err := applyAs(r, bob, "job=x root=data extensions=.png epoch=0"); err == nil || !strings.Contains(err.Error(), "may read") {
		t.Errorf("bob's job over what only alice may read: %v", err)
	}
	samples, err := r.IndexAs(bob.Cred, control.Job{Root: "data", Dataset: "imagefolder", Extensions: []string{".jpg"}})
	if err != nil || len(samples) != 4 {
		t.Errorf("bob's index for inference: %d samples, %v", len(samples), err)
	}
}

// TestJobsBelongToTheirOwners: another user can neither change nor end a
// job; root and the operator can, and the job stays its owner's.
func TestJobsBelongToTheirOwners(t *testing.T) {
	r := sharedTree(t)
	r.cfg.Operator = 1500
	if err := applyAs(r, alice, "job=a root=data epoch=0"); err != nil {
		t.Fatal(err)
	}
	if err := applyAs(r, bob, "job=a root=data epoch=3"); !errors.Is(err, ErrNotOwner) || !errors.Is(err, control.ErrSyntax) {
		t.Errorf("bob moved alice's job: %v", err)
	}
	if err := r.EndAs(bob, "a"); !errors.Is(err, ErrNotOwner) {
		t.Errorf("bob ended alice's job: %v", err)
	}
	if err := r.ApplyInferred(bob.Cred, control.Job{Name: "a", Set: map[string]bool{"job": true, "epoch": true}, Epoch: 5}); !errors.Is(err, ErrNotOwner) {
		t.Errorf("bob's inferred job took alice's name: %v", err)
	}
	if j := r.Get("a"); j.Spec.Epoch != 0 || j.Owner.Uid != alice.Uid {
		t.Fatalf("alice's job is now %+v", j.Spec)
	}
	if err := applyAs(r, Owner{Cred: access.Cred{Uid: 1500}}, "job=a epoch=2"); err != nil {
		t.Errorf("the operator cannot move a job: %v", err)
	}
	if j := r.Get("a"); j.Spec.Epoch != 2 || j.Owner.Uid != alice.Uid || j.N() != 14 {
		t.Errorf("after the operator's line: epoch %d, owner %d, %d samples", j.Spec.Epoch, j.Owner.Uid, j.N())
	}
	if err := r.EndAs(RootOwner, "a"); err != nil {
		t.Errorf("root cannot end a job: %v", err)
	}
}

// TestOwnerReads: a read counts for a job only if its reader is the
// job's user; a read without a pid (another pid namespace) only for a job
// announced from one.
func TestOwnerReads(t *testing.T) {
	for _, c := range []struct {
		o     Owner
		uid   uint32
		known bool
		want  bool
	}{
		{alice, 1001, true, true}, {alice, 1002, true, false}, {alice, 0, true, false},
		{alice, 1001, false, false}, {RootOwner, 1001, true, false},
		{Owner{Cred: alice.Cred, Foreign: true}, 0, false, true},
		{Owner{Cred: alice.Cred, Foreign: true}, 1001, true, true},
	} {
		if got := c.o.Reads(c.uid, c.known); got != c.want {
			t.Errorf("%+v reads by uid %d (pid known %v): %v, want %v", c.o, c.uid, c.known, got, c.want)
		}
	}
}

// TestPositionsWithinTheMemoryBound: whatever the lines, the positions and
// index samples the jobs hold stay within 8 per file of SOURCE (at least
// MinPositions): lines over it are refused with one line that says so.
// 64 lines over a small dataset were accepted up to 32 Mi positions.
func TestPositionsWithinTheMemoryBound(t *testing.T) {
	files := map[string]string{}
	for i := 0; i < 300; i++ {
		files[fmt.Sprintf("d/c%d/%d.jpg", i%3, i)] = "x"
	}
	r := registry(t, files)
	if got := r.MaxPositions(); got != MinPositions {
		t.Fatalf("bound %d over 300 files, want %d", got, MinPositions)
	}
	accepted, refused := 0, 0
	for i := 0; i < 64; i++ {
		// 256 ranks × 300 × 16 = 1.2 M positions each.
		line := fmt.Sprintf("job=j%d root=d sampler=random world=1024 ranks=%s lookahead=%d epoch=0", i, rankList(i%4*200, 1+i%256), 1+i%16)
		err := apply(r, line)
		if err != nil {
			refused++
			if !strings.Contains(err.Error(), "memory bound") || strings.Contains(err.Error(), "\n") || !errors.Is(err, control.ErrSyntax) {
				t.Errorf("refusal: %v", err)
			}
			continue
		}
		accepted++
		var total int64
		seen := map[string]bool{}
		for _, j := range r.All() {
			total += Positions(j.Spec, j.N(), false)
			if !seen[j.Spec.Root] {
				seen[j.Spec.Root] = true
				total += int64(j.N())
			}
		}
		if total > r.MaxPositions() {
			t.Fatalf("after %d lines the jobs hold %d positions, over %d", accepted, total, r.MaxPositions())
		}
	}
	if accepted == 0 || refused == 0 {
		t.Errorf("%d accepted, %d refused: the bound did not bite", accepted, refused)
	}
}

func rankList(from, n int) string {
	var out []string
	for r := from; r < from+n; r++ {
		out = append(out, fmt.Sprint(r))
	}
	return strings.Join(out, ",")
}
