package daemon

import (
	"reflect"
	"testing"
	"time"

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
			func() any { pc := prefetch.DefaultConfig(); pc.Staging = 192 << 20; return pc }},
		{"loader, read-ahead beyond its share", func(c *Config) { c.Staging, c.ReadAhead = 64<<20, 32<<20 },
			func(c *Config) any { return c.loaderConfig() },
			func() any { lc := loader.DefaultConfig(); lc.ReadAheadTotal, lc.ReadAhead = 16<<20, 16<<20; return lc }},
		{"loader, read-ahead off", func(c *Config) { c.ReadAhead, c.NoReadAhead = 0, true },
			func(c *Config) any { return c.loaderConfig() },
			func() any { lc := loader.DefaultConfig(); lc.ReadAhead, lc.NoReadAhead = 0, true; return lc }},
		{"prefetch, read-ahead off", func(c *Config) { c.Staging, c.ReadAhead, c.NoReadAhead = 64<<20, 0, true },
			func(c *Config) any { return c.prefetchConfig() },
			func() any { pc := prefetch.DefaultConfig(); pc.Staging = 64 << 20; return pc }},
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
				pc := prefetch.DefaultConfig()
				pc.BlockSize, pc.Workers, pc.Staging = 4<<20, 7, 192<<20
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
