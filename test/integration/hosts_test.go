package integration

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/mountproc"
	"github.com/dlfs/dlfs/test/testbed"
	"github.com/dlfs/dlfs/test/verify"
)

// A cluster on the test bed: each host mounts SOURCE with a pfssim of its
// own, at a path of its own, and runs dlfs over that mount.
type bedCluster struct {
	t     *testing.T
	bed   *testbed.Bed
	src   string
	files []string
	sums  string // "path sha256" lines, the readers' reference
	key   string
	// other is a dataset with SOURCE's names, sizes and mtimes and other
	// bytes, for impostor hosts; otherSums its checksums.
	other, otherSums string
	nodes            []*bedNode
	byDNS            bool
	pfsFlags         []string
}

type bedNode struct {
	host *testbed.Host
	pfs  *mountproc.Proc
	dlfs *mountproc.Proc
	mnt  string // dlfs's mountpoint, as the host sees it
	// stats is the pfssim's counters file.
	stats string
	sums  string // its SOURCE's checksums
}

type bedOptions struct {
	hosts    int
	files    int
	perMount map[int]bool // hosts whose PFS client numbers inodes per mount
	// impostor hosts mount another dataset: SOURCE's names, sizes and
	// mtimes, other bytes.
	impostor map[int]bool
	dlfs     []string // extra flags for every dlfs
	// byDNS binds every node on all interfaces (0.0.0.0, no --advertise)
	// and joins the name "peers", which resolves to every host, as pods
	// of a DaemonSet find each other through a headless Service.
	byDNS bool
	// firewalled hosts drop what arrives for their data port (7947).
	firewalled map[int]bool
	// bandwidth caps hosts' links, in bits per second each way.
	bandwidth map[int]int64
	pfs       []string         // extra flags for every pfssim
	hostFlags map[int][]string // extra dlfs flags for one host, after dlfs
}

