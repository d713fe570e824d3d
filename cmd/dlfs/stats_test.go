package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/daemon"
	"github.com/dlfs/dlfs/latency"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/prefetch"
	"github.com/dlfs/dlfs/source"
)

// TestRenderStats: the table shows each tier's reads, share and latency,
// the PFS, each job's ranks and the members; with an earlier document,
// the rates between the two.
func TestRenderStats(t *testing.T) {
	st := daemon.Stats{Node: "n1", Source: "/data", UptimeSeconds: 3723,
		Served: map[string]loader.Served{"ram": {Reads: 3000, Bytes: 3 << 30}, "pfs": {Reads: 1000, Bytes: 1 << 30}},
		PFS:    source.Stats{Opens: 1000, ReadOps: 1200, Bytes: 1 << 30},
		Jobs: map[string]map[string]prefetch.Stats{"train": {"rank-0": {Epoch: 2, Consumed: 1500, Predicted: 4000, Hits: 1400, StallSeconds: 1.25, LeadSeconds: 3.5, Rate: 812}},
			"old": {"rank-0": {Epoch: 1, Consumed: 4000, Predicted: 4000, Hits: 8000, Ended: true, EndedSeconds: 95}}},
		Latency: &daemon.LatencyStats{Read: map[string]latency.Summary{"ram": {Count: 3000, P50: 40e-6, P99: 0.0021}}},
	}
	st.Catalog.Files, st.Catalog.Bytes = 4000, 4<<30
	st.Passthrough.Why = "the daemon lacks CAP_SYS_ADMIN"
	st.Cluster.Members = []daemon.MemberStats{{Member: cluster.Member{Name: "n1", State: "alive"}, OwnedSamples: 4000, OwnedBytes: 4 << 30},
		{Member: cluster.Member{Name: "n2", State: "alive"}, Data: &daemon.DataReach{Reachable: false, Error: "i/o timeout"}},
		{Member: cluster.Member{Name: "n3", State: "alive"}, Data: &daemon.DataReach{Reachable: true}}}
	var b strings.Builder
	if err := renderStats(&b, "/mnt/data", st, nil, 0); err != nil {
		t.Fatal(err)
	}
	out := squash(b.String())
	for _, want := range []string{"dlfs /mnt/data (SOURCE /data) node n1 up 1h2m3s", "ram 3,000 3.0 GiB 75.0% - - 40µs 2.1ms",
		"pfs 1,000 1.0 GiB 25.0% - - - -", "PFS 1,000 opens, 1,200 read calls, 1.0 GiB read\n",
		"train rank-0 2 1,500 4,000 1,400 0 0 1.25 3.5 812 - live",
		"old rank-0 1 4,000 4,000 8,000 0 0 0.00 0.0 0 - ended 1m35s ago", "n1 alive 4,000 4.0 GiB 100.0% -", "n2 alive 0 0 B 0.0% UNREACHABLE", "n3 alive 0 0 B 0.0% answers",
		"kernel passthrough off: the daemon lacks CAP_SYS_ADMIN\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "opens/s") {
		t.Errorf("rates without an earlier document:\n%s", out)
	}

	prev := st
	prev.Served = map[string]loader.Served{"ram": {Reads: 1000, Bytes: 1 << 30}, "pfs": {Reads: 1000, Bytes: 1 << 30}}
	prev.PFS.Opens = 500
	st.Passthrough.On, st.Passthrough.Opens, st.Passthrough.Bytes = true, 300, 3<<30
	st.Passthrough.BackingFiles, st.Passthrough.BackingBytes, st.Passthrough.EvictedOpenBytes = 90, 900<<20, 20<<20
	b.Reset()
	if err := renderStats(&b, "/mnt/data", st, &prev, 2); err != nil {
		t.Fatal(err)
	}
	out = squash(b.String())
	for _, want := range []string{"ram 3,000 3.0 GiB 75.0% 1,000 1.0 GiB/s", "now 250 opens/s, 0 B/s",
		"kernel passthrough on: 300 opens of 3.0 GiB read by the kernel from 90 backing files (900.0 MiB; 20.0 MiB held by opens after eviction)"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestFormats(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{fmtCount(0), "0"}, {fmtCount(999), "999"}, {fmtCount(1234567), "1,234,567"}, {fmtCount(2.5), "2.5"}, {fmtCount(-1234), "-1,234"},
		{human(512), "512 B"}, {human(1536), "1.5 KiB"}, {human(5 << 40), "5.0 TiB"},
		{fmtSeconds(0, 0), "-"}, {fmtSeconds(45e-6, 1), "45µs"}, {fmtSeconds(0.0123, 1), "12.3ms"}, {fmtSeconds(2.5, 1), "2.50s"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

// squash collapses each line's runs of spaces into one.
func squash(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}

// fakeMount is a directory with a .dlfs/stats document, as a mount shows.
func fakeMount(t *testing.T, st daemon.Stats) string {
	t.Helper()
	mnt := t.TempDir()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(mnt, ".dlfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, ".dlfs", "stats"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return mnt
}

// TestStatsWatch: "stats --watch MOUNTPOINT" takes MOUNTPOINT as the
// mount and redraws every 2s by default; written to a file, the drawings
// carry no terminal codes. "--watch 5s" says to use --interval.
func TestStatsWatch(t *testing.T) {
	mnt := fakeMount(t, daemon.Stats{Node: "n1", Source: "/data"})
	var out strings.Builder
	root := newRootCmd()
	root.SetOut(&out)
	root.SetArgs([]string{"stats", "--watch", mnt})
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // one drawing, then stop
	if err := root.ExecuteContext(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "dlfs "+mnt) || strings.Contains(out.String(), "\x1b") {
		t.Errorf("watch drawing to a file:\n%q", out.String())
	}
	root = newRootCmd()
	root.SetOut(&out)
	root.SetArgs([]string{"stats", "--watch", "5s"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "--interval 5s") {
		t.Errorf("stats --watch 5s: %v", err)
	}

	var b strings.Builder
	if err := watchStats(ctx, &b, true, mnt, time.Second); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), "\x1b[H\x1b[2J") {
		t.Errorf("on a terminal the drawing does not start by clearing it: %q", b.String()[:20])
	}
}
