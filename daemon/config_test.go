package daemon

import (
	"reflect"
	"testing"
	"time"

	"github.com/dlfs/dlfs/allocator"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/daemon/owners"
	"github.com/dlfs/dlfs/fusefs"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/prefetch"
	"github.com/dlfs/dlfs/ssdstore"
)

// TestDerivedConfigs: each part's Config, derived from DefaultConfig's
// flat fields, is what the part got when Config nested the parts'
// Configs (the package's defaults, as Start changed them), and a field
// set reaches its part.
func TestDerivedConfigs(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(c *Config)
		got  func(c *Config) any
		want func() any
	}{
		{"ssd", func(c *Config) { c.SSDDir = "/ssd" },
			func(c *Config) any { return c.ssdConfig() },
			func() any { return ssdstore.DefaultConfig("/ssd") }},
		{"ssd capacity", func(c *Config) { c.SSDDir, c.SSDCapacity = "/ssd", 1<<30 },
			func(c *Config) any { return c.ssdConfig() },
			func() any { sc := ssdstore.DefaultConfig("/ssd"); sc.Capacity = 1 << 30; return sc }},

		// Read-ahead takes a quarter of the staging, the prefetcher the
		// rest; ReadAhead is at most read-ahead's quarter.
		{"loader", func(*Config) {},
			func(c *Config) any { return c.loaderConfig() },
			func() any { lc := loader.DefaultConfig(); lc.ReadAheadTotal = 64 << 20; return lc }},
		{"prefetch", func(*Config) {},
			func(c *Config) any { return c.prefetchConfig() },
			func() any { pc := defaultPrefetch(); pc.Staging = 192 << 20; return pc }},
		{"loader, read-ahead beyond its share", func(c *Config) { c.Staging, c.ReadAhead = 64<<20, 32<<20 },
			func(c *Config) any { return c.loaderConfig() },
			func() any { lc := loader.DefaultConfig(); lc.ReadAheadTotal, lc.ReadAhead = 16<<20, 16<<20; return lc }},
		{"loader, read-ahead off", func(c *Config) { c.ReadAhead, c.NoReadAhead = 0, true },
			func(c *Config) any { return c.loaderConfig() },
			func() any { lc := loader.DefaultConfig(); lc.ReadAhead, lc.NoReadAhead = 0, true; return lc }},
		{"prefetch, read-ahead off", func(c *Config) { c.Staging, c.ReadAhead, c.NoReadAhead = 64<<20, 0, true },
			func(c *Config) any { return c.prefetchConfig() },
			func() any { pc := defaultPrefetch(); pc.Staging = 64 << 20; return pc }},
		{"loader fields", func(c *Config) { c.BlockSize, c.PFSTimeout, c.PFSMargin, c.NoCoalesce = 4<<20, time.Second, 3, true },
			func(c *Config) any { return c.loaderConfig() },
			func() any {
				lc := loader.DefaultConfig()
				lc.BlockSize, lc.PFSTimeout, lc.PFSMargin, lc.NoCoalesce, lc.ReadAheadTotal = 4<<20, time.Second, 3, true, 64<<20
				return lc
			}},
		{"prefetch fields", func(c *Config) { c.BlockSize, c.PrefetchWorkers = 4<<20, 7 },
			func(c *Config) any { return c.prefetchConfig() },
			func() any {
				pc := defaultPrefetch()
				pc.BlockSize, pc.Workers, pc.Staging = 4<<20, 7, 192<<20
				return pc
			}},

		// The catalog hides the control directory, and waits for SOURCE
		// as long as a read may (Now is a func: compared apart).
		{"catalog", func(*Config) {},
			func(c *Config) any { cc := c.catalogConfig(); cc.Now = nil; return cc },
			func() any { cc := catalog.DefaultConfig("/src"); cc.Hide, cc.Now = []string{".dlfs"}, nil; return cc }},
		{"catalog fields", func(c *Config) { c.MaxEntries, c.PFSTimeout, c.ControlName = 10, time.Second, ".ctl" },
			func(c *Config) any { cc := c.catalogConfig(); cc.Now = nil; return cc },
			func() any {
				cc := catalog.DefaultConfig("/src")
				cc.Hide, cc.MaxEntries, cc.StallTimeout, cc.Now = []string{".ctl"}, 10, time.Second, nil
				return cc
			}},
		{"fuse", func(*Config) {},
			func(c *Config) any { return c.fuseConfig() },
			func() any { return fusefs.DefaultConfig() }},
		{"fuse fields", func(c *Config) {
			c.ControlName, c.CacheTTL, c.AllowOther, c.ListingAttrs = ".ctl", time.Second, true, true
			c.Owner, c.GroupWrite, c.DebugFUSE = fusefs.Owner{Uid: 7, Gid: 8}, true, true
		},
			func(c *Config) any { return c.fuseConfig() },
			func() any {
				fc := fusefs.DefaultConfig()
				fc.ControlName, fc.TTL, fc.AllowOther, fc.ListingAttrs = ".ctl", time.Second, true, true
				fc.Owner, fc.GroupWrite, fc.Debug = fusefs.Owner{Uid: 7, Gid: 8}, true, true
				return fc
			}},
		// Not clustered, the node starts no gossip; with Join alone it
		// binds the default port.
		{"cluster", func(*Config) {},
			func(c *Config) any { return c.clusterConfig() },
			func() any { return cluster.Config{} }},
		{"cluster, join alone", func(c *Config) { c.NodeName, c.Join = "n", []string{"10.0.0.1:7946"} },
			func(c *Config) any { return c.clusterConfig() },
			func() any { return cluster.Config{NodeName: "n", Bind: defaultBind, Join: []string{"10.0.0.1:7946"}} }},
		{"cluster fields", func(c *Config) {
			c.Bind, c.Advertise, c.DataAddr, c.ClusterKey = "127.0.0.1:0", "10.0.0.2:7946", "127.0.0.1:0", testKey
			c.Insecure, c.GossipLocal, c.ForgetDead = true, true, time.Second
		},
			func(c *Config) any { return c.clusterConfig() },
			func() any {
				return cluster.Config{Bind: "127.0.0.1:0", Advertise: "10.0.0.2:7946", Meta: cluster.Meta{DataAddr: "127.0.0.1:0"},
					Key: testKey, Insecure: true, Local: true, ForgetDead: time.Second}
			}},
		// The nested Configs left these zero, for owners.New and
		// allocator.New to take the same defaults.
		{"owners", func(*Config) {},
			func(c *Config) any { return c.ownersConfig() },
			func() any { return owners.DefaultConfig() }},
		{"owners fields", func(c *Config) { c.NodeName, c.HashPlacement, c.PlacementEpochs = "n", true, 2 },
			func(c *Config) any { return c.ownersConfig() },
			func() any { return owners.Config{NodeName: "n", HashPlacement: true, PlacementEpochs: 2} }},
		{"allocator", func(*Config) {},
			func(c *Config) any { return c.allocatorConfig() },
			func() any { return allocator.DefaultConfig() }},
		{"allocator fields", func(c *Config) { c.LoaderCPUs, c.AllocationMode, c.JobIdle = 3, allocator.Even, time.Second },
			func(c *Config) any { return c.allocatorConfig() },
			func() any {
				ac := allocator.DefaultConfig()
				ac.CPUs, ac.Mode, ac.Idle = 3, allocator.Even, time.Second
				return ac
			}},
		{"prefetch, even allocation, clustered", func(c *Config) { c.AllocationMode, c.Bind = allocator.Even, "127.0.0.1:0" },
			func(c *Config) any { return c.prefetchConfig() },
			func() any {
				pc := defaultPrefetch()
				pc.Staging, pc.EvenShare, pc.AllRanks = 192<<20, true, true
				return pc
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig("/src", "/mnt")
			tc.set(&c)
			if got, want := tc.got(&c), tc.want(); !reflect.DeepEqual(got, want) {
				t.Errorf("derived\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

// defaultPrefetch is what DefaultConfig gives the prefetcher before the
// staging split: its defaults, and the RAM tier's capacity.
func defaultPrefetch() prefetch.Config {
	pc := prefetch.DefaultConfig()
	pc.RAM = DefaultConfig("", "").RAMCache
	return pc
}