func newBedCluster(t *testing.T, o bedOptions) *bedCluster {
	t.Helper()
	dir := t.TempDir()
	bed, err := testbed.New(testbed.Config{Hosts: o.hosts, Dir: filepath.Join(dir, "hosts")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Close(); err != nil {
			t.Error(err)
		}
	})
	c := &bedCluster{t: t, bed: bed, src: filepath.Join(dir, "src"), key: filepath.Join(dir, "key")}
	c.files = dataset(t, c.src, o.files)
	c.sums = c.checksums(c.src, filepath.Join(dir, "sums"))
	if len(o.impostor) > 0 {
		c.other = filepath.Join(dir, "other")
		for _, f := range c.files {
			b, err := os.ReadFile(filepath.Join(c.src, f))
			if err != nil {
				t.Fatal(err)
			}
			fi, _ := os.Stat(filepath.Join(c.src, f))
			for i := range b {
				b[i] ^= 0x5a
			}
			p := filepath.Join(c.other, f)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
				t.Fatal(err)
			}
		}
		c.otherSums = c.checksums(c.other, filepath.Join(dir, "other-sums"))
	}
	if err := os.WriteFile(c.key, []byte(base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.byDNS, c.pfsFlags = o.byDNS, o.pfs
	if o.byDNS {
		if err := bed.Alias("peers", bed.Hosts()...); err != nil {
			t.Fatal(err)
		}
	}
	for i, h := range bed.Hosts() {
		src, sums := c.src, c.sums
		if o.impostor[i] {
			src, sums = c.other, c.otherSums
		}
		if b := o.bandwidth[i]; b > 0 {
			if err := h.SetBandwidth(b); err != nil {
				t.Fatal(err)
			}
		}
		if o.firewalled[i] {
			if err := h.DropPort(7947); err != nil {
				t.Fatal(err)
			}
		}
		c.nodes = append(c.nodes, c.start(h, src, sums, o.perMount[i], append(append([]string(nil), o.dlfs...), o.hostFlags[i]...)))
	}
	return c
}

// checksums writes the "path sha256" lines of dir's files to out.
func (c *bedCluster) checksums(dir, out string) string {
	if err := verify.WriteSums(dir, c.files, out); err != nil {
		c.t.Fatal(err)
	}
	return out
}

// start mounts the PFS of src on h (at /…/NAME/pfs-NAME) and dlfs over
// it; sums are src's checksums.
func (c *bedCluster) start(h *testbed.Host, src, sums string, perMount bool, flags []string) *bedNode {
	t := c.t
	t.Helper()
	n := &bedNode{host: h, mnt: filepath.Join(h.Dir, "mnt"), stats: filepath.Join(h.Dir, "pfs.json"), sums: sums}
	pfsMnt := filepath.Join(h.Dir, "pfs-"+h.Name)
	for _, d := range []string{n.mnt, pfsMnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	args := append([]string{"-stats", n.stats, "-open-latency", "1ms"}, c.pfsFlags...)
	if perMount {
		args = append(args, "-per-mount-inodes")
	}
	var err error
	n.pfs, err = mountproc.StartCmd(h.Command(bin.pfssim, append(args, src, pfsMnt)...), pfsMnt, h.MountInfo(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.pfs.Stop(30 * time.Second) })
	dl := []string{"mount", "--node-name", h.Name, "--bind", h.Addr + ":7946", "--data-addr", h.Addr + ":7947", "--join", "h00:7946"}
	if c.byDNS {
		dl = []string{"mount", "--node-name", h.Name, "--bind", "0.0.0.0:7946", "--data-addr", "0.0.0.0:7947", "--join", "peers:7946"}
	}
	// Each host has an SSD tier of its own, as the identity's kept heads do.
	dl = append(append(dl, "--cluster-key-file", c.key, "--ram-cache", "256MiB",
		"--ssd-cache", filepath.Join(h.Dir, "ssd"), "--ssd-cache-size", "256MiB"), flags...)
	n.dlfs, err = mountproc.StartCmd(h.Command(bin.dlfs, append(dl, pfsMnt, n.mnt)...), n.mnt, h.MountInfo(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.dlfs.Stop(30 * time.Second); err != nil {
			t.Error(err)
		}
	})
	return n
}

// stats reads a node's dlfs stats from outside its host.
func (n *bedNode) statsDoc(t *testing.T) map[string]any {
	return dlfsStats(t, n.host.Path(n.mnt))
}

// pfsBytes is the bytes all hosts' PFS clients have read.
func (c *bedCluster) pfsBytes() int64 {
	var total int64
	for _, n := range c.nodes {
		got, err := n.pfs.PFSCounters(n.stats, 10*time.Second)
		if err != nil {
			c.t.Fatal(err)
		}
		total += got.Bytes
	}
	return total
}

func (c *bedCluster) datasetBytes() int64 {
	var total int64
	for _, f := range c.files {
		fi, err := os.Stat(filepath.Join(c.src, f))
		if err != nil {
			c.t.Fatal(err)
		}
		total += fi.Size()
	}
	return total
}

// waitMembers waits until every node sees want alive members.
func (c *bedCluster) waitMembers(want int) {
	for _, n := range c.nodes {
		waitAlive(c.t, n.host.Path(n.mnt), want)
	}
}

// readEverywhere runs a reader on every node, inside its host, over the
// whole dataset in its own shuffled order, and fails the test on an error
// or a wrong byte.
func (c *bedCluster) readEverywhere(seed uint64) { c.readOn(c.nodes, seed) }

// readOn is readEverywhere on the nodes given.
func (c *bedCluster) readOn(nodes []*bedNode, seed uint64) {
	t := c.t
	t.Helper()
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := n.host.Command(os.Args[0], "-test.run", "^$")
			cmd.Env = append(os.Environ(), "DLFS_IT_READER="+n.mnt, "DLFS_IT_SUMS="+n.sums,
				"DLFS_IT_SEED="+strconv.FormatUint(seed+uint64(i), 10))
			out, err := cmd.Output()
			var r verify.Result
			if err == nil {
				err = json.Unmarshal(out, &r)
			}
			switch {
			case err != nil:
				t.Errorf("reader on %s: %v: %s", n.host.Name, err, out)
			case r.Errors > 0:
				t.Errorf("reader on %s: %d errors, first %s", n.host.Name, r.Errors, r.First)
			case r.Files != len(c.files):
				t.Errorf("reader on %s read %d of %d files", n.host.Name, r.Files, len(c.files))
			}
		}()
	}
	wg.Wait()
}

// readerMain is the test binary run as a reader on a host (TestMain):
// package verify's Read over DLFS_IT_SUMS under DLFS_IT_READER, with 4
// threads, its Result printed as JSON.
func readerMain() {
	seed, _ := strconv.ParseUint(os.Getenv("DLFS_IT_SEED"), 10, 64)
	r, err := verify.Read(os.Getenv("DLFS_IT_READER"), os.Getenv("DLFS_IT_SUMS"), seed, 4)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	json.NewEncoder(os.Stdout).Encode(r)
	os.Exit(0)
}

