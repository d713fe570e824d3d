package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/cluster/peer"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/daemon/owners"
	"github.com/dlfs/dlfs/jobs"
	"github.com/dlfs/dlfs/placement"
)

// The tablechange suite (issue 39, item 12): what a change of the
// placement table costs when a member leaves or joins, and how long the
// cluster takes to agree on the new one.
//
//   - 1 M files: three real members (memberlist on loopback, each with
//     its own owners.Owners, the read policy) in this process, over one
//     synthetic catalog of 1 M files (a catalog.Lister: no tree on disk)
//     and one job of world 3 that reads every file, one rank a member.
//     One member leaves gracefully (as the daemon closes: its policy,
//     then the cluster); the time is from its leave to both others'
//     tables over two members, agreed. Then it joins again. The CPU is
//     the whole process's over the change, less the idle gossip's,
//     divided by the members that rebuilt.
//   - 1 M and 10 M samples, placement alone: a synthetic demand of the
//     same job (the catalog of 10 M files would take 3 GB and minutes to
//     build here); placement.New and Assign over three members, then over
//     the two left, and the moved samples counted from the two tables.

// tableModel is a flat performance model: every source answers at once.
type tableModel struct{}

func (tableModel) Estimate(string, int64) time.Duration { return time.Millisecond }

// tableLister lists n synthetic files of 1 KiB under train/, in 1,000
// classes.
type tableLister int

func (n tableLister) List(context.Context) ([]catalog.File, error) {
	files := make([]catalog.File, n)
	for i := range files {
		files[i] = catalog.File{Path: fmt.Sprintf("train/c%03d/%08d.jpg", i%1000, i), Mode: syscall.S_IFREG | 0o644, Size: 1024, Mtime: 1, Ino: uint64(i + 1)}
	}
	return files, nil
}

// tableJob is rank r of the suite's job of world 3 over train/.
func tableJob(r int) (control.Job, error) {
	cmds, err := control.Parse(fmt.Appendf(nil, "job=bench root=train seed=5 world=3 rank=%d epoch=0\n", r))
	if err != nil {
		return control.Job{}, err
	}
	return cmds[0].(control.Job).Merge(control.DefaultJob()), nil
}

// tableNode is one member: its gossip and its read policy.
type tableNode struct {
	c *cluster.Cluster
	o *owners.Owners
}

func (n *tableNode) close() {
	if n.o != nil {
		n.o.Close()
	}
	if n.c != nil {
		n.c.Close()
	}
}

func runTableChange(o options) error {
	fmt.Printf("\n## Table changes: what a member leaving or joining costs\n\n")
	fmt.Println("One job of world 3 reads every file, one rank a member, placed by demand over 4 epochs. " +
		"Target (issue 39): at 1 M files a table change costs at most 1 CPU-s a member, and every member left has the new table within 2 s of a graceful leave.")
	if err := tableCluster(1_000_000); err != nil {
		return err
	}
	fmt.Println()
	fmt.Println("| samples | placement alone | CPU-s | allocated MB | moved samples |")
	fmt.Println("|---:|---|---:|---:|---:|")
	for _, n := range []int{1_000_000, 10_000_000} {
		if err := tablePlacement(n); err != nil {
			return err
		}
	}
	return nil
}

