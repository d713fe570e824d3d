package cluster

import (
	"errors"
	"log/slog"
	"net"
	"testing"

	"github.com/hashicorp/memberlist"
)

// TestDecodeMetaRefuses: metadata from a peer that is empty, of another
// version, too long, not JSON, or with a negative capacity of either
// tier is refused with ErrMeta.
func TestDecodeMetaRefuses(t *testing.T) {
	good, err := Meta{DataAddr: "h:1", Dataset: "d", RAM: 1, SSD: 2}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if m, err := DecodeMeta(good); err != nil || m.RAM != 1 || m.SSD != 2 || m.DataAddr != "h:1" {
		t.Fatalf("good metadata: %+v, %v", m, err)
	}
	long := append([]byte{metaV1}, make([]byte, MaxMeta)...)
	for name, b := range map[string][]byte{
		"empty":        {},
		"version 2":    append([]byte{2}, good[1:]...),
		"too long":     long,
		"not JSON":     {metaV1, '{'},
		"negative RAM": append([]byte{metaV1}, `{"data":"h:1","dataset":"d","ram":-1,"ssd":2}`...),
		"negative SSD": append([]byte{metaV1}, `{"data":"h:1","dataset":"d","ram":1,"ssd":-1}`...),
	} {
		t.Run(name, func(t *testing.T) {
			if m, err := DecodeMeta(b); !errors.Is(err, ErrMeta) {
				t.Fatalf("accepted as %+v (%v), want ErrMeta", m, err)
			}
		})
	}
}

// TestRecordStates: a member that leaves is left, one that fails is
// dead, and metadata a peer sends that does not decode leaves the member
// in the view without it. The members alive, and only they, are known
// hosts, this node never.
func TestRecordStates(t *testing.T) {
	c := &Cluster{cfg: Config{NodeName: "self", ForgetDead: 1 << 40}, log: slog.New(slog.DiscardHandler), members: map[string]member{}, hosts: &hostSet{n: map[string]int{}}}
	ev := &events{c}
	meta, err := Meta{DataAddr: "h:1", Dataset: "d", RAM: 5, SSD: 6}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	bad := append([]byte{metaV1}, `{"ssd":-1}`...)
	ev.NotifyJoin(&memberlist.Node{Name: "self", Addr: net.IPv4(10, 0, 0, 1), Port: 1, Meta: meta})
	ev.NotifyJoin(&memberlist.Node{Name: "a", Addr: net.IPv4(10, 0, 0, 2), Port: 1, Meta: meta})
	ev.NotifyJoin(&memberlist.Node{Name: "b", Addr: net.IPv4(10, 0, 0, 3), Port: 1, Meta: bad})
	ev.NotifyJoin(&memberlist.Node{Name: "c", Addr: net.IPv4(10, 0, 0, 4), Port: 1, Meta: meta})
	if !c.hosts.has("10.0.0.2") || !c.hosts.has("10.0.0.3") || c.hosts.has("10.0.0.1") {
		t.Fatalf("known hosts %v: want the other members', not this node's", c.hosts.n)
	}
	ev.NotifyLeave(&memberlist.Node{Name: "a", Addr: net.IPv4(10, 0, 0, 2), Port: 1, Meta: meta, State: memberlist.StateLeft})
	ev.NotifyLeave(&memberlist.Node{Name: "c", Addr: net.IPv4(10, 0, 0, 4), Port: 1, Meta: meta, State: memberlist.StateDead})
	want := map[string]string{"self": StateAlive, "a": StateLeft, "b": StateAlive, "c": StateDead}
	for _, m := range c.Members() {
		if m.State != want[m.Name] {
			t.Errorf("%s is %s, want %s", m.Name, m.State, want[m.Name])
		}
		if m.Name == "b" && (m.Meta.SSD != 0 || m.Meta.Dataset != "") {
			t.Errorf("b's bad metadata was kept: %+v", m.Meta)
		}
		if m.Name == "a" && m.Meta.SSD != 6 {
			t.Errorf("a's metadata %+v", m.Meta)
		}
	}
	if c.hosts.has("10.0.0.2") || c.hosts.has("10.0.0.4") || !c.hosts.has("10.0.0.3") {
		t.Fatalf("known hosts %v after a left and c died: want b's only", c.hosts.n)
	}
	// An address taken over by a member back from a crash.
	ev.NotifyJoin(&memberlist.Node{Name: "b", Addr: net.IPv4(10, 0, 0, 9), Port: 1, Meta: meta})
	if c.hosts.has("10.0.0.3") || !c.hosts.has("10.0.0.9") {
		t.Fatalf("known hosts %v after b moved: want its new address only", c.hosts.n)
	}
}

// TestNodeMetaLimit: metadata longer than memberlist's limit is never
// handed to it (memberlist would refuse to start or to gossip).
func TestNodeMetaLimit(t *testing.T) {
	d := &delegate{}
	d.set([]byte("12345"))
	if got := d.NodeMeta(5); string(got) != "12345" {
		t.Errorf("within the limit: %q", got)
	}
	if got := d.NodeMeta(4); got != nil {
		t.Errorf("past the limit: %q, want none", got)
	}
}
