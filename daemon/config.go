package daemon

import (
	"github.com/dlfs/dlfs/allocator"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/prefetch"
	"github.com/dlfs/dlfs/ssdstore"
)

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

// loaderConfig is the loader's Config (Start adds Dataset and Model).
// Validate checks it: a negative ReadAhead stays negative.
func (c *Config) loaderConfig() loader.Config {
	lc := loader.DefaultConfig()
	lc.BlockSize, lc.PFSTimeout, lc.PFSMargin, lc.NoCoalesce = c.BlockSize, c.PFSTimeout, c.PFSMargin, c.NoCoalesce
	lc.ReadAhead, lc.NoReadAhead, lc.Logger = c.ReadAhead, c.NoReadAhead, c.Logger
	if !c.NoReadAhead {
		lc.ReadAheadTotal = c.readAheadShare()
		if lc.ReadAhead == 0 {
			lc.ReadAhead = loader.DefaultConfig().ReadAhead
		}
		lc.ReadAhead = min(lc.ReadAhead, lc.ReadAheadTotal)
	}
	return lc
}

// prefetchConfig is the prefetcher's Config (Start adds Oracle).
func (c *Config) prefetchConfig() prefetch.Config {
	pc := prefetch.DefaultConfig()
	pc.Workers, pc.Staging = c.PrefetchWorkers, c.staging()-c.readAheadShare()
	if c.BlockSize > 0 {
		pc.BlockSize = c.BlockSize // the loader's
	}
	// In a cluster this node keeps samples for ranks that run elsewhere.
	pc.AllRanks = c.clustered()
	pc.EvenShare = c.Allocation.Mode == allocator.Even
	pc.Logger = c.Logger
	return pc
}

// staging is Staging, or the prefetcher's default.
func (c *Config) staging() int64 {
	if c.Staging <= 0 {
		return prefetch.DefaultConfig().Staging
	}
	return c.Staging
}

// readAheadShare is read-ahead's share of Staging: read-ahead within
// files and the prefetcher both hold fetched bytes that no reader has
// taken yet, so they share it, read-ahead a quarter (none with
// NoReadAhead) and the prefetcher the rest.
func (c *Config) readAheadShare() int64 {
	if c.NoReadAhead {
		return 0
	}
	return max(c.staging()/4, 1)
}