// TestHostsEachMountThePFS: three hosts, each with its own mount of the
// PFS at a path of its own (one numbering inodes per mount, as FUSE
// clients without use_ino do), form one cluster: they compute one dataset
// identity, share the dataset (PFS bytes at most 1.05x the dataset in the
// first epoch, 0.02x in the second) and serve every byte right.
func TestHostsEachMountThePFS(t *testing.T) {
	c := newBedCluster(t, bedOptions{hosts: 3, files: 300, perMount: map[int]bool{2: true}})
	c.waitMembers(3)
	ids := map[string]bool{}
	for _, n := range c.nodes {
		members, _ := n.statsDoc(t)["cluster"].(map[string]any)["members"].([]any)
		for _, m := range members {
			mm := m.(map[string]any)
			meta, _ := mm["meta"].(map[string]any)
			ids[fmt.Sprint(meta["dataset"])] = true
		}
	}
	if len(ids) != 1 {
		t.Fatalf("the hosts gossip %d dataset identities: %v", len(ids), ids)
	}
	c.twoEpochs()
	for _, n := range c.nodes {
		if num(n.statsDoc(t), "served", "peer", "reads") == 0 {
			t.Errorf("%s read nothing from its peers", n.host.Name)
		}
	}
}

// TestHostOfAnotherDataset: a host whose SOURCE has the same names, sizes
// and mtimes but other bytes computes another identity. The others log it
// once and give it no share; no byte crosses between them, and every
// reader on every host reads its own dataset's bytes.
func TestHostOfAnotherDataset(t *testing.T) {
	c := newBedCluster(t, bedOptions{hosts: 3, files: 120, impostor: map[int]bool{2: true}})
	c.waitMembers(3)
	c.readEverywhere(1)
	dropPageCache(t)
	c.readEverywhere(50)
	imp := c.nodes[2]
	st := imp.statsDoc(t)
	if got := num(st, "served", "peer", "reads") + num(st, "cluster", "served_to_peers"); got != 0 {
		t.Errorf("the host of another dataset exchanged %v reads with the others", got)
	}
	for _, n := range c.nodes[:2] {
		if got := num(n.statsDoc(t), "served", "peer", "reads"); got == 0 {
			t.Errorf("%s read nothing from its peer of the same dataset", n.host.Name)
		}
		if got := strings.Count(n.dlfs.Stderr.String(), "serve another dataset"); got != 1 {
			t.Errorf("%s logged the member of another dataset %d times, want once:\n%s", n.host.Name, got, n.dlfs.Stderr)
		}
	}
}

// TestHostsFindEachOtherByDNS: nodes bound on every interface, with no
// --advertise, joining one DNS name that resolves to all of them (a
// DaemonSet's headless Service) form one cluster, whoever starts first,
// and advertise the hosts' own addresses. A host cut off mid-epoch reads
// on from the PFS with no error, the others read its share from the PFS,
// and once its link is back it rejoins.
func TestHostsFindEachOtherByDNS(t *testing.T) {
	c := newBedCluster(t, bedOptions{hosts: 3, files: 200, byDNS: true})
	c.waitMembers(3)
	for _, n := range c.nodes {
		members, _ := n.statsDoc(t)["cluster"].(map[string]any)["members"].([]any)
		for _, m := range members {
			mm := m.(map[string]any)
			addr, _ := mm["address"].(string)
			data, _ := mm["meta"].(map[string]any)["data"].(string)
			if !strings.HasPrefix(addr, "10.77.0.") || !strings.HasPrefix(data, "10.77.0.") {
				t.Errorf("%s sees %s at gossip %q, data %q: want the host's address", n.host.Name, mm["name"], addr, data)
			}
		}
	}
	c.readEverywhere(1)

	// Cut h02 off mid-epoch: every reader finishes, with no error.
	cut := c.nodes[2]
	dropPageCache(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.readEverywhere(20)
	}()
	if err := cut.host.LinkDown(); err != nil {
		t.Fatal(err)
	}
	<-done
	waitAliveWithin(t, c.nodes[0].host.Path(c.nodes[0].mnt), 2, 60*time.Second)
	dropPageCache(t)
	c.readEverywhere(30)
	if err := cut.host.LinkUp(); err != nil {
		t.Fatal(err)
	}
	// It rejoins: memberlist's gossip to the dead, or the periodic join.
	for _, n := range c.nodes {
		waitAliveWithin(t, n.host.Path(n.mnt), 3, 90*time.Second)
	}
	dropPageCache(t)
	c.readEverywhere(40)
}

