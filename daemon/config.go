package daemon

import (
	"github.com/dlfs/dlfs/allocator"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/daemon/owners"
	"github.com/dlfs/dlfs/fusefs"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/prefetch"
	"github.com/dlfs/dlfs/ssdstore"
)

// Deriving the parts' configurations
//
// Config is flat: one field a setting. Each part's Config is derived here,
// one function a part, from that package's DefaultConfig: what no field
// sets keeps the package's default, and no setting lives in two places.
// The functions are pure. Start calls them on the Config it completed
// (node name, control name, rate-limited logger, the key read from
// KeyFile) and adds what exists only once the node runs: the dataset's
// identity, the oracle, the callbacks into the node.

// ssdConfig is the SSD tier's Config (Start adds NextUse).
func (c *Config) ssdConfig() ssdstore.Config {
	sc := ssdstore.DefaultConfig(c.SSDDir)
	sc.Capacity, sc.Logger = c.SSDCapacity, c.Logger
	return sc
}

// loaderConfig is the loader's Config (Start adds Dataset, Model and Stage).
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

// prefetchConfig is the prefetcher's Config (Start adds Oracle and Stage).
func (c *Config) prefetchConfig() prefetch.Config {
	pc := prefetch.DefaultConfig()
	pc.Workers, pc.Staging = c.PrefetchWorkers, c.staging()-c.readAheadShare()
	pc.RAM = max(c.RAMCache, 0)
	if c.BlockSize > 0 {
		pc.BlockSize = c.BlockSize // the loader's
	}
	// In a cluster this node keeps samples for ranks that run elsewhere.
	pc.AllRanks = c.clustered()
	pc.EvenShare = c.AllocationMode == allocator.Even
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

// catalogConfig is the catalog's Config (Start adds Lister, or Saved and
// Identity).
func (c *Config) catalogConfig() catalog.Config {
	cc := catalog.DefaultConfig(c.Source)
	cc.Hide, cc.MaxEntries, cc.Logger = []string{c.controlName()}, c.MaxEntries, c.Logger
	if c.PFSTimeout > 0 {
		cc.StallTimeout = c.PFSTimeout // the operator's one bound on waiting for SOURCE
	}
	return cc
}

// fuseConfig is the filesystem's Config (Start adds MaxRequest, the
// passthrough mode, the latency histogram and the access log).
func (c *Config) fuseConfig() fusefs.Config {
	fc := fusefs.DefaultConfig()
	fc.ControlName, fc.TTL, fc.AllowOther, fc.ListingAttrs = c.controlName(), c.CacheTTL, c.AllowOther, c.ListingAttrs
	fc.Owner, fc.GroupWrite, fc.Debug, fc.Logger = c.Owner, c.GroupWrite, c.DebugFUSE, c.Logger
	return fc
}

// clusterConfig is the gossip membership's Config (Start adds the rest
// of Meta).
func (c *Config) clusterConfig() cluster.Config {
	return cluster.Config{NodeName: c.NodeName, Bind: c.gossipBind(), Advertise: c.Advertise, Join: c.Join,
		Key: c.ClusterKey, Insecure: c.Insecure, Meta: cluster.Meta{DataAddr: c.DataAddr},
		Local: c.GossipLocal, ForgetDead: c.ForgetDead, Logger: c.Logger}
}

// ownersConfig is the cluster's read policy's Config (Start adds Dataset).
func (c *Config) ownersConfig() owners.Config {
	oc := owners.DefaultConfig()
	oc.NodeName, oc.HashPlacement, oc.PlacementEpochs, oc.Logger = c.NodeName, c.HashPlacement, c.PlacementEpochs, c.Logger
	return oc
}

// allocatorConfig is the CPU allocator's Config (Start adds NodeCPU and
// LastRead).
func (c *Config) allocatorConfig() allocator.Config {
	ac := allocator.DefaultConfig()
	ac.CPUs, ac.Mode, ac.Idle, ac.Logger = c.LoaderCPUs, c.AllocationMode, c.JobIdle, c.Logger
	return ac
}

// controlName is ControlName, or fusefs's default.
func (c *Config) controlName() string {
	if c.ControlName == "" {
		return fusefs.DefaultConfig().ControlName
	}
	return c.ControlName
}

// clustered reports whether the node joins a cluster (gossip, the data
// port) rather than serving alone.
func (c *Config) clustered() bool { return c.Bind != "" || len(c.Join) > 0 }

// gossipBind is where gossip listens: "" when the node serves alone.
func (c *Config) gossipBind() string {
	switch {
	case c.Bind != "":
		return c.Bind
	case len(c.Join) > 0:
		return defaultBind
	}
	return ""
}
