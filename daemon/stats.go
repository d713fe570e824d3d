package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/dlfs/dlfs/accesslog"
	"github.com/dlfs/dlfs/allocator"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/daemon/owners"
	"github.com/dlfs/dlfs/daemon/readers"
	"github.com/dlfs/dlfs/jobs"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/perfmodel"
	"github.com/dlfs/dlfs/prefetch"
	"github.com/dlfs/dlfs/ramcache"
	"github.com/dlfs/dlfs/source"
	"github.com/dlfs/dlfs/ssdstore"
	"github.com/dlfs/dlfs/warmup"
)

// Stats is the document served as .dlfs/stats.
type Stats struct {
	Node          string                      `json:"node"`
	Source        string                      `json:"source"`
	Mountpoint    string                      `json:"mountpoint"`
	UptimeSeconds float64                     `json:"uptime_seconds"`
	Served        map[string]loader.Served    `json:"served"`
	Fetched       map[string]loader.Served    `json:"fetched"`
	Sources       map[string]perfmodel.Source `json:"sources"`
	Coalescing    CoalescingStats             `json:"coalescing"`
	Copies        CopyStats                   `json:"copies"`
	PFS           source.Stats                `json:"pfs"`
	// PFSStuck counts reads of SOURCE abandoned at --pfs-timeout that the
	// kernel has not answered yet.
	PFSStuck int64 `json:"pfs_stuck"`
	// ReadAhead counts the blocks fetched ahead of readers within files.
	ReadAhead loader.ReadAheadStats                `json:"read_ahead"`
	Cache     CacheStats                           `json:"cache"`
	Catalog   CatalogStats                         `json:"catalog"`
	Prefetch  prefetch.Totals                      `json:"prefetch"`
	Cluster   ClusterStats                         `json:"cluster"`
	Jobs      map[string]map[string]prefetch.Stats `json:"jobs"`
	// Streams are the processes reading the mount, with their workers
	// (package readers).
	Streams []readers.StreamStats `json:"streams"`
	// Warmup is the latest warm-up.
	Warmup warmup.Status `json:"warmup"`
	// Plans are the balance= plans by job and "epoch-E".
	Plans map[string]map[string]jobs.PlanStats `json:"plans,omitempty"`
	// Allocation is how the node's loader CPUs are shared between the
	// DataLoaders that report (package allocator).
	Allocation allocator.Stats `json:"allocation"`
	// Latency holds the latency histograms' summaries; absent when they
	// are off.
	Latency *LatencyStats `json:"latency,omitempty"`
	// AccessLog is .dlfs/accesslog's reader and what it was sent.
	AccessLog accesslog.Stats `json:"access_log"`
	// Passthrough says whether the mount serves resident files by FUSE
	// passthrough, why not, and its backing files (passthrough.go).
	Passthrough PassthroughStats `json:"passthrough"`
}

// CopyStats count the bytes dlfs copies in its own memory, outside the
// system calls that bring bytes in and hand them to the kernel: reads
// assembled from several blocks, and small blocks packed into the RAM
// tier's chunks. Every other read is answered from the block it lies in.
type CopyStats struct {
	ReadBytes int64 `json:"read_bytes"`
	RAMBytes  int64 `json:"ram_bytes"`
}

// CoalescingStats tell how packed samples were read from the PFS.
type CoalescingStats struct {
	// Reads counts PFS reads that brought several neighbouring samples,
	// and Samples the samples they brought.
	Reads   int64 `json:"coalesced_reads"`
	Samples int64 `json:"coalesced_samples"`
	// CallsPerSample is PFS read calls per sample fetched from the PFS:
	// 1 without coalescing (for samples of one block), less with it.
	CallsPerSample float64 `json:"pfs_calls_per_sample"`
}