// TestUnreachableDataAddress: a member whose data port a firewall drops
// (its gossip still answers) shows as unreachable in its peers' stats and
// in dlfs doctor run on their hosts; their readers read its share from
// the PFS with no error.
func TestUnreachableDataAddress(t *testing.T) {
	c := newBedCluster(t, bedOptions{hosts: 3, files: 100, firewalled: map[int]bool{2: true}})
	c.waitMembers(3)
	a := c.nodes[0]
	deadline := time.Now().Add(60 * time.Second)
	for {
		var reach map[string]any
		members, _ := a.statsDoc(t)["cluster"].(map[string]any)["members"].([]any)
		for _, m := range members {
			if mm := m.(map[string]any); mm["name"] == "h02" {
				reach, _ = mm["data"].(map[string]any)
			}
		}
		if reach != nil && reach["reachable"] == false {
			t.Logf("h00's stats on h02: %v", reach)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("h00's stats never showed h02's data address unreachable: %v", members)
		}
		time.Sleep(100 * time.Millisecond)
	}
	prom, err := os.ReadFile(a.host.Path(filepath.Join(a.mnt, ".dlfs/stats.prom")))
	if err != nil || !strings.Contains(string(prom), `dlfs_cluster_data_reachable{member="h02"} 0`) {
		t.Errorf("h00's metrics lack h02 unreachable (%v)", err)
	}
	out, err := a.host.Command(bin.dlfs, "doctor", filepath.Join(a.host.Dir, "pfs-h00"), a.mnt).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "FAIL  member h02: its data address 10.77.0.12:7947 does not answer") {
		t.Errorf("dlfs doctor on h00: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "member h01") {
		t.Errorf("doctor reports the reachable h01:\n%s", out)
	}
	c.readEverywhere(1)
}

// twoEpochs reads the dataset everywhere twice, the page caches dropped
// between, and checks the PFS read it at most 1.05x in the first epoch
// and 0.02x in the second.
func (c *bedCluster) twoEpochs() {
	t := c.t
	t.Helper()
	total := c.datasetBytes()
	c.readEverywhere(1)
	epoch0 := c.pfsBytes()
	dropPageCache(t)
	c.readEverywhere(100)
	epoch1 := c.pfsBytes() - epoch0
	t.Logf("PFS bytes: epoch 0 %.3fx the dataset, epoch 1 %.3fx", float64(epoch0)/float64(total), float64(epoch1)/float64(total))
	if epoch0 > total+total/20 || epoch1 > total/50 {
		t.Errorf("PFS read %.3fx then %.3fx the dataset, want at most 1.05x then 0.02x", float64(epoch0)/float64(total), float64(epoch1)/float64(total))
	}
}

// placementView is what one node's stats say of placement.
type placementView struct {
	table   string
	members int
	owned   map[string]int64 // samples by member
	moved   int64            // samples that changed owner, over the node's life
}

func (n *bedNode) placement(t *testing.T) placementView {
	st := n.statsDoc(t)
	cl, _ := st["cluster"].(map[string]any)
	pl, _ := cl["placement"].(map[string]any)
	v := placementView{owned: map[string]int64{}}
	v.table, _ = pl["table"].(string)
	v.members = int(num(pl, "members"))
	v.moved = int64(num(pl, "moved_total"))
	members, _ := cl["members"].([]any)
	for _, m := range members {
		mm := m.(map[string]any)
		if mm["state"] == "alive" {
			v.owned[mm["name"].(string)] = int64(num(mm, "owned_samples"))
		}
	}
	return v
}

