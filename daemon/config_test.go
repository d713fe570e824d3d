package daemon

import (
	"reflect"
	"testing"

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