// ClusterStats is the gossip view: this node alone when it runs no gossip.
type ClusterStats struct {
	Gossip  string        `json:"gossip,omitempty"` // this node's gossip address
	Members []MemberStats `json:"members"`
	// ServedToPeers counts blocks this node sent to peers that read a
	// sample it owns.
	ServedToPeers int64 `json:"served_to_peers"`
	// PeerRequests counts requests sent to peers; blocks fetched from
	// peers (served.peer.reads) divided by it is the batching factor.
	PeerRequests int64 `json:"peer_requests"`
	// Placement tells how far placement follows the jobs' plans.
	Placement PlacementStats `json:"placement"`
}

// PlacementStats tells how placement follows the jobs' plans.
type PlacementStats = owners.PlacementStats

// MemberStats is one member and the share of the dataset placement gives
// it (alive members only).
type MemberStats struct {
	cluster.Member
	OwnedSamples int64 `json:"owned_samples"`
	OwnedBytes   int64 `json:"owned_bytes"`
	// Data is how this node's last dial to the member's data address
	// went; absent before the first.
	Data *DataReach `json:"data,omitempty"`
}

// DataReach is whether a member's data address answers this node.
type DataReach struct {
	Reachable bool    `json:"reachable"`
	Error     string  `json:"error,omitempty"`
	AgeSec    float64 `json:"checked_seconds_ago"`
}

// CacheStats describes both tiers.
type CacheStats struct {
	RAM ramcache.Stats `json:"ram"`
	SSD ssdstore.Stats `json:"ssd"`
}

// CatalogStats describes the current snapshot of SOURCE.
type CatalogStats struct {
	Files       int     `json:"files"`
	Dirs        int     `json:"dirs"`
	Bytes       int64   `json:"bytes"`
	Skipped     int     `json:"skipped"`
	ScanSeconds float64 `json:"scan_seconds"`
	// UnreadableEntries counts the directories and entries the last scan
	// could not read (each kept what the scan before had), Unreadable names the
	// first of them, and Refresh says how the last rescan went.
	UnreadableEntries int           `json:"unreadable_entries"`
	Unreadable        []string      `json:"unreadable,omitempty"`
	Refresh           refreshStatus `json:"refresh"`
}

