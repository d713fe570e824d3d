package loader

import (
	"reflect"
	"testing"
	"time"

	"github.com/dlfs/dlfs/perfmodel"
)

// TestOrder: the chain of sources for each case the choice of source
// handles.
func TestOrder(t *testing.T) {
	const ms = time.Millisecond
	never := time.Duration(1<<63 - 1)
	down := perfmodel.Unreachable
	ssd := link{kind: fromSSD}
	pfs := link{kind: fromPFS}
	peer := func(p string) link { return link{kind: fromOwner, peer: p} }
	prev := func(p string) link { return link{kind: fromPrevious, peer: p} }
	for _, c := range []struct {
		name string
		c    choice
		want []link
	}{
		{"PFS only", choice{est: map[string]time.Duration{"pfs": ms}}, []link{pfs}},
		{"SSD only", choice{ssd: true, est: map[string]time.Duration{"ssd": 50 * ms, "pfs": ms}}, []link{ssd, pfs}},
		{"SSD skipped after a failure", choice{ssd: true, est: map[string]time.Duration{"ssd": down, "pfs": ms}}, []link{pfs, ssd}},
		{"owner peer", choice{owner: "b", est: map[string]time.Duration{"peer:b": 2 * ms, "pfs": ms}}, []link{peer("b"), pfs}},
		{"SSD and owner, fastest first", choice{ssd: true, owner: "b",
			est: map[string]time.Duration{"ssd": 3 * ms, "peer:b": 2 * ms, "pfs": ms}}, []link{peer("b"), ssd, pfs}},
		{"equal estimates keep the SSD first", choice{ssd: true, owner: "b",
			est: map[string]time.Duration{"ssd": ms, "peer:b": ms, "pfs": ms}}, []link{ssd, peer("b"), pfs}},
		{"a peer asks: never another peer", choice{ssd: true, owner: "b", why: forPeer,
			est: map[string]time.Duration{"ssd": ms, "peer:b": ms, "pfs": ms}}, []link{ssd, pfs}},
		{"unreachable owner after the PFS", choice{owner: "b",
			est: map[string]time.Duration{"peer:b": down, "pfs": ms}}, []link{pfs, peer("b")}},
		{"previous owner probed before the PFS", choice{ssd: true, owner: "b", previous: "c",
			est: map[string]time.Duration{"ssd": ms, "peer:b": ms, "peer:c": ms, "pfs": ms}}, []link{ssd, peer("b"), prev("c"), pfs}},
		{"previous owner, a peer asks", choice{owner: "b", previous: "c", why: forPeer,
			est: map[string]time.Duration{"peer:b": ms, "peer:c": ms, "pfs": ms}}, []link{prev("c"), pfs}},
		{"previous owner that is the owner", choice{owner: "b", previous: "b",
			est: map[string]time.Duration{"peer:b": ms, "pfs": ms}}, []link{peer("b"), pfs}},
		{"previous owner is the owner, a peer asks", choice{owner: "b", previous: "b", why: forPeer,
			est: map[string]time.Duration{"peer:b": ms, "pfs": ms}}, []link{prev("b"), pfs}},
		{"unreachable previous owner", choice{previous: "c",
			est: map[string]time.Duration{"peer:c": down, "pfs": ms}}, []link{pfs}},
		{"slow copy, no margin", choice{owner: "b",
			est: map[string]time.Duration{"peer:b": 50 * ms, "pfs": ms}}, []link{peer("b"), pfs}},
		{"margin excludes a slow copy", choice{owner: "b", margin: 8,
			est:   map[string]time.Duration{"peer:b": 50 * ms, "pfs": ms},
			since: map[string]time.Duration{"peer:b": 0}}, []link{pfs, peer("b")}},
		{"margin keeps a copy within it", choice{owner: "b", margin: 8,
			est: map[string]time.Duration{"peer:b": 5 * ms, "pfs": ms}}, []link{peer("b"), pfs}},
		{"margin leaves a prefetch waiting for the copy", choice{owner: "b", margin: 8, why: forPrefetch,
			est: map[string]time.Duration{"peer:b": 50 * ms, "pfs": ms}}, []link{peer("b"), pfs}},
		{"margin: the previous owner still before the PFS", choice{owner: "b", previous: "c", margin: 8,
			est:   map[string]time.Duration{"peer:b": 50 * ms, "peer:c": ms, "pfs": ms},
			since: map[string]time.Duration{"peer:b": 0}}, []link{prev("c"), pfs, peer("b")}},
		{"slow copy unmeasured for a while probed before the PFS", choice{ssd: true, owner: "b", margin: 8,
			est:   map[string]time.Duration{"ssd": 20 * ms, "peer:b": 50 * ms, "pfs": ms},
			since: map[string]time.Duration{"ssd": 0, "peer:b": 2 * time.Second}}, []link{peer("b"), pfs, ssd}},
		{"only the first unmeasured copy is probed", choice{ssd: true, owner: "b", margin: 8,
			est:   map[string]time.Duration{"ssd": 20 * ms, "peer:b": 50 * ms, "pfs": ms},
			since: map[string]time.Duration{"ssd": never, "peer:b": never}}, []link{ssd, pfs, peer("b")}},
		{"probed copy goes after the previous owner", choice{owner: "b", previous: "c", margin: 8,
			est:   map[string]time.Duration{"peer:b": 50 * ms, "peer:c": ms, "pfs": ms},
			since: map[string]time.Duration{"peer:b": never}}, []link{peer("b"), prev("c"), pfs}},
		{"unreachable copy never probed", choice{owner: "b", margin: 8,
			est:   map[string]time.Duration{"peer:b": down, "pfs": ms},
			since: map[string]time.Duration{"peer:b": never}}, []link{pfs, peer("b")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := order(c.c); !reflect.DeepEqual(got, c.want) {
				t.Errorf("order = %v, want %v", got, c.want)
			}
		})
	}
}
