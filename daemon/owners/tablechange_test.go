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

// syntheticCatalog is a catalog of n files of 1 KiB under train/, in
// 1,000 classes.
func syntheticCatalog(tb testing.TB, n int) *catalog.Catalog {
	tb.Helper()
	files := make(listed, n)
	for i := range files {
		files[i] = catalog.File{Path: fmt.Sprintf("train/c%03d/%08d.jpg", i%1000, i), Mode: syscall.S_IFREG | 0o644, Size: 1024, Mtime: 1, Ino: uint64(i + 1)}
	}
	cfg := catalog.DefaultConfig(tb.TempDir())
	cfg.Lister = files
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
	cat := syntheticCatalog(tb, files)
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
	o, c := tableChangeOwners(t, 500)
	three := jobMembers(t, 3)
	spec := three[0].Meta.Specs[0]
	samples, err := o.d.Jobs.Index(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		name  string
		alive []cluster.Member
	}{{"three", three}, {"again", three}, {"n2 left", three[:2]}, {"n0 left", three[1:]}, {"back", three}} {
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
