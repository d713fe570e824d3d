package readers

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dlfs/dlfs/access"
	"github.com/dlfs/dlfs/access/accesstest"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
	"github.com/dlfs/dlfs/jobs"
)

const aliceUid, bobUid = 1001, 1002

// trackerWith is tracker with cfg's fields set by mod.
func trackerWith(t *testing.T, snap *catalog.Snapshot, proc string, js Jobs, mod func(*Config)) *Tracker {
	cfg := Config{ProcRoot: proc, Interval: time.Millisecond, Snapshot: func() *catalog.Snapshot { return snap },
		Index: func(root string, exts []string, cred access.Cred) ([]folder.Sample, error) {
			idx, err := folder.Build(snap, root, exts)
			if err != nil {
				return nil, err
			}
			return idx.Samples, nil
		}, Jobs: js, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	mod(&cfg)
	tr := New(cfg)
	tr.Start()
	t.Cleanup(tr.Close)
	return tr
}

func (f *fakeJobs) count() (lines, ended int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.lines), len(f.ended)
}

func streamOf(tr *Tracker, pid int) (StreamStats, bool) { return tr.Stream(pid) }

// TestRecycledPid: alice's DataLoader worker exits and bob's process gets
// its pid (with the same command line and alice's process as parent, as
// far as /proc could say). Bob's reads are his own stream's: alice's
// stream counts none of them, and its inferred job, which his random
// reads contradict, stays. A pid was trusted for life.
func TestRecycledPid(t *testing.T) {
	snap, files := tree(t, 4, 50)
	proc := t.TempDir()
	setProc(t, proc, fakeProcess{pid: 100, ppid: 1, cmdline: "python3\x00train.py", uid: aliceUid, start: 500})
	setProc(t, proc, fakeProcess{pid: 101, ppid: 100, cmdline: "python3\x00train.py", uid: aliceUid, start: 501})
	js := &fakeJobs{ahead: map[string]int{}}
	tr := trackerWith(t, snap, proc, js, func(c *Config) { c.Recheck = time.Nanosecond })
	for i := 0; i < 40; i++ {
		if r := tr.Observe(101, files[i], 0, true, "pfs", time.Millisecond); !r.Known || r.Stream.Pid != 100 || r.Cred.Uid != aliceUid {
			t.Fatalf("alice's worker's read attributed to %+v", r)
		}
	}
	waitFor(t, "alice's inferred job", func() bool { n, _ := js.count(); return n == 1 })
	before, _ := streamOf(tr, 100)
	// The worker exits; bob's process takes its pid.
	setProc(t, proc, fakeProcess{pid: 101, ppid: 100, cmdline: "python3\x00train.py", uid: bobUid, start: 9000})
	for i := 0; i < 80; i++ {
		r := tr.Observe(101, files[(i*97)%len(files)], 0, true, "pfs", time.Millisecond)
		if r.Stream.Pid != 101 || r.Cred.Uid != bobUid {
			t.Fatalf("bob's read attributed to %+v", r)
		}
	}
	waitFor(t, "a judgement of bob's reads", func() bool { st, ok := streamOf(tr, 101); return ok && st.Pattern == "random" })
	after, _ := streamOf(tr, 100)
	if after.Reads != before.Reads || after.Job != "auto-100" {
		t.Errorf("alice's stream went from %d reads to %d, job %q", before.Reads, after.Reads, after.Job)
	}
	if _, ended := js.count(); ended != 0 {
		t.Errorf("alice's inferred job was ended: %v", js.ended)
	}
	if bob, _ := streamOf(tr, 101); bob.Uid != bobUid || bob.Reads != 80 {
		t.Errorf("bob's stream %+v", bob)
	}
}

// TestRecycledStreamPid: the stream's own process exits and another takes
// its pid: the old stream ends (and its inferred job with it), and the new
// process starts a stream of its own.
func TestRecycledStreamPid(t *testing.T) {
	snap, files := tree(t, 4, 50)
	proc := t.TempDir()
	setProc(t, proc, fakeProcess{pid: 100, ppid: 1, cmdline: "python3", uid: aliceUid, start: 500})
	js := &fakeJobs{ahead: map[string]int{}}
	tr := trackerWith(t, snap, proc, js, func(c *Config) { c.Recheck = time.Nanosecond; c.ExitCheck = time.Hour })
	for i := 0; i < 40; i++ {
		tr.Observe(100, files[i], 0, true, "pfs", time.Millisecond)
	}
	waitFor(t, "alice's inferred job", func() bool { n, _ := js.count(); return n == 1 })
	setProc(t, proc, fakeProcess{pid: 100, ppid: 1, cmdline: "cat", uid: bobUid, start: 7000})
	tr.Observe(100, files[3], 0, true, "pfs", time.Millisecond)
	waitFor(t, "the old stream's job to end", func() bool { _, ended := js.count(); return ended == 1 })
	if st := tr.Streams(); len(st) != 1 || st[0].Uid != bobUid || st[0].Reads != 1 {
		t.Errorf("streams %+v", st)
	}
}

