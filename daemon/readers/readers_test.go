package readers

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlfs/dlfs/access"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
	"github.com/dlfs/dlfs/sampler"
)

func TestDetect(t *testing.T) {
	seq := func(from, n, step int) []int {
		var out []int
		for i := 0; i < n; i++ {
			out = append(out, from+i*step)
		}
		return out
	}
	// Four workers reading batches of 8 side by side: 0, 8, 16, 24, 1, 9, ...
	var workers []int
	for i := 0; i < 8; i++ {
		for w := 0; w < 4; w++ {
			workers = append(workers, 100+w*8+i)
		}
	}
	var random []int
	for i := 0; i < 64; i++ {
		random = append(random, (i*7919)%5000)
	}
	for _, c := range []struct {
		name      string
		positions []int
		want      string
		ok        bool
	}{
		{"too few", seq(0, MinEvidence-1, 1), "", false},
		{"sequential", seq(40, 32, 1), "sequential", true},
		{"sequential, four workers", workers, "sequential", true},
		{"sequential with gaps", append(seq(0, 16, 2), seq(1, 10, 2)...), "sequential", true},
		{"strided, world 8 rank 3", seq(3, 20, 8), "strided 8+3", true},
		{"strided past the largest world", seq(0, 70, 2000), "random", true},
		{"random", random, "random", true},
		{"too few to call random", random[:20], "", false},
		{"a loader's first reads", []int{0, 32, 64, 96, 1, 33, 65, 97, 2, 34, 66, 98, 3, 35, 67, 99}, "sequential", true},
		{"a loader's first two reads per worker", []int{0, 32, 64, 96, 1, 33, 65, 97}, "sequential", true},
		{"mostly not in the index", append(seq(0, 16, 1), -1, -1, -1, -1, -1, -1), "", false},
	} {
		p, ok := Detect(c.positions, 5000)
		if ok != c.ok || ok && p.String() != c.want {
			t.Errorf("%s: %v (%v), want %q (%v)", c.name, p, ok, c.want, c.ok)
		}
	}
}

// TestDetectRandomEvidence: the fewest files a scan is called on are
// rarely a random order's, at any index size: a shuffled loader's first
// files must not start a scan's prefetch.
func TestDetectRandomEvidence(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{100, 5000, 1 << 20} {
		wrong := 0
		for trial := 0; trial < 10000; trial++ {
			ps := make([]int, MinEvidence)
			for i := range ps {
				ps[i] = rng.IntN(n)
			}
			if p, ok := Detect(ps, n); ok && p.Kind != "random" {
				wrong++
			}
		}
		t.Logf("n=%d: %d of 10000 random draws look like a scan", n, wrong)
		// Tiny indexes allow the most (a scan may span up to 3× its files).
		if wrong > 5 {
			t.Errorf("n=%d: %d of 10000 random draws of %d files look like a scan", n, wrong, MinEvidence)
		}
	}
}

func TestParseStatus(t *testing.T) {
	for _, c := range []struct {
		status     string
		tgid, ppid int
		ok         bool
	}{
		{"Name:\tpython3\nTgid:\t1234\nPid:\t1240\nPPid:\t1000\n", 1234, 1000, true},
		{"Tgid:\t1\nPPid:\t0\n", 1, 0, true},
		{"Name:\tx\nPPid:\t1000\n", 0, 0, false},
		{"Tgid:\t12\nPPid:\t-5\n", 0, 0, false},
		{"Tgid:\tabc\nPPid:\t5\n", 0, 0, false},
	} {
		tgid, ppid, err := parseStatus([]byte(c.status))
		if (err == nil) != c.ok || tgid != c.tgid || ppid != c.ppid {
			t.Errorf("%q: %d %d %v", c.status, tgid, ppid, err)
		}
	}
}

func FuzzParseStatus(f *testing.F) {
	f.Add([]byte("Name:\tpython3\nTgid:\t1234\nPid:\t1240\nPPid:\t1000\n"))
	f.Add([]byte("Tgid:::\nPPid:\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if tgid, ppid, err := parseStatus(b); err == nil && (tgid <= 0 || ppid < 0) {
			t.Fatalf("tgid %d, ppid %d accepted", tgid, ppid)
		}
	})
}

