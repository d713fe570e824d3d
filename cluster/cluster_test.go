package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func start(t *testing.T, name string, key []byte, join ...string) *Cluster {
	t.Helper()
	c, err := Start(Config{NodeName: name, Bind: "127.0.0.1:0", Join: join, Key: key, Insecure: key == nil, Local: true,
		Meta: Meta{DataAddr: "127.0.0.1:9" + name[len(name)-1:], Dataset: "ds", RAM: 1 << 30, SSD: 4 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitView polls until c sees want alive members.
func waitView(t *testing.T, c *Cluster, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(c.Alive()) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s sees %v, want %d alive", c.cfg.NodeName, c.Members(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestJoinLeaveMeta(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	a := start(t, "node-a", key)
	b := start(t, "node-b", key, a.Addr())
	c := start(t, "node-c", key, a.Addr())
	for _, n := range []*Cluster{a, b, c} {
		waitView(t, n, 3)
	}
	for _, m := range a.Members() {
		if m.Meta.Dataset != "ds" || m.Meta.RAM != 1<<30 || m.Meta.DataAddr == "" {
			t.Errorf("member %s carries metadata %+v", m.Name, m.Meta)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	waitView(t, a, 2)
	for _, m := range a.Members() {
		if m.Name == "node-c" && m.State == StateAlive {
			t.Errorf("node-c is still alive after leaving")
		}
	}
}

// TestKeyRequired: a node without the cluster key cannot join.
func TestKeyRequired(t *testing.T) {
	a := start(t, "node-a", bytes.Repeat([]byte{1}, 16))
	_, err := Start(Config{NodeName: "intruder", Bind: "127.0.0.1:0", Join: []string{a.Addr()}, Local: true, Insecure: true})
	if err == nil {
		t.Fatal("a node without the key joined")
	}
	// Without --insecure, a node without a key does not even start.
	if _, err := Start(Config{NodeName: "keyless", Bind: "127.0.0.1:0", Local: true}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "--insecure") {
		t.Fatalf("a node without a key started: %v", err)
	}
	_, err = Start(Config{NodeName: "wrong", Bind: "127.0.0.1:0", Join: []string{a.Addr()}, Local: true,
		Key: bytes.Repeat([]byte{2}, 16)})
	if err == nil {
		t.Fatal("a node with another key joined")
	}
	if len(a.Alive()) != 1 {
		t.Errorf("the cluster let a stranger in: %v", a.Members())
	}
}

func TestBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Bind: "127.0.0.1:0"},
		{NodeName: "x", Bind: "nonsense"},
		{NodeName: "x", Bind: "127.0.0.1:0", Key: []byte("short")},
		{NodeName: "x", Bind: "127.0.0.1:0", Meta: Meta{Dataset: string(make([]byte, 600))}},
	} {
		if _, err := Start(cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}

func FuzzDecodeMeta(f *testing.F) {
	good, _ := Meta{DataAddr: "h:1", Dataset: "d", RAM: 1, SSD: 2}.Encode()
	f.Add(good)
	withJobs, _ := Meta{DataAddr: "h:1", Dataset: "d", Jobs: []string{"job=a epoch=3 world=2 ranks=1 balance=locality batch=4", "epoch=x"}}.Encode()
	f.Add(withJobs)
	f.Add([]byte{})
	f.Add([]byte{1, '{'})
	f.Add([]byte{2, '{', '}'})
	f.Add(append([]byte{1}, `{"ram":1,"ssd":-1}`...))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMeta(b)
		if err != nil {
			if !errors.Is(err, ErrMeta) {
				t.Fatalf("error %v does not wrap ErrMeta", err)
			}
			return
		}
		if m.RAM < 0 || m.SSD < 0 {
			t.Fatalf("accepted %+v", m)
		}
		if _, err := m.Encode(); err != nil && len(fmt.Sprint(m)) < MaxMeta/2 {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
		if len(m.Specs)+len(m.jobErrs) != len(m.Jobs) {
			t.Fatalf("%d job lines gave %d specs and %d errors", len(m.Jobs), len(m.Specs), len(m.jobErrs))
		}
		for _, s := range m.Specs {
			if err := s.Check(); err != nil {
				t.Fatalf("spec %+v fails Check: %v", s, err)
			}
		}
	})
}

// TestDecodeMetaJobs: the gossiped job lines are parsed once, on arrival,
// merged over the defaults; a line that does not parse or check is left
// out, and the others kept in order.
func TestDecodeMetaJobs(t *testing.T) {
	b, err := Meta{DataAddr: "h:1", Dataset: "d", Jobs: []string{"job=a epoch=3 world=2 ranks=1", "job=b bogus", "job=c epoch=0 ranks=4", "refresh", "job=d epoch=1 sampler=random"}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	m, err := DecodeMeta(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Specs) != 2 || m.Specs[0].Name != "a" || m.Specs[0].Epoch != 3 || m.Specs[0].World != 2 || m.Specs[0].Root != "." ||
		m.Specs[1].Name != "d" || m.Specs[1].Sampler != "random" || len(m.Specs[1].Ranks) != 1 {
		t.Errorf("specs %+v", m.Specs)
	}
	if len(m.jobErrs) != 3 || len(m.Jobs) != 5 {
		t.Errorf("%d errors (%v), %d lines", len(m.jobErrs), m.jobErrs, len(m.Jobs))
	}
}

// TestSetMeta: a metadata update reaches every member, this one included.
func TestSetMeta(t *testing.T) {
	a := start(t, "node-a", nil)
	b := start(t, "node-b", nil, a.Addr())
	waitView(t, a, 2)
	waitView(t, b, 2)
	ch := a.Subscribe()
	m := b.cfg.Meta
	m.Jobs = []string{"job=x epoch=0 world=2 ranks=1"}
	if err := b.SetMeta(m); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*Cluster{a, b} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			var got []string
			for _, mm := range c.Members() {
				if mm.Name == "node-b" {
					got = mm.Meta.Jobs
				}
			}
			if len(got) == 1 && got[0] == m.Jobs[0] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s sees node-b's jobs as %q", c.cfg.NodeName, got)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	select {
	case <-ch:
	default:
		t.Error("subscriber was not told of the update")
	}
	m.Jobs = []string{string(make([]byte, MaxMeta))}
	if err := b.SetMeta(m); !errors.Is(err, ErrMeta) {
		t.Errorf("oversized metadata: got %v, want ErrMeta", err)
	}
}

// TestLeaveBeforeClose: a node that says it leaves is seen as left by the
// others at once, while it still runs; its Close afterwards is clean.
func TestLeaveBeforeClose(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	a := start(t, "node-a", key)
	b := start(t, "node-b", key, a.Addr())
	waitView(t, a, 2)
	waitView(t, b, 2)
	if err := b.Leave(); err != nil {
		t.Fatal(err)
	}
	waitView(t, a, 1) // b gone from a's view while b still runs
	if err := b.Close(); err != nil {
		t.Errorf("Close after Leave: %v", err)
	}
}