// TestStreamEndsWithItsProcess: a stream whose process exited is dropped
// within ExitCheck, its inferred job ended, although Idle (2 min) has not
// passed; and short-lived processes that filled the table leave room for
// the next reader.
func TestStreamEndsWithItsProcess(t *testing.T) {
	snap, files := tree(t, 4, 50)
	proc := fakeProc(t, map[int][2]string{100: {"1", "python3"}})
	js := &fakeJobs{ahead: map[string]int{}}
	tr := trackerWith(t, snap, proc, js, func(c *Config) { c.ExitCheck = 5 * time.Millisecond; c.MaxStreams = 4 })
	for i := 0; i < 40; i++ {
		tr.Observe(100, files[i], 0, true, "pfs", time.Millisecond)
	}
	waitFor(t, "an inferred job", func() bool { n, _ := js.count(); return n == 1 })
	endProc(proc, 100)
	waitFor(t, "the stream to end with its process", func() bool { _, ok := streamOf(tr, 100); return !ok })
	waitFor(t, "its job to end", func() bool { _, ended := js.count(); return ended == 1 })

	// head over the dataset, four times: the table fills, then empties
	// as they exit.
	for pid := 201; pid <= 204; pid++ {
		setProc(t, proc, fakeProcess{pid: pid, ppid: 1, cmdline: "head", start: 1})
		tr.Observe(uint32(pid), files[pid-201], 0, true, "pfs", time.Millisecond)
		endProc(proc, pid)
	}
	setProc(t, proc, fakeProcess{pid: 300, ppid: 1, cmdline: "python3", start: 1})
	waitFor(t, "the next reader to be followed", func() bool {
		tr.Observe(300, files[0], 0, true, "pfs", time.Millisecond)
		_, ok := streamOf(tr, 300)
		return ok
	})
}

// TestStreamSlotsShared: a user holding every stream slot gives one up to
// another user's reader, down to its share and no further.
func TestStreamSlotsShared(t *testing.T) {
	snap, files := tree(t, 2, 10)
	proc := t.TempDir()
	js := &fakeJobs{ahead: map[string]int{}}
	tr := trackerWith(t, snap, proc, js, func(c *Config) { c.MaxStreams = 4; c.ExitCheck = time.Hour })
	read := func(pid int, uid uint32) {
		setProc(t, proc, fakeProcess{pid: pid, ppid: 1, cmdline: fmt.Sprint("reader", pid), uid: uid, start: 1})
		tr.Observe(uint32(pid), files[0], 0, true, "pfs", time.Millisecond)
	}
	for pid := 10; pid < 14; pid++ {
		read(pid, bobUid)
	}
	for pid := 20; pid < 23; pid++ {
		read(pid, aliceUid)
	}
	byUid := map[uint32]int{}
	for _, st := range tr.Streams() {
		byUid[st.Uid]++
	}
	if byUid[aliceUid] != 2 || byUid[bobUid] != 2 {
		t.Errorf("streams by user %v: want 2 each (alice's third over her share)", byUid)
	}
	if _, ok := streamOf(tr, 10); ok {
		t.Error("bob's least recently read stream was kept")
	}
}

// TestInferredSlotsShared: bob's eight small readers hold every inferred
// job slot; alice's reader still gets one, taken from bob.
func TestInferredSlotsShared(t *testing.T) {
	snap, files := tree(t, 4, 50)
	proc := t.TempDir()
	js := &fakeJobs{ahead: map[string]int{}}
	tr := trackerWith(t, snap, proc, js, func(c *Config) { c.ExitCheck = time.Hour })
	scan := func(pid int, uid uint32) {
		setProc(t, proc, fakeProcess{pid: pid, ppid: 1, cmdline: fmt.Sprint("reader", pid), uid: uid, start: 1})
		for i := 0; i < 40; i++ {
			tr.Observe(uint32(pid), files[i], 0, true, "pfs", time.Millisecond)
		}
	}
	for pid := 10; pid < 10+MaxInferred; pid++ {
		scan(pid, bobUid)
		waitFor(t, "bob's inferred job", func() bool { n, _ := js.count(); return n == pid-9 })
	}
	scan(50, aliceUid)
	waitFor(t, "alice's inferred job", func() bool {
		js.mu.Lock()
		defer js.mu.Unlock()
		return js.owners["auto-50"] == aliceUid
	})
	js.mu.Lock()
	defer js.mu.Unlock()
	if len(js.ended) != 1 || !strings.HasPrefix(js.ended[0], "auto-1") {
		t.Errorf("ended %v, want one of bob's", js.ended)
	}
}