// tableCluster measures a leave and a join among three members over a
// catalog of files.
func tableCluster(files int) error {
	fmt.Fprintf(os.Stderr, "tablechange: a catalog of %d files ...\n", files)
	cfg := catalog.DefaultConfig(os.TempDir())
	cfg.Lister = tableLister(files)
	cat, err := catalog.Open(context.Background(), cfg)
	if err != nil {
		return err
	}
	key := []byte("dlfsbench-tablechange-key-012345")
	// One registry: the three members share this process's catalog. It
	// runs rank 0, so its index is kept, as on a member that runs one.
	reg := jobs.New(jobs.Config{Snapshot: cat.Snapshot})
	spec0, err := tableJob(0)
	if err != nil {
		return err
	}
	if err := reg.Apply(spec0); err != nil {
		return err
	}
	start := func(i int, join string) (*tableNode, error) {
		spec, err := tableJob(i)
		if err != nil {
			return nil, err
		}
		meta := cluster.Meta{DataAddr: fmt.Sprintf("127.0.0.1:%d", 1+i), Dataset: "bench", RAM: 1 << 40, Placement: placement.HashVersion, Jobs: []string{spec.Line()}}
		cc := cluster.Config{NodeName: fmt.Sprintf("n%d", i), Bind: "127.0.0.1:0", Key: key, Meta: meta}
		if join != "" {
			cc.Join = []string{join}
		}
		n := &tableNode{}
		if n.c, err = cluster.Start(cc); err != nil {
			return nil, err
		}
		peers, err := peer.NewClient(key)
		if err != nil {
			n.close()
			return nil, err
		}
		if n.o, err = owners.New(owners.Config{NodeName: cc.NodeName, Dataset: "bench"}, owners.Deps{Cluster: n.c, Jobs: reg, Peers: peers, Model: tableModel{},
			Snapshot: cat.Snapshot, Tag: func(*catalog.Entry, string) uint64 { return 0 }, BlockSize: 1 << 20}); err != nil {
			peers.Close()
			n.close()
			return nil, err
		}
		n.o.Start()
		return n, nil
	}
	nodes := make([]*tableNode, 3)
	defer func() {
		for _, n := range nodes {
			if n != nil {
				n.close()
			}
		}
	}()
	for i := range nodes {
		join := ""
		if i > 0 {
			join = nodes[0].c.Addr()
		}
		if nodes[i], err = start(i, join); err != nil {
			return err
		}
	}
	fmt.Fprintln(os.Stderr, "tablechange: three members, waiting for their first tables ...")
	if _, err := tableAgreed(nodes, 3, 10*time.Minute); err != nil {
		return err
	}
	idle := tableIdleCPU()

	fmt.Println()
	fmt.Printf("%d files, three members on loopback in one process (memberlist's LAN timings, as the daemon's):\n\n", files)
	fmt.Println("| change | seconds until every member agrees | CPU-s a member (process, less idle gossip) | moved samples |")
	fmt.Println("|---|---:|---:|---:|")
	// A graceful leave of n2, as the daemon closes: it tells the cluster
	// first (Leave), then closes the policy and the cluster.
	cpu0 := cpuSeconds()
	left := nodes[2]
	nodes[2] = nil
	go func() { left.c.Leave(); left.o.Close(); left.c.Close() }()
	secs, err := tableAgreed(nodes[:2], 2, 5*time.Minute)
	if err != nil {
		return err
	}
	cpu := (cpuSeconds() - cpu0 - idle*secs) / 2
	fmt.Printf("| n2 leaves gracefully | %.2f | %.2f | %d |\n", secs, cpu, nodes[0].o.Placement().MovedSamples)
	// n2 joins again: its first table costs it more (its catalog counts,
	// its job's reads); the others' is a change like the leave.
	cpu0, t0 := cpuSeconds(), time.Now()
	if nodes[2], err = start(2, nodes[0].c.Addr()); err != nil {
		return err
	}
	secs, err = tableAgreed(nodes, 3, 5*time.Minute)
	if err != nil {
		return err
	}
	cpu = (cpuSeconds() - cpu0 - idle*time.Since(t0).Seconds()) / 3
	fmt.Printf("| n2 joins again | %.2f | %.2f (the joiner's first table included) | %d |\n", secs, cpu, nodes[0].o.Placement().MovedSamples)
	return nil
}