// Stats returns the node's current figures. Safe for concurrent use.
func (n *Node) Stats() Stats {
	snap := n.cat.Snapshot()
	ls := n.tiers.load.Stats()
	s := Stats{
		Node:          n.cfg.NodeName,
		Source:        n.cat.Source(),
		Mountpoint:    n.cfg.Mountpoint,
		UptimeSeconds: time.Since(n.started).Seconds(),
		Served:        ls.Served,
		Fetched:       ls.Fetched,
		Coalescing:    CoalescingStats{Reads: ls.Runs, Samples: ls.RunSamples},
		Sources:       ls.Sources,
		PFS:           n.src.Stats(),
		Cache:         CacheStats{RAM: n.tiers.ram.Stats()},
		PFSStuck:      ls.PFSStuck,
		ReadAhead:     ls.ReadAhead,
		Catalog: CatalogStats{Files: snap.Files, Dirs: snap.Dirs, Bytes: snap.Bytes, Skipped: snap.Skipped,
			ScanSeconds: snap.ScanTime.Seconds(), UnreadableEntries: snap.UnreadableEntries, Unreadable: snap.Unreadable,
			Refresh: n.rescans.control.status()},
	}
	s.Copies = CopyStats{ReadBytes: ls.CopiedBytes, RAMBytes: s.Cache.RAM.CopiedBytes}
	if n.tiers.ssd != nil {
		s.Cache.SSD = n.tiers.ssd.Stats()
	}
	if f := ls.Fetched["pfs"].Reads; f > 0 {
		s.Coalescing.CallsPerSample = float64(s.PFS.ReadOps) / float64(f)
	}
	if n.cluster.gossip != nil {
		s.Cluster.Gossip, s.Cluster.ServedToPeers = n.cluster.gossip.Addr(), n.cluster.served.Load()
		s.Cluster.PeerRequests = n.cluster.owners.Requests()
		s.Cluster.Placement = n.cluster.owners.Placement()
		for _, m := range n.cluster.gossip.Members() {
			ms := MemberStats{Member: m}
			if m.State == cluster.StateAlive {
				ms.OwnedSamples, ms.OwnedBytes = n.cluster.owners.Owned(m.Name)
			}
			if r, ok := n.cluster.owners.Reachability(m.Meta.DataAddr); ok && m.Name != n.cfg.NodeName {
				ms.Data = &DataReach{Reachable: r.OK, Error: r.Err, AgeSec: time.Since(r.At).Seconds()}
			}
			s.Cluster.Members = append(s.Cluster.Members, ms)
		}
	} else {
		s.Cluster.Members = []MemberStats{{Member: cluster.Member{Name: n.cfg.NodeName, State: cluster.StateAlive,
			Meta: cluster.Meta{Dataset: n.dataset.String(), RAM: n.cfg.RAMCache, SSD: s.Cache.SSD.Capacity}},
			OwnedSamples: int64(snap.Files), OwnedBytes: snap.Bytes}}
		s.Cluster.Placement = PlacementStats{Mode: "demand"}
		if n.cfg.HashPlacement {
			s.Cluster.Placement.Mode = "hash"
		}
	}
	s.Prefetch, s.Jobs = n.pf.Stats()
	s.Streams = n.readers.Streams()
	s.Warmup = n.warmer.Status()
	s.Allocation = n.alloc.Stats()
	s.Latency = n.lat.stats()
	s.AccessLog = n.alog.Stats()
	s.Passthrough = n.passthroughStats(s.Cache.RAM)
	for _, j := range n.jobs.All() {
		if ps := j.PlanStats(); len(ps) > 0 {
			if s.Plans == nil {
				s.Plans = map[string]map[string]jobs.PlanStats{}
			}
			s.Plans[j.Spec.Name] = map[string]jobs.PlanStats{}
			for e, p := range ps {
				s.Plans[j.Spec.Name][fmt.Sprintf("epoch-%d", e)] = p
			}
		}
	}
	return s
}

func (n *Node) statsJSON() ([]byte, error) {
	b, err := json.MarshalIndent(n.Stats(), "", "  ")
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	return append(b, '\n'), nil
}

// statsProm renders the registry as served on /metrics.
func (n *Node) statsProm() ([]byte, error) {
	mfs, err := n.reg.Gather()
	if err != nil {
		return nil, fmt.Errorf("stats.prom: %w", err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return nil, fmt.Errorf("stats.prom: %w", err)
		}
	}
	return buf.Bytes(), nil
}

// collector exports Stats to Prometheus, so that /metrics, stats.prom and
// stats show the same figures. A job's label is dlfs_job: Prometheus
// keeps job (and instance) for the scrape target, and would rename ours
// exported_job.
type collector struct{ n *Node }

