package loader

// Tests written against the mutants gremlins left alive (make mutate,
// docs/mutation.md), on the parts of the loader that stand alone.

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dlfs/dlfs/source"
)

func TestDefaultConfigValues(t *testing.T) {
	d := DefaultConfig()
	if d.BlockSize != 1<<20 || d.DemandPerContainer != 16 || d.PFSTimeout != time.Minute || d.PFSCalls != 256 || d.FailureTTL != 2*time.Second {
		t.Fatalf("DefaultConfig = %+v", d)
	}
}

// TestNewFillsDefaults: New takes the defaults for zero and negative
// settings, and keeps the ones given.
func TestNewFillsDefaults(t *testing.T) {
	d := DefaultConfig()
	for _, v := range []int{0, -1} {
		l := New(Config{BlockSize: int64(v), DemandPerContainer: v, PFSTimeout: time.Duration(v), PFSCalls: v, FailureTTL: time.Duration(v)}, nil, nil, nil)
		c := l.cfg
		if c.BlockSize != d.BlockSize || c.DemandPerContainer != d.DemandPerContainer || c.PFSTimeout != d.PFSTimeout ||
			c.PFSCalls != d.PFSCalls || c.FailureTTL != d.FailureTTL || c.Logger == nil || c.Model == nil {
			t.Fatalf("settings of %d: %+v", v, c)
		}
		if cap(l.pfsSlots) != d.PFSCalls {
			t.Fatalf("settings of %d: %d PFS slots", v, cap(l.pfsSlots))
		}
	}
	l := New(Config{BlockSize: 4096, DemandPerContainer: 3, PFSTimeout: time.Second, PFSCalls: 5, FailureTTL: time.Millisecond}, nil, nil, nil)
	if c := l.cfg; c.BlockSize != 4096 || c.DemandPerContainer != 3 || c.PFSTimeout != time.Second || c.PFSCalls != 5 || c.FailureTTL != time.Millisecond || cap(l.pfsSlots) != 5 {
		t.Fatalf("given settings replaced: %+v", c)
	}
}

// TestStatsTiers: Served has every tier; Fetched only those a block is
// fetched from (the SSD, peers, a moved sample's previous owner, the
// PFS), not RAM or the stage, which hold what was fetched.
func TestStatsTiers(t *testing.T) {
	s := New(Config{}, nil, nil, nil).Stats()
	keys := func(m map[string]Served) string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		return strings.Join(ks, ",")
	}
	if got := keys(s.Served); got != "moved,peer,pfs,ram,ssd,stage" {
		t.Errorf("Served: %s", got)
	}
	if got := keys(s.Fetched); got != "moved,peer,pfs,ssd" {
		t.Errorf("Fetched: %s", got)
	}
}

func failKeyN(i int) failKey {
	return failKey{path: fmt.Sprint("f", i), v: source.Version{Size: int64(i)}}
}

// TestFailuresBound: at most maxFailures are remembered: past it, the
// expired go first, then any; a TTL of zero remembers nothing.
func TestFailuresBound(t *testing.T) {
	now := time.Unix(1000, 0)
	boom := errors.New("read failed")
	var f failures
	f.put(failKeyN(-1), boom, now, 0)
	if f.len() != 0 {
		t.Fatal("a failure remembered for no time")
	}
	for i := 0; i < maxFailures; i++ {
		ttl := time.Hour
		if i%2 == 0 {
			ttl = time.Second // expired by the time of the next put
		}
		f.put(failKeyN(i), boom, now, ttl)
	}
	if f.len() != maxFailures {
		t.Fatalf("%d remembered, want %d", f.len(), maxFailures)
	}
	later := now.Add(time.Minute)
	f.put(failKeyN(maxFailures), boom, later, time.Hour)
	if f.len() != maxFailures/2+1 {
		t.Fatalf("past the bound: %d remembered, want the %d unexpired and the new one", f.len(), maxFailures/2)
	}
	if f.get(failKeyN(1), later) == nil || f.get(failKeyN(maxFailures), later) == nil {
		t.Fatal("an unexpired failure was forgotten")
	}
	// Full of unexpired ones: any goes, the bound holds.
	for i := maxFailures + 1; f.len() < maxFailures; i++ {
		f.put(failKeyN(i), boom, later, time.Hour)
	}
	f.put(failKeyN(-2), boom, later, time.Hour)
	if f.len() != maxFailures || f.get(failKeyN(-2), later) == nil {
		t.Fatalf("full: %d remembered (want %d), the newest kept: %v", f.len(), maxFailures, f.get(failKeyN(-2), later))
	}
}

// TestFailureExpires: a failure is answered until its TTL ends, and
// forgotten then.
func TestFailureExpires(t *testing.T) {
	now := time.Unix(1000, 0)
	var f failures
	f.put(failKeyN(1), errors.New("read failed"), now, time.Second)
	if err := f.get(failKeyN(1), now.Add(time.Second-1)); err == nil || !strings.Contains(err.Error(), "read failed") {
		t.Fatalf("within the TTL: %v", err)
	}
	if err := f.get(failKeyN(1), now.Add(time.Second)); err != nil || f.len() != 0 {
		t.Fatalf("at the TTL's end: %v, %d remembered", err, f.len())
	}
}
