package owners

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/jobs"
	"github.com/dlfs/dlfs/placement"
)

// listed is a catalog.Lister of synthetic files: a catalog of millions
// of files in memory, without a tree on disk.
type listed []catalog.File

func (l listed) List(context.Context) ([]catalog.File, error) {
	return append([]catalog.File(nil), l...), nil
}

// growingList lists what it holds now: a dataset that changes.
type growingList struct {
	mu    sync.Mutex
	files listed
}

func (l *growingList) List(ctx context.Context) ([]catalog.File, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.files.List(ctx)
}

// syntheticFiles are n files of 1 KiB under train/, in 1,000 classes.
func syntheticFiles(n int) listed {
	files := make(listed, n)
	for i := range files {
		files[i] = catalog.File{Path: fmt.Sprintf("train/c%03d/%08d.jpg", i%1000, i), Mode: syscall.S_IFREG | 0o644, Size: 1024, Mtime: 1, Ino: uint64(i + 1)}
	}
	return files
}

// syntheticCatalog is a catalog of syntheticFiles(n).
func syntheticCatalog(tb testing.TB, n int) *catalog.Catalog {
	tb.Helper()
	return listedCatalog(tb, syntheticFiles(n))
}

// listedCatalog is a catalog of what l lists.
func listedCatalog(tb testing.TB, l catalog.Lister) *catalog.Catalog {
	tb.Helper()
	cfg := catalog.DefaultConfig(tb.TempDir())
	cfg.Lister = l
	cat, err := catalog.Open(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return cat
}

// cpuSeconds is this process's user and system time so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// staticCluster is a membership the test sets: Alive returns what it
// holds now.
type staticCluster struct {
	mu    sync.Mutex
	alive []cluster.Member
}

func (c *staticCluster) set(ms []cluster.Member) { c.mu.Lock(); c.alive = ms; c.mu.Unlock() }
func (c *staticCluster) Alive() []cluster.Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]cluster.Member(nil), c.alive...)
}
func (c *staticCluster) Subscribe() <-chan struct{} { return make(chan struct{}) }
func (c *staticCluster) StartMeta() cluster.Meta    { return cluster.Meta{} }
func (c *staticCluster) SetMeta(cluster.Meta) error { return nil }

// jobMembers are n members of dataset "d", member i running rank i of
// one job of world n over train/, as gossip delivers them.
func jobMembers(tb testing.TB, n int) []cluster.Member {
	tb.Helper()
	ms := make([]cluster.Member, n)
	for i := range ms {
		cmds, err := control.Parse([]byte(fmt.Sprintf("job=j root=train seed=5 world=%d rank=%d epoch=0\n", n, i)))
		if err != nil || len(cmds) != 1 {
			tb.Fatalf("parse: %v", err)
		}
		spec := cmds[0].(control.Job).Merge(control.DefaultJob())
		meta := cluster.Meta{DataAddr: fmt.Sprintf("127.0.0.1:%d", 1+i), Dataset: "d", RAM: 1 << 40, Placement: placement.HashVersion, Jobs: []string{spec.Line()}}
		b, err := meta.Encode()
		if err != nil {
			tb.Fatal(err)
		}
		if meta, err = cluster.DecodeMeta(b); err != nil {
			tb.Fatal(err)
		}
		ms[i] = cluster.Member{Name: fmt.Sprintf("n%d", i), Meta: meta}
	}
	return ms
}

// tableChangeOwners is node n0's Owners over a synthetic catalog of
// files, with a real job registry that runs rank 0 of jobMembers' job,
// not started: the test calls rebuild.
func tableChangeOwners(tb testing.TB, files int) (*Owners, *staticCluster) {
	tb.Helper()
	return catalogOwners(tb, syntheticCatalog(tb, files))
}

// catalogOwners is tableChangeOwners over cat.
func catalogOwners(tb testing.TB, cat *catalog.Catalog) (*Owners, *staticCluster) {
	tb.Helper()
	reg := jobs.New(jobs.Config{Snapshot: cat.Snapshot})
	if err := reg.Apply(jobMembers(tb, 3)[0].Meta.Specs[0]); err != nil {
		tb.Fatal(err)
	}
	c := &staticCluster{}
	o, err := New(Config{NodeName: "n0", Dataset: "d"}, Deps{Cluster: c, Jobs: reg, Peers: noPeers{}, Model: flatModel{},
		Snapshot: cat.Snapshot, Tag: func(*catalog.Entry, string) uint64 { return 0 }, BlockSize: 1 << 20})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(o.Close)
	return o, c
}

// BenchmarkTableChange is one table change of a node of a 3-member
// cluster whose one job reads every file: a member leaves, or comes
// back. Profile it with -cpuprofile.
func BenchmarkTableChange(b *testing.B) {
	for _, files := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprint(files), func(b *testing.B) {
			o, c := tableChangeOwners(b, files)
			three := jobMembers(b, 3)
			two := three[:2] // n2 left
			others := -1
			c.set(three)
			o.rebuild(&others)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuSeconds()
			defer func() { b.ReportMetric((cpuSeconds()-cpu0)/float64(b.N), "CPU-s/op") }()
			for i := range b.N {
				if i%2 == 0 {
					c.set(two)
				} else {
					c.set(three)
				}
				o.rebuild(&others)
			}
		})
	}
}