var (
	descServedReads = prometheus.NewDesc("dlfs_served_reads_total", "Reads served, by the tier that supplied the bytes.", []string{"tier"}, nil)
	descServedBytes = prometheus.NewDesc("dlfs_served_bytes_total", "Bytes served, by the tier that supplied them.", []string{"tier"}, nil)
	descPFSOpens    = prometheus.NewDesc("dlfs_pfs_opens_total", "Files opened on SOURCE.", nil, nil)
	descPFSReads    = prometheus.NewDesc("dlfs_pfs_read_ops_total", "Read calls made on SOURCE.", nil, nil)
	descPFSBytes    = prometheus.NewDesc("dlfs_pfs_read_bytes_total", "Bytes read from SOURCE.", nil, nil)
	descEntries     = prometheus.NewDesc("dlfs_cache_entries", "Blocks held by a cache tier.", []string{"tier"}, nil)
	descBytes       = prometheus.NewDesc("dlfs_cache_bytes", "Bytes held by a cache tier.", []string{"tier"}, nil)
	descCapacity    = prometheus.NewDesc("dlfs_cache_capacity_bytes", "Capacity of a cache tier.", []string{"tier"}, nil)
	descFiles       = prometheus.NewDesc("dlfs_catalog_files", "Regular files in the catalog.", nil, nil)
	descFileBytes   = prometheus.NewDesc("dlfs_catalog_bytes", "Bytes of the regular files in the catalog.", nil, nil)
	descUptime      = prometheus.NewDesc("dlfs_uptime_seconds", "Seconds since the node started.", nil, nil)
	descPFFetched   = prometheus.NewDesc("dlfs_prefetch_fetched_bytes_total", "Bytes fetched ahead of reads.", nil, nil)
	descPFWasted    = prometheus.NewDesc("dlfs_prefetch_wasted_bytes_total", "Prefetched bytes dropped unread.", nil, nil)
	descPFStaged    = prometheus.NewDesc("dlfs_prefetch_staged_bytes", "Prefetched bytes waiting for their read.", nil, nil)
	descPFPushed    = prometheus.NewDesc("dlfs_prefetch_pushed_bytes_total", "Bytes pushed into the kernel's page cache ahead of their reads.", nil, nil)
	descPFPushFail  = prometheus.NewDesc("dlfs_prefetch_push_failures_total", "Pushes into the page cache that failed.", nil, nil)
	descSSDDropped  = prometheus.NewDesc("dlfs_ssd_dropped_writes_total", "Blocks the SSD tier did not cache because its write queue was full.", nil, nil)
	descSSDCorrupt  = prometheus.NewDesc("dlfs_ssd_corrupt_entries_total", "SSD tier entries that failed their header or checksum check, and were dropped.", nil, nil)
	descJobReads    = prometheus.NewDesc("dlfs_job_reads_total", "Planned reads by outcome: hit (no PFS wait), late (waited), miss.", []string{jobLabel, "rank", "outcome"}, nil)
	descJobStall    = prometheus.NewDesc("dlfs_job_stall_seconds_total", "Seconds reads of a rank waited on the PFS, over the job's life.", []string{jobLabel, "rank"}, nil)
	descMembers     = prometheus.NewDesc("dlfs_cluster_members", "Members in this node's view, by state.", []string{"state"}, nil)
	descOwned       = prometheus.NewDesc("dlfs_cluster_owned_bytes", "Bytes of the dataset placement gives a member.", []string{"member"}, nil)
	descReachable   = prometheus.NewDesc("dlfs_cluster_data_reachable", "1 if this node's last dial to a member's data address succeeded, 0 if it failed.", []string{"member"}, nil)
	descPeerServed  = prometheus.NewDesc("dlfs_cluster_served_to_peers_total", "Blocks sent to peers.", nil, nil)
	descPeerReqs    = prometheus.NewDesc("dlfs_cluster_peer_requests_total", "Requests sent to peers.", nil, nil)
	descLocalReads  = prometheus.NewDesc("dlfs_placement_local_reads_ratio", "Share of the jobs' planned reads that find the sample on the reader's node.", nil, nil)
	descPlanReads   = prometheus.NewDesc("dlfs_plan_reads", "Reads a balance= plan gives all ranks in an epoch, by where the sample is cached.", []string{jobLabel, "epoch", "where"}, nil)
	descPlanMoved   = prometheus.NewDesc("dlfs_plan_moved_samples", "Samples a balance= plan moved off their node to even the batches (Algorithm 1).", []string{jobLabel, "epoch"}, nil)
	descPlanImb     = prometheus.NewDesc("dlfs_plan_imbalance_ratio", "Imbalance of a balance= plan's global batches (sum of deficits over batch size), by quantile.", []string{jobLabel, "epoch", "quantile"}, nil)
	descPlanBatch   = prometheus.NewDesc("dlfs_plan_batch_size", "Smallest and largest batch of any rank in a balance= plan.", []string{jobLabel, "epoch", "bound"}, nil)
	descLoadWorkers = prometheus.NewDesc("dlfs_loader_workers", "DataLoader workers of a reporting rank: advised, and those it ran with at its last report.", []string{jobLabel, "rank", "kind"}, nil)
	descLoadRate    = prometheus.NewDesc("dlfs_loader_samples_per_second", "A reporting rank's samples per second: measured, predicted for the workers it ran with, and predicted for the advice.", []string{jobLabel, "rank", "kind"}, nil)
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descServedReads, descServedBytes, descPFSOpens, descPFSReads, descPFSBytes,
		descEntries, descBytes, descCapacity, descFiles, descFileBytes, descUptime, descPFFetched, descPFWasted,
		descPFStaged, descPFPushed, descPFPushFail, descSSDDropped, descSSDCorrupt, descJobReads, descJobStall, descMembers, descOwned, descReachable, descPeerServed, descPeerReqs, descLocalReads,
		descPlanReads, descPlanMoved, descPlanImb, descPlanBatch, descLoadWorkers, descLoadRate} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.n.Stats()
	for tier, v := range s.Served {
		ch <- prometheus.MustNewConstMetric(descServedReads, prometheus.CounterValue, float64(v.Reads), tier)
		ch <- prometheus.MustNewConstMetric(descServedBytes, prometheus.CounterValue, float64(v.Bytes), tier)
	}
	ch <- prometheus.MustNewConstMetric(descPFSOpens, prometheus.CounterValue, float64(s.PFS.Opens))
	ch <- prometheus.MustNewConstMetric(descPFSReads, prometheus.CounterValue, float64(s.PFS.ReadOps))
	ch <- prometheus.MustNewConstMetric(descPFSBytes, prometheus.CounterValue, float64(s.PFS.Bytes))
	for tier, v := range map[string][3]int64{
		"ram": {s.Cache.RAM.Entries, s.Cache.RAM.Bytes, s.Cache.RAM.Capacity},
		"ssd": {s.Cache.SSD.Entries, s.Cache.SSD.Bytes, s.Cache.SSD.Capacity},
	} {
		ch <- prometheus.MustNewConstMetric(descEntries, prometheus.GaugeValue, float64(v[0]), tier)
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(v[1]), tier)
		ch <- prometheus.MustNewConstMetric(descCapacity, prometheus.GaugeValue, float64(v[2]), tier)
	}
	ch <- prometheus.MustNewConstMetric(descSSDDropped, prometheus.CounterValue, float64(s.Cache.SSD.Dropped))
	ch <- prometheus.MustNewConstMetric(descSSDCorrupt, prometheus.CounterValue, float64(s.Cache.SSD.Corrupt))
	ch <- prometheus.MustNewConstMetric(descFiles, prometheus.GaugeValue, float64(s.Catalog.Files))
	ch <- prometheus.MustNewConstMetric(descFileBytes, prometheus.GaugeValue, float64(s.Catalog.Bytes))
	ch <- prometheus.MustNewConstMetric(descUptime, prometheus.GaugeValue, s.UptimeSeconds)
	ch <- prometheus.MustNewConstMetric(descPFFetched, prometheus.CounterValue, float64(s.Prefetch.FetchedBytes))
	ch <- prometheus.MustNewConstMetric(descPFWasted, prometheus.CounterValue, float64(s.Prefetch.WastedBytes))
	ch <- prometheus.MustNewConstMetric(descPFStaged, prometheus.GaugeValue, float64(s.Prefetch.StagedBytes))
	ch <- prometheus.MustNewConstMetric(descPFPushed, prometheus.CounterValue, float64(s.Prefetch.PushedBytes))
	ch <- prometheus.MustNewConstMetric(descPFPushFail, prometheus.CounterValue, float64(s.Prefetch.PushFailed))
	states := map[string]int{}
	for _, m := range s.Cluster.Members {
		states[m.State]++
		if m.State == cluster.StateAlive {
			ch <- prometheus.MustNewConstMetric(descOwned, prometheus.GaugeValue, float64(m.OwnedBytes), m.Name)
		}
		if m.Data != nil {
			up := 0.0
			if m.Data.Reachable {
				up = 1
			}
			ch <- prometheus.MustNewConstMetric(descReachable, prometheus.GaugeValue, up, m.Name)
		}
	}
	for state, count := range states {
		ch <- prometheus.MustNewConstMetric(descMembers, prometheus.GaugeValue, float64(count), state)
	}
	ch <- prometheus.MustNewConstMetric(descPeerServed, prometheus.CounterValue, float64(s.Cluster.ServedToPeers))
	ch <- prometheus.MustNewConstMetric(descPeerReqs, prometheus.CounterValue, float64(s.Cluster.PeerRequests))
	ch <- prometheus.MustNewConstMetric(descLocalReads, prometheus.GaugeValue, s.Cluster.Placement.LocalReads)
	for job, ranks := range s.Jobs {
		for rank, st := range ranks {
			ch <- prometheus.MustNewConstMetric(descJobReads, prometheus.CounterValue, float64(st.Hits), job, rank, "hit")
			ch <- prometheus.MustNewConstMetric(descJobReads, prometheus.CounterValue, float64(st.Late), job, rank, "late")
			ch <- prometheus.MustNewConstMetric(descJobReads, prometheus.CounterValue, float64(st.Misses), job, rank, "miss")
			ch <- prometheus.MustNewConstMetric(descJobStall, prometheus.CounterValue, st.StallSeconds, job, rank)
		}
	}
	for job, epochs := range s.Plans {
		for name, p := range epochs {
			e := strings.TrimPrefix(name, "epoch-")
			ch <- prometheus.MustNewConstMetric(descPlanReads, prometheus.GaugeValue, float64(p.Local), job, e, "local")
			ch <- prometheus.MustNewConstMetric(descPlanReads, prometheus.GaugeValue, float64(p.Reads-p.Local-p.PFS), job, e, "peer")
			ch <- prometheus.MustNewConstMetric(descPlanReads, prometheus.GaugeValue, float64(p.PFS), job, e, "pfs")
			ch <- prometheus.MustNewConstMetric(descPlanMoved, prometheus.GaugeValue, float64(p.Moved), job, e)
			ch <- prometheus.MustNewConstMetric(descPlanImb, prometheus.GaugeValue, p.ImbalanceMedian/100, job, e, "0.5")
			ch <- prometheus.MustNewConstMetric(descPlanImb, prometheus.GaugeValue, p.ImbalanceP90/100, job, e, "0.9")
			ch <- prometheus.MustNewConstMetric(descPlanBatch, prometheus.GaugeValue, float64(p.MinBatch), job, e, "min")
			ch <- prometheus.MustNewConstMetric(descPlanBatch, prometheus.GaugeValue, float64(p.MaxBatch), job, e, "max")
		}
	}
	for _, r := range s.Allocation.Ranks {
		rank := strconv.Itoa(r.Rank)
		ch <- prometheus.MustNewConstMetric(descLoadWorkers, prometheus.GaugeValue, float64(r.Advice.Workers), r.Job, rank, "advised")
		ch <- prometheus.MustNewConstMetric(descLoadWorkers, prometheus.GaugeValue, float64(r.Figures.Workers), r.Job, rank, "running")
		ch <- prometheus.MustNewConstMetric(descLoadRate, prometheus.GaugeValue, r.Model.Measured, r.Job, rank, "measured")
		ch <- prometheus.MustNewConstMetric(descLoadRate, prometheus.GaugeValue, r.Model.Predicted, r.Job, rank, "predicted")
		ch <- prometheus.MustNewConstMetric(descLoadRate, prometheus.GaugeValue, r.Advice.Predicted, r.Job, rank, "advised")
	}
}