// fakeProc writes a /proc tree: pid -> (ppid, cmdline), each process
// root's and started at 1000+pid.
func fakeProc(t *testing.T, procs map[int][2]string) string {
	root := t.TempDir()
	for pid, p := range procs {
		ppid, _ := strconv.Atoi(p[0])
		setProc(t, root, fakeProcess{pid: pid, ppid: ppid, cmdline: p[1], start: 1000 + uint64(pid)})
	}
	return root
}

// fakeProcess is a fake process.
type fakeProcess struct {
	pid, ppid int
	tgid      int // 0: pid
	cmdline   string
	uid       uint32
	start     uint64
}

// setProc writes (or rewrites) p in a fake /proc under root.
func setProc(t *testing.T, root string, p fakeProcess) {
	t.Helper()
	if p.tgid == 0 {
		p.tgid = p.pid
	}
	dir := filepath.Join(root, fmt.Sprint(p.pid))
	os.MkdirAll(dir, 0o755)
	status := fmt.Sprintf("Name:\tpython3\nTgid:\t%d\nPPid:\t%d\nUid:\t%[3]d\t%[3]d\t%[3]d\t%[3]d\nGid:\t%[3]d\t%[3]d\t%[3]d\t%[3]d\nGroups:\t\n", p.tgid, p.ppid, p.uid)
	stat := fmt.Sprintf("%d (python3) S %d %d %d 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 %d 1000 10\n", p.pid, p.ppid, p.tgid, p.tgid, p.start)
	for name, data := range map[string]string{"status": status, "stat": stat, "cmdline": p.cmdline} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// endProc removes pid from a fake /proc: it exited.
func endProc(root string, pid int) { os.RemoveAll(filepath.Join(root, fmt.Sprint(pid))) }

// fakeJobs records what the tracker does to the registry.
type fakeJobs struct {
	mu        sync.Mutex
	lines     []control.Job
	ended     []string
	ahead     map[string]int
	announced bool
	owners    map[string]uint32 // job -> the uid it was inferred for
	// announcedBy: users with an announced job
	announcedBy map[uint32]bool
	// announcedRoots: the roots of each user's announced jobs
	announcedRoots map[uint32][]string
}

func (f *fakeJobs) ApplyInferred(owner access.Cred, l control.Job) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lines = append(f.lines, l)
	if f.owners == nil {
		f.owners = map[string]uint32{}
	}
	f.owners[l.Name] = owner.Uid
	return nil
}
func (f *fakeJobs) End(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended = append(f.ended, name)
	return nil
}
func (f *fakeJobs) SetAhead(name string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ahead[name] = n
}
func (f *fakeJobs) AnnouncedRoots(uid uint32) []string {
	if f.announced || f.announcedBy[uid] {
		return []string{"."}
	}
	return f.announcedRoots[uid]
}

// tree is an ImageFolder of classes × per files under "train" in a real
// catalog.
func tree(t *testing.T, classes, per int) (*catalog.Snapshot, []*catalog.Entry) {
	snap, files := dataTree(t, classes, map[string]int{"train": per})
	return snap, files["train"]
}

