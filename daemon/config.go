package daemon

import "github.com/dlfs/dlfs/ssdstore"

// Deriving the parts' configurations
//
// Config is flat: each setting is one field, which dlfs mount's flags set.
// Each part's Config is derived from those fields here, one function a
// part, from that package's defaults: what no field sets keeps the
// package's default. The functions are pure; Start adds what exists only
// once the node runs (the logger's rate limit aside, which Start applies
// to c.Logger first): the dataset's identity, the oracle, the
// callbacks into the node.

// ssdConfig is the SSD tier's Config (Start adds NextUse).
func (c *Config) ssdConfig() ssdstore.Config {
	sc := ssdstore.DefaultConfig(c.SSDDir)
	sc.Capacity, sc.Logger = c.SSDCapacity, c.Logger
	return sc
}