// TestDemandCounts: demand counts each member's planned reads of each
// sample as the job's sampler draws them, at the first table change
// (which counts the ranks' reads) and at the next ones (which reuse
// them): a member leaving takes its rank's reads with it, and one coming
// back brings them back.
func TestDemandCounts(t *testing.T) {
	list := &growingList{files: syntheticFiles(500)}
	cat := listedCatalog(t, list)
	o, c := catalogOwners(t, cat)
	three := jobMembers(t, 3)
	spec := three[0].Meta.Specs[0]
	for _, step := range []struct {
		name   string
		alive  []cluster.Member
		epochs int  // the placement window
		grow   bool // 7 more files before this step
	}{{"three", three, 4, false}, {"again", three, 4, false}, {"n2 left", three[:2], 4, false}, {"n0 left", three[1:], 4, false},
		{"back", three, 4, false}, {"a shorter window", three, 2, false}, {"more files", three, 2, true}} {
		if step.grow {
			list.mu.Lock()
			list.files = syntheticFiles(len(list.files) + 7)
			list.mu.Unlock()
			if _, err := cat.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		o.cfg.PlacementEpochs = step.epochs
		samples, err := o.d.Jobs.Index(spec)
		if err != nil {
			t.Fatal(err)
		}
		c.set(step.alive)
		want := map[string][]uint32{}
		for _, s := range samples {
			want[s.Entry.Path()] = make([]uint32, len(step.alive))
		}
		jobs.Reads(spec, len(samples), spec.Epoch, o.cfg.PlacementEpochs, func(rank, i int) {
			for mi, m := range step.alive {
				if m.Name == fmt.Sprintf("n%d", rank) {
					want[samples[i].Entry.Path()][mi]++
				}
			}
		})
		d := o.demand(step.alive)
		if len(d) != len(want) {
			t.Fatalf("%s: %d samples, want %d", step.name, len(d), len(want))
		}
		for _, s := range d {
			if fmt.Sprint(s.Reads) != fmt.Sprint(want[s.Key]) || s.Size != 1024 {
				t.Fatalf("%s: %s read %v (size %d), want %v", step.name, s.Key, s.Reads, s.Size, want[s.Key])
			}
		}
	}
}

// TestTableChangeAllocations: a table change allocates a fixed number of
// arrays, not some per file: no catalog lookup, no path and no map entry
// per sample (a change at a million files made 7 M allocations, 1 GB).
func TestTableChangeAllocations(t *testing.T) {
	o, c := tableChangeOwners(t, 3000)
	three := jobMembers(t, 3)
	others := -1
	c.set(three)
	o.rebuild(&others)
	i := 0
	n := testing.AllocsPerRun(4, func() {
		if i++; i%2 == 1 {
			c.set(three[:2])
		} else {
			c.set(three)
		}
		o.rebuild(&others)
	})
	if n > 400 {
		t.Errorf("a table change at 3,000 files: %.0f allocations, want a fixed few hundred at most", n)
	}
	if p := o.Placement(); p.MovedSamples == 0 || p.PlannedSamples != 3000 {
		t.Errorf("placement stats %+v: want 3,000 samples planned, and some moved", p)
	}
}

// TestOwnedCounts: the samples and bytes stats show for each member are
// those the table gives it, demand's moves included, as a count of every
// file's owner finds, after a change as after the first table.
func TestOwnedCounts(t *testing.T) {
	o, c := tableChangeOwners(t, 2000)
	three := jobMembers(t, 3)
	others := -1
	for _, alive := range [][]cluster.Member{three, three[:2], three} {
		c.set(alive)
		o.rebuild(&others)
		v := o.View()
		if v.Table().NumAssigned() == 0 {
			t.Fatal("demand assigned nothing: the counts of its moves go untested")
		}
		want := map[string][2]int64{}
		o.d.Snapshot().Walk(func(e *catalog.Entry) {
			if e.IsRegular() {
				n := want[v.OwnerName(e.Path())]
				want[v.OwnerName(e.Path())] = [2]int64{n[0] + 1, n[1] + e.Size}
			}
		})
		for _, m := range alive {
			if s, b := o.Owned(m.Name); s != want[m.Name][0] || b != want[m.Name][1] {
				t.Errorf("%d members: %s owns %d samples, %d bytes; the table gives it %v", len(alive), m.Name, s, b, want[m.Name])
			}
		}
	}
}

// TestRankClaimedTwice: two members that claim one rank of a job (a
// restart, a misconfigured launcher) do not both count its reads: the
// first by name does, on every node alike.
func TestRankClaimedTwice(t *testing.T) {
	o, _ := tableChangeOwners(t, 300)
	ms := jobMembers(t, 3)
	ms[2].Meta = ms[0].Meta // n2 claims n0's rank 0 too; nobody runs rank 2
	d := o.demand(ms)
	var reads [3]uint32
	for _, s := range d {
		for m, r := range s.Reads {
			reads[m] += r
		}
	}
	if reads[0] == 0 || reads[1] == 0 || reads[2] != 0 {
		t.Errorf("reads by member %v: want n0 and n1 counted, n2 (rank 0's second claim) not", reads)
	}
}

// TestRebuildStopsAtClose: a table change under way when Close begins
// stops before placement (a second of CPU at a million files), so Close,
// which waits for the watcher, and the node's leave after it, are not
// held up by a table the node will never use.
func TestRebuildStopsAtClose(t *testing.T) {
	o, c := tableChangeOwners(t, 300)
	c.set(jobMembers(t, 3))
	o.Close()
	others := -1
	o.rebuild(&others)
	if o.View().Table() != nil || o.Placement().Members != 0 {
		t.Errorf("a table made after Close: %+v", o.Placement())
	}
}