func tracker(t *testing.T, snap *catalog.Snapshot, proc string, jobs *fakeJobs) *Tracker {
	tr := New(Config{ProcRoot: proc, Interval: time.Millisecond, Snapshot: func() *catalog.Snapshot { return snap },
		Index: func(root string, exts []string, cred access.Cred) ([]folder.Sample, error) {
			idx, err := folder.Build(snap, root, exts)
			if err != nil {
				return nil, err
			}
			return idx.Samples, nil
		}, Jobs: jobs, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	tr.Start()
	t.Cleanup(tr.Close)
	return tr
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestSequentialStream: a reader and its two forked workers (same command
// line) are one stream; reading the dataset in index order makes a
// sequential job rooted at the dataset, not at the first class; wrapping
// around moves it to epoch 1; confirmed reads lift its bound; random
// reads end it; the other process (another command line) is its own stream.
func TestSequentialStream(t *testing.T) {
	snap, files := tree(t, 4, 50)
	proc := fakeProc(t, map[int][2]string{
		100: {"1", "python3\x00train.py"}, 101: {"100", "python3\x00train.py"}, 102: {"100", "python3\x00train.py"},
		200: {"1", "tar\x00cf\x00-"},
	})
	jobs := &fakeJobs{ahead: map[string]int{}}
	tr := tracker(t, snap, proc, jobs)
	read := func(pid uint32, e *catalog.Entry) { tr.Observe(pid, e, 0, true, "pfs", time.Millisecond) }
	for i := 0; i < 40; i++ {
		read(uint32(101+i%2), files[i])
	}
	read(200, files[7])
	waitFor(t, "an inferred job", func() bool { jobs.mu.Lock(); defer jobs.mu.Unlock(); return len(jobs.lines) == 1 })
	l := jobs.lines[0]
	if l.Name != "auto-100" || l.Root != "train" || l.Sampler != "sequential" || l.Epoch != 0 || strings.Join(l.Extensions, ",") != ".jpg" {
		t.Errorf("inferred %+v", l)
	}
	st := tr.Streams()
	if len(st) != 2 || st[0].Pid != 100 || st[0].Files != 40 || st[0].Pattern != "sequential" || st[0].Job != "auto-100" || st[1].Pid != 200 {
		t.Errorf("streams %+v", st)
	}
	// The rest of the pass, then the start of the next.
	for i := 40; i < len(files); i++ {
		read(101, files[i])
	}
	for i := 0; i < 20; i++ {
		read(102, files[i])
	}
	waitFor(t, "epoch 1", func() bool {
		jobs.mu.Lock()
		defer jobs.mu.Unlock()
		return len(jobs.lines) == 2 && jobs.lines[1].Epoch == 1 && jobs.ahead["auto-100"] > MinAhead
	})
	// Random reads: the guess is dropped.
	for i := 0; i < 40; i++ {
		read(101, files[(i*97)%len(files)])
	}
	waitFor(t, "the job ended", func() bool { jobs.mu.Lock(); defer jobs.mu.Unlock(); return len(jobs.ended) == 1 })
	if st := tr.Streams(); st[0].Job != "" || st[0].Pattern != "random" {
		t.Errorf("after random reads: %+v", st[0])
	}
}

// TestStridedStream: DistributedSampler(shuffle=False), world 4, rank 2.
func TestStridedStream(t *testing.T) {
	snap, files := tree(t, 3, 40)
	jobs := &fakeJobs{ahead: map[string]int{}}
	tr := tracker(t, snap, fakeProc(t, map[int][2]string{7: {"1", "python3"}}), jobs)
	for i := 2; i < len(files); i += 4 {
		tr.Observe(7, files[i], 0, true, "pfs", time.Millisecond)
	}
	waitFor(t, "an inferred job", func() bool { jobs.mu.Lock(); defer jobs.mu.Unlock(); return len(jobs.lines) == 1 })
	if l := jobs.lines[0]; l.Sampler != "distributed" || l.Shuffle || l.World != 4 || len(l.Ranks) != 1 || l.Ranks[0] != 2 {
		t.Errorf("inferred %+v", l)
	}
}

// TestTorchStream: rank 1 of 2 of a DistributedSampler with the default
// seed, read by a DataLoader with 2 workers and batches of 8: the search
// finds it, the job follows the rank through epoch 0 into epoch 1 (seed +
// 1), and the stats name it.
func TestTorchStream(t *testing.T) {
	snap, files := tree(t, 5, 60)
	jobs := &fakeJobs{ahead: map[string]int{}}
	tr := tracker(t, snap, fakeProc(t, map[int][2]string{9: {"1", "python3"}}), jobs)
	n := len(files)
	for epoch := 0; epoch < 2; epoch++ {
		order := sampler.Distributed{N: n, World: 2, Rank: 1, Shuffle: true, Seed: 0}.Epoch(epoch)
		for _, i := range loaderReads(order, 2, 8, len(order)) {
			tr.Observe(9, files[i], 0, true, "pfs", time.Millisecond)
		}
		if epoch == 0 {
			waitFor(t, "an inferred torch job", func() bool { jobs.mu.Lock(); defer jobs.mu.Unlock(); return len(jobs.lines) == 1 })
		}
	}
	waitFor(t, "epoch 1", func() bool { jobs.mu.Lock(); defer jobs.mu.Unlock(); return len(jobs.lines) == 2 })
	l := jobs.lines[0]
	if l.Sampler != "distributed" || !l.Shuffle || l.Seed != 0 || l.World != 2 || len(l.Ranks) != 1 || l.Ranks[0] != 1 || jobs.lines[1].Epoch != 1 {
		t.Errorf("inferred %+v then epoch %d", l, jobs.lines[1].Epoch)
	}
	if st := tr.Streams()[0]; st.Pattern != "torch seed=0 world=2 rank=1" || st.Job != "auto-9" {
		t.Errorf("stream %+v", st)
	}
	jobs.mu.Lock()
	defer jobs.mu.Unlock()
	if len(jobs.ended) != 0 {
		t.Errorf("the job was ended: %v", jobs.ended)
	}
}

// TestNotInferred: nothing is inferred while a job is announced, nor for
// a stream whose reads do not wait on the PFS, whatever its order.
func TestNotInferred(t *testing.T) {
	for _, c := range []struct {
		name      string
		announced bool
		waited    bool
	}{
		{"a job announced", true, true},
		{"served by the caches", false, false},
	} {
		snap, files := tree(t, 2, 40)
		jobs := &fakeJobs{ahead: map[string]int{}, announced: c.announced}
		tr := tracker(t, snap, fakeProc(t, map[int][2]string{7: {"1", "python3"}}), jobs)
		for _, e := range files {
			tr.Observe(7, e, 0, c.waited, "pfs", time.Millisecond)
		}
		waitFor(t, "a judgement", func() bool { return tr.judged.Load() > 0 })
		jobs.mu.Lock()
		if len(jobs.lines) != 0 {
			t.Errorf("%s: inferred %v", c.name, jobs.lines)
		}
		jobs.mu.Unlock()
	}
}

// TestRandomSamplerStream: RandomSampler with a generator seeded 3 reads
// epoch 0 as DistributedSampler(world 1, seed 3) would, and epoch 1 as
// only RandomSampler does: the job turns into sampler=random at the wrap.
func TestRandomSamplerStream(t *testing.T) {
	snap, files := tree(t, 4, 50)
	jobs := &fakeJobs{ahead: map[string]int{}}
	tr := tracker(t, snap, fakeProc(t, map[int][2]string{9: {"1", "python3"}}), jobs)
	for epoch := 0; epoch < 2; epoch++ {
		order := sampler.Random{N: len(files), Seed: 3}.Epoch(epoch)
		for _, i := range loaderReads(order, 2, 8, len(order)) {
			tr.Observe(9, files[i], 0, true, "pfs", time.Millisecond)
		}
		if epoch == 0 {
			waitFor(t, "an inferred job", func() bool { jobs.mu.Lock(); defer jobs.mu.Unlock(); return len(jobs.lines) == 1 })
		}
	}
	waitFor(t, "epoch 1", func() bool {
		jobs.mu.Lock()
		defer jobs.mu.Unlock()
		t.Logf("lines %d ended %v stream %+v", len(jobs.lines), jobs.ended, tr.Streams())
		return len(jobs.lines) == 2
	})
	//waitFor(t, "epoch 1", func() bool { jobs.mu.Lock(); defer jobs.mu.Unlock(); return len(jobs.lines) == 2 })
	jobs.mu.Lock()
	defer jobs.mu.Unlock()
	if l := jobs.lines[1]; l.Sampler != "random" || l.Seed != 3 || l.Epoch != 1 || len(jobs.ended) != 0 {
		t.Errorf("epoch 1 as %+v (ended %v)", l, jobs.ended)
	}
}

// TestInferredLine: the job an inferred pattern implies is the one its
// line says, as the control file would read it; an index whose
// extensions no line can carry gets no job.
func TestInferredLine(t *testing.T) {
	for _, c := range []struct {
		p     Pattern
		guess Guess
		want  string
	}{
		{Pattern{Kind: "sequential", Stride: 1}, Guess{}, "sampler=sequential"},
		{Pattern{Kind: "strided", Stride: 4, Rank: 3}, Guess{}, "sampler=distributed shuffle=false world=4 ranks=3"},
		{Pattern{Kind: "torch", Stride: 1}, Guess{Seed: 1 << 40, World: 8, Rank: 5}, "sampler=distributed shuffle=true seed=1099511627776 world=8 ranks=5"},
	} {
		got, err := inferredLine("auto-7", "train/a", ".jpeg,.png", c.p, c.guess)
		if err != nil {
			t.Fatalf("%v: %v", c.p, err)
		}
		cmds, err := control.Parse([]byte("job=auto-7 root=train/a dataset=imagefolder extensions=.jpeg,.png epoch=0 lookahead=2 " + c.want))
		if err != nil {
			t.Fatal(err)
		}
		want := cmds[0].(control.Job)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%v: built %+v, want %+v", c.p, got, want)
		}
	}
	if _, err := inferredLine("auto-7", "train", ".a,", Pattern{Kind: "sequential", Stride: 1}, Guess{}); err == nil {
		t.Error("an empty extension was accepted")
	}
}