// registryJobs is a real job registry as the tracker sees it.
type registryJobs struct{ *jobs.Registry }

// TestAnnouncedJobStopsOnlyItsUsersInference: alice announced a job, so
// nothing is inferred for her readers; bob's scan still gets its job.
// Before, one user's job line turned inference off for everyone.
func TestAnnouncedJobStopsOnlyItsUsersInference(t *testing.T) {
	snap, files := tree(t, 4, 50)
	proc := t.TempDir()
	setProc(t, proc, fakeProcess{pid: 10, ppid: 1, cmdline: "a", uid: aliceUid, start: 1})
	setProc(t, proc, fakeProcess{pid: 20, ppid: 1, cmdline: "b", uid: bobUid, start: 1})
	js := &fakeJobs{ahead: map[string]int{}, announcedBy: map[uint32]bool{aliceUid: true}}
	tr := trackerWith(t, snap, proc, js, func(*Config) {})
	for i := 0; i < 40; i++ {
		tr.Observe(10, files[i], 0, true, "pfs", time.Millisecond)
		tr.Observe(20, files[i], 0, true, "pfs", time.Millisecond)
	}
	waitFor(t, "bob's inferred job", func() bool { n, _ := js.count(); return n == 1 })
	// Only alice's stream has fresh reads now: the next judgement is hers.
	j0 := tr.judged.Load()
	for i := 40; i < 48; i++ {
		tr.Observe(10, files[i], 0, true, "pfs", time.Millisecond)
	}
	waitFor(t, "alice's stream judged", func() bool { return tr.judged.Load() > j0 })
	js.mu.Lock()
	defer js.mu.Unlock()
	if len(js.lines) != 1 || js.lines[0].Name != "auto-20" {
		t.Errorf("inferred %v, want bob's alone", js.lines)
	}
}

// TestInferenceActsForTheReader: bob scans the public class of a dataset
// whose sibling class is alice's 0700 directory. His inferred job is
// rooted at the dataset but holds only what he may read: its plan names
// none of alice's files, so nothing of hers is prefetched for him.
func TestInferenceActsForTheReader(t *testing.T) {
	spec := map[string]string{"data/alice/": "700 1001 1001"}
	for i := 0; i < 40; i++ {
		spec[fmt.Sprintf("data/pub/%03d.jpg", i)] = "644 1001 1001"
		spec[fmt.Sprintf("data/alice/secret-%03d.jpg", i)] = "644 1001 1001"
	}
	cat, err := catalog.Open(context.Background(), catalog.DefaultConfig(accesstest.Tree(t, spec)))
	if err != nil {
		t.Fatal(err)
	}
	snap := cat.Snapshot()
	reg := jobs.New(jobs.Config{Snapshot: cat.Snapshot})
	proc := t.TempDir()
	setProc(t, proc, fakeProcess{pid: 77, ppid: 1, cmdline: "tar", uid: bobUid, start: 1})
	tr := trackerWith(t, snap, proc, registryJobs{reg}, func(c *Config) {
		c.Index = func(root string, exts []string, cred access.Cred) ([]folder.Sample, error) {
			line := control.DefaultJob()
			line.Root, line.Extensions = root, exts
			if root == "" {
				line.Root = "."
			}
			return reg.IndexAs(cred, line)
		}
	})
	for i := 0; i < 12; i++ { // a scan spans at most half the index
		tr.Observe(77, snap.Lookup(fmt.Sprintf("data/pub/%03d.jpg", i)), 0, true, "pfs", time.Millisecond)
	}
	waitFor(t, "bob's inferred job", func() bool { return reg.Get("auto-77") != nil })
	j := reg.Get("auto-77")
	if j.Owner.Uid != bobUid || j.N() != 40 || j.Spec.Root != "data" {
		t.Errorf("bob's job: owner %d, %d samples, root %s; want %d, 40, data", j.Owner.Uid, j.N(), j.Spec.Root, bobUid)
	}
	for _, i := range j.Order(0, 0) {
		if p := j.Samples[i].Path(); strings.Contains(p, "alice") {
			t.Fatalf("bob's plan names %s", p)
		}
	}
}
