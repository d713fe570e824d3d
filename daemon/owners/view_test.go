package owners

import (
	"fmt"
	"sync"
	"testing"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/placement"
)

// members names members with data addresses, gossiping lines.
func members(t *testing.T, names ...string) (*placement.Table, []cluster.Member) {
	t.Helper()
	ms := make([]cluster.Member, len(names))
	for i, n := range names {
		ms[i] = cluster.Member{Name: n, Meta: cluster.Meta{DataAddr: "127.0.0.1:" + fmt.Sprint(1+i), RAM: 1 << 30}}
	}
	tb, err := placeAlive(ms)
	if err != nil {
		t.Fatal(err)
	}
	return tb, ms
}

// arrive is m as a peer receives it: cluster.DecodeMeta parses its job
// lines.
func arrive(t *testing.T, m cluster.Meta) cluster.Meta {
	t.Helper()
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if m, err = cluster.DecodeMeta(b); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestViewReadOnce: readers that decide while the watcher swaps views
// see one view whole: an owner is always the one a single view gives
// (never a table of one view read with the members of another), and the
// previous owner comes from the table the current one replaced. Run with
// -race: the views are shared without a lock.
func TestViewReadOnce(t *testing.T) {
	o := &Owners{cfg: Config{NodeName: "me"}, stop: make(chan struct{})}
	t2, m2 := members(t, "a", "b")
	t3, m3 := members(t, "a", "b", "c", "d", "e")
	v2 := &View{table: t2, members: m2}
	v3 := &View{table: t3, members: m3, prev: t2, prevMembers: m2}
	o.view.Store(v2)
	paths := make([]string, 200)
	for i := range paths {
		paths[i] = fmt.Sprintf("c%d/%04d.jpg", i%5, i)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the watcher
		defer wg.Done()
		for i := range 2000 {
			if i%2 == 0 {
				o.view.Store(v3)
			} else {
				o.view.Store(v2)
			}
		}
	}()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 4000 {
				p := paths[i%len(paths)]
				m, ok := o.owner(p)
				if !ok {
					t.Errorf("%s: no owner", p)
					return
				}
				if m.Name != v2.OwnerName(p) && m.Name != v3.OwnerName(p) {
					t.Errorf("%s: owner %s, which neither view gives it (%s, %s)", p, m.Name, v2.OwnerName(p), v3.OwnerName(p))
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestLayoutPerView: a layout is computed once per view and job, and a
// new view (the membership changed) makes it again from the new table.
func TestLayoutPerView(t *testing.T) {
	o := &Owners{cfg: Config{NodeName: "a"}, d: Deps{Snapshot: func() *catalog.Snapshot { return &catalog.Snapshot{} }}}
	j := jobAt(t, 0)
	line := j.Spec
	line.Ranks = []int{0}
	t2, m2 := members(t, "a", "b")
	m2[0].Meta.Jobs = []string{line.Line()}
	m2[0].Meta = arrive(t, m2[0].Meta)
	o.view.Store(&View{table: t2, members: m2})
	if l := o.Layout(j); fmt.Sprint(l.RankNode) != "[0 -1]" {
		t.Fatalf("rank nodes %v under a's line alone, want [0 -1]", l.RankNode)
	}
	v := o.View()
	if m := v.layouts.Load(); m == nil || (*m)["j"].job != j {
		t.Fatal("the layout was not kept in the view")
	}
	kept := (*v.layouts.Load())["j"].layout.ID
	if l := o.Layout(j); l.ID != kept {
		t.Errorf("asked again under the same view: ID %x, want the kept %x", l.ID, kept)
	}
	// b now runs rank 1: a new view, a new layout.
	t2b, m2b := members(t, "a", "b")
	m2b[0].Meta = m2[0].Meta
	line.Ranks = []int{1}
	m2b[1].Meta.Jobs = []string{line.Line()}
	m2b[1].Meta = arrive(t, m2b[1].Meta)
	o.view.Store(&View{table: t2b, members: m2b})
	if l := o.Layout(j); fmt.Sprint(l.RankNode) != "[0 1]" || l.ID == kept {
		t.Errorf("under the new view: rank nodes %v, ID %x (was %x); want [0 1] and a new ID", l.RankNode, l.ID, kept)
	}
	// Before any table: nothing known, nothing to pin.
	o.view.Store(&View{})
	if l := o.Layout(j); fmt.Sprint(l.RankNode) != "[-1 -1]" {
		t.Errorf("no table: rank nodes %v", l.RankNode)
	}
}