// agree waits until every node places on want members with one table,
// and returns that view and how long it took.
func (c *bedCluster) agree(want int, within time.Duration) (placementView, time.Duration) {
	t := c.t
	t.Helper()
	start := time.Now()
	for {
		views := make([]placementView, len(c.nodes))
		same := true
		for i, n := range c.nodes {
			views[i] = n.placement(t)
			same = same && views[i].members == want && views[i].table != "" && views[i].table == views[0].table
		}
		if same {
			return views[0], time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("the nodes did not agree on a table of %d members within %v: %+v", want, within, views)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSixteenHosts: 16 test-bed hosts with small RAM tiers converge on
// one placement table, whose shares are disjoint and cover the dataset;
// the dataset is read from the PFS about once in the first epoch and
// hardly at all in the second, every byte checked on every host. A host
// killed mid-epoch and one added leave every reader without an error,
// and placement moves about 2/N of the samples.
func TestSixteenHosts(t *testing.T) {
	const hosts = 16
	c := newBedCluster(t, bedOptions{hosts: hosts, files: 480, dlfs: []string{"--ram-cache", "32MiB"}})
	v, took := c.agree(hosts, 2*time.Minute)
	t.Logf("16 hosts agree on table %s %v after the last started", v.table, took)
	var sum int64
	for _, k := range v.owned {
		sum += k
	}
	if len(v.owned) != hosts || sum != int64(len(c.files)) {
		t.Fatalf("shares %v: %d members owning %d samples, want %d owning %d", v.owned, len(v.owned), sum, hosts, len(c.files))
	}
	c.twoEpochs()

	// Churn: kill h05 while the others read, and add h16.
	victim := c.nodes[5]
	var rest []*bedNode
	for _, n := range c.nodes {
		if n != victim {
			rest = append(rest, n)
		}
	}
	dropPageCache(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.readOn(rest, 200)
	}()
	begin := time.Now()
	if err := victim.host.Stop(); err != nil {
		t.Fatal(err)
	}
	h, err := c.bed.AddHost()
	if err != nil {
		t.Fatal(err)
	}
	c.nodes = append(rest, c.start(h, c.src, c.sums, false, []string{"--ram-cache", "32MiB"}))
	after, _ := c.agree(hosts, 2*time.Minute)
	converged := time.Since(begin)
	<-done
	moved := after.moved - v.moved // as h00 counts them, over every table it went through
	t.Logf("churn: converged %v after the kill; %d of %d samples changed owner (%.3f; 2/N = %.3f)",
		converged, moved, len(c.files), float64(moved)/float64(len(c.files)), 2.0/hosts)
	if float64(moved) > 3.0/hosts*float64(len(c.files)) {
		t.Errorf("churn moved %d of %d samples, want about 2/N", moved, len(c.files))
	}
	c.readEverywhere(300)
}

// TestSlowLink: one host's link at a tenth of the others'. The other
// hosts' performance model ranks it below their PFS, so with --pfs-margin
// their readers stop waiting on it and read its share from the PFS; peer
// latency by member shows why.
func TestSlowLink(t *testing.T) {
	const fast, slow = 200_000_000, 20_000_000 // bits per second
	c := newBedCluster(t, bedOptions{hosts: 3, files: 200,
		bandwidth: map[int]int64{0: fast, 1: fast, 2: slow},
		pfs:       []string{"-bandwidth-mbps", "10"},
		dlfs:      []string{"--pfs-margin", "2"},
		// The reader's RAM holds little and it has no SSD tier, so each
		// epoch asks the owners (or the PFS) again.
		hostFlags: map[int][]string{0: {"--ram-cache", "2MiB", "--ssd-cache="}}})
	c.waitMembers(3)
	a := c.nodes[0]
	// Two epochs on h00 alone: the first teaches its model the sources.
	for epoch := range 2 {
		dropPageCache(t)
		c.readOn(c.nodes[:1], uint64(epoch))
	}
	st := a.statsDoc(t)
	srcs, _ := st["sources"].(map[string]any)
	est := func(src string) float64 { // ms for 110 KB; a bandwidth of 0 means no cost per byte was measurable
		m, _ := srcs[src].(map[string]any)
		ms := num(m, "latency_ms")
		if bw := num(m, "bandwidth_mbps"); bw > 0 {
			ms += 110_000 / (bw * 1e3)
		}
		return ms
	}
	lat := func(member string) float64 { return num(st, "latency", "peer", member, "mean_seconds") }
	t.Logf("h00's model for a 110 KB sample: peer:h01 %.1f ms, peer:h02 %.1f ms, pfs %.1f ms; peer latency by member: h01 %.1f ms, h02 %.1f ms",
		est("peer:h01"), est("peer:h02"), est("pfs"), 1e3*lat("h01"), 1e3*lat("h02"))
	if !(lat("h02") > 1.5*lat("h01")) || !(est("peer:h02") > est("pfs")) {
		t.Errorf("peer latency h02 %.4f s, h01 %.4f s; model h02 %.1f ms, pfs %.1f ms: want the slow link shown slower, and ranked below the PFS",
			lat("h02"), lat("h01"), est("peer:h02"), est("pfs"))
	}
	// A third epoch: h02's share comes from the PFS, not from h02.
	before := num(srcs["peer:h02"].(map[string]any), "reads")
	pfsBefore := num(srcs["pfs"].(map[string]any), "reads")
	dropPageCache(t)
	c.readOn(c.nodes[:1], 2)
	st = a.statsDoc(t)
	srcs, _ = st["sources"].(map[string]any)
	fromSlow := num(srcs["peer:h02"].(map[string]any), "reads") - before
	fromPFS := num(srcs["pfs"].(map[string]any), "reads") - pfsBefore
	share := float64(a.placement(t).owned["h02"])
	t.Logf("epoch 3 on h00: %v reads from h02 (which owns %v samples), %v from the PFS", fromSlow, share, fromPFS)
	if fromSlow > share/4 || fromPFS < share/2 {
		t.Errorf("epoch 3: %v of h02's %v samples still read from it, %v from the PFS: the model still prefers the slow link", fromSlow, share, fromPFS)
	}
}

// TestRewriteAcrossHosts: issue 10's guarantee holds between hosts. Files
// rewritten in place on the PFS with the same size and their mtime put
// back are never served as the old bytes by a host after that host's
// refresh, whichever host owns them and whether or not the owner has
// refreshed (its copies are of the old ctime, so their tags differ).
func TestRewriteAcrossHosts(t *testing.T) {
	c := newBedCluster(t, bedOptions{hosts: 2, files: 60})
	c.waitMembers(2)
	c.readEverywhere(1) // every file cached on its owner
	rewritten := c.files[:20]
	for _, f := range rewritten {
		p := filepath.Join(c.src, f)
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(p)
		for i := range b {
			b[i] = ^b[i]
		}
		if err := os.WriteFile(p, b, 0o644); err != nil { // in place: O_TRUNC, same inode
			t.Fatal(err)
		}
		if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
			t.Fatal(err)
		}
	}
	c.sums = c.checksums(c.src, filepath.Join(t.TempDir(), "sums"))
	for _, n := range c.nodes {
		n.sums = c.sums
	}
	a := c.nodes[0]
	dropPageCache(t)
	if err := control(a.host.Path(a.mnt), "refresh"); err != nil {
		t.Fatal(err)
	}
	// h00 refreshed, h01 not: h00 reads the new bytes of all 20, h01's
	// among them too.
	for _, f := range rewritten {
		got, err := os.ReadFile(a.host.Path(filepath.Join(a.mnt, f)))
		want, _ := os.ReadFile(filepath.Join(c.src, f))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("h00 after its refresh: %s: %d bytes, %v; want the new version", f, len(got), err)
		}
	}
	if err := control(c.nodes[1].host.Path(c.nodes[1].mnt), "refresh"); err != nil {
		t.Fatal(err)
	}
	dropPageCache(t)
	c.readEverywhere(2)
}

// TestAddressesThatCannotWork: an --advertise or --data-addr the other
// hosts could not reach stops the mount with one line saying what to set.
func TestAddressesThatCannotWork(t *testing.T) {
	src := t.TempDir()
	dataset(t, src, 3)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--bind", "0.0.0.0:0", "--advertise", "0.0.0.0:7946"}, "--advertise"},
		{[]string{"--bind", "127.0.0.1:0", "--join", "10.77.0.10:7946"}, "--advertise (or --bind)"},
		{[]string{"--bind", "0.0.0.0:0", "--advertise", "10.1.2.3:7946", "--data-addr", "127.0.0.1:7999"}, "--data-addr 10.1.2.3:7999 or 0.0.0.0:7999"},
	} {
		mnt := t.TempDir()
		args := append(append([]string{"mount", "--insecure"}, c.args...), src, mnt)
		code, _, stderr := runCmd(t, bin.dlfs, args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		if code == 0 || !strings.Contains(last, c.want) || !strings.HasPrefix(last, "dlfs: ") {
			t.Errorf("dlfs %v: exit %d, stderr %q; want a last line naming %s", c.args, code, stderr, c.want)
		}
		if isMounted(mnt) {
			t.Errorf("dlfs %v left a mount", c.args)
		}
	}
}