// tableAgreed waits until every node's table places on want members and
// all show the same table, and returns the seconds it waited.
func tableAgreed(nodes []*tableNode, want int, limit time.Duration) (float64, error) {
	t0 := time.Now()
	for {
		agreed := true
		first := nodes[0].o.Placement()
		for _, n := range nodes {
			p := n.o.Placement()
			agreed = agreed && p.Members == want && p.Table == first.Table
		}
		if agreed {
			return time.Since(t0).Seconds(), nil
		}
		if time.Since(t0) > limit {
			return 0, fmt.Errorf("tablechange: the members did not agree on a table over %d members within %v", want, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// tableIdleCPU is the CPU-s a second the process spends with nothing
// changing (gossip, probes, the poll), measured over 3 s.
func tableIdleCPU() float64 {
	runtime.GC()
	cpu0, t0 := cpuSeconds(), time.Now()
	time.Sleep(3 * time.Second)
	return (cpuSeconds() - cpu0) / time.Since(t0).Seconds()
}

// tablePlacement measures placement alone over n samples: the demand of
// the suite's job over three members, Assign, a leave (Assign over two),
// and the moved samples counted from the two tables.
func tablePlacement(n int) error {
	fmt.Fprintf(os.Stderr, "tablechange: placement alone over %d samples ...\n", n)
	spec, err := tableJob(0)
	if err != nil {
		return err
	}
	// The keys are made once, as the policy makes each path once per
	// snapshot: the two tables share their bytes.
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("train/c%03d/%08d.jpg", i%1000, i)
	}
	demand := func(members int) []placement.Sample {
		ss := make([]placement.Sample, n)
		reads := make([]uint32, n*members)
		for i := range ss {
			ss[i] = placement.Sample{Key: keys[i], Size: 1024, Reads: reads[i*members : (i+1)*members : (i+1)*members]}
		}
		jobs.Reads(spec, n, 0, 4, func(rank, i int) {
			if rank < members {
				ss[i].Reads[rank]++
			}
		})
		return ss
	}
	table := func(members int) (*placement.Table, error) {
		ms := make([]placement.Member, members)
		for i := range ms {
			ms[i] = placement.Member{Name: fmt.Sprintf("n%d", i), Capacity: 1 << 40}
		}
		return placement.New(ms)
	}
	three, err := table(3)
	if err != nil {
		return err
	}
	two, err := table(2)
	if err != nil {
		return err
	}
	d3, d2 := demand(3), demand(2)
	buckets := make([]int64, placement.Buckets) // the policy counts these once per catalog snapshot
	for i := range d3 {
		buckets[placement.Bucket(d3[i].Key)]++
	}
	measure := func(what string, f func() int64) {
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		cpu0 := cpuSeconds()
		moved := f()
		cpu := cpuSeconds() - cpu0
		runtime.ReadMemStats(&m1)
		shown := ""
		if moved >= 0 {
			shown = fmt.Sprint(moved)
		}
		fmt.Printf("| %d | %s | %.2f | %.0f | %s |\n", n, what, cpu, float64(m1.TotalAlloc-m0.TotalAlloc)/(1<<20), shown)
	}
	var a3, a2 *placement.Table
	measure("Assign over 3 members", func() int64 { a3 = three.Assign(d3); return -1 })
	measure("Assign over the 2 left", func() int64 { a2 = two.Assign(d2); return -1 })
	measure("moved samples counted", func() int64 { return tableMoved(a3, a2, buckets) })
	if a3 == nil || a2 == nil {
		return errors.New("tablechange: no table")
	}
	return nil
}

// tableMoved counts the samples whose owner differs between a and b, as
// the read policy does: by bucket (of the files each holds), then the
// demand-assigned keys.
func tableMoved(a, b *placement.Table, buckets []int64) int64 {
	am, bm := a.Members(), b.Members()
	var moved int64
	for k, c := range buckets {
		if am[a.BucketOwner(k)].Name != bm[b.BucketOwner(k)].Name {
			moved += c
		}
	}
	placement.AssignedDiff(a, b, func(_ string, bucket, ao, bo int, _, _ bool) {
		if am[a.BucketOwner(bucket)].Name != bm[b.BucketOwner(bucket)].Name {
			moved--
		}
		if am[ao].Name != bm[bo].Name {
			moved++
		}
	})
	return moved
}
