package access

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/dlfs/dlfs/access/accesstest"
	"github.com/dlfs/dlfs/catalog"
)

// ownedTree makes a catalog of entries with the given modes and owners
// (see accesstest.Tree).
func ownedTree(t *testing.T, spec map[string]string) *catalog.Snapshot {
	t.Helper()
	cat, err := catalog.Open(context.Background(), catalog.DefaultConfig(accesstest.Tree(t, spec)))
	if err != nil {
		t.Fatal(err)
	}
	return cat.Snapshot()
}

// TestPermissions: the owner's, the group's (primary or supplementary) or
// the others' bits decide, in that order, as the kernel's do; root reads
// and lists everything; a file under a directory one cannot search cannot
// be read, whatever its own mode.
func TestPermissions(t *testing.T) {
	snap := ownedTree(t, map[string]string{
		"pub/":            "755 1000 1000",
		"pub/a.jpg":       "644 1000 1000",
		"pub/own.jpg":     "600 1000 1000",
		"pub/group.jpg":   "640 1000 3000",
		"pub/nogroup.jpg": "604 1000 3000", // the group's bits say no, even though others may
		"pub/run":         "744 1000 1000",
		"pub/noown.jpg":   "066 1000 1000", // the owner's bits say no, even though others may
		"priv/":           "700 1000 1000",
		"priv/open.jpg":   "644 1000 1000",
		"priv/sub/":       "755 1000 1000",
		"priv/sub/x.jpg":  "644 1000 1000",
		"grp/":            "750 1000 3000",
		"grp/g.jpg":       "644 1000 3000",
		"nolist/":         "711 1000 1000",
		"nolist/in.jpg":   "644 1000 1000",
		"nosearch/":       "744 1000 1000",
		"nosearch/x.jpg":  "644 1000 1000",
	})
	owner := Cred{Uid: 1000, Gid: 1000}
	other := Cred{Uid: 2000, Gid: 2000}
	member := Cred{Uid: 2000, Gid: 2000, Groups: []uint32{3000}}
	primary := Cred{Uid: 2000, Gid: 3000}
	for _, c := range []struct {
		cred Cred
		path string
		read bool
	}{
		{owner, "pub/a.jpg", true}, {other, "pub/a.jpg", true}, {Root, "pub/a.jpg", true},
		{owner, "pub/own.jpg", true}, {other, "pub/own.jpg", false}, {Root, "pub/own.jpg", true},
		{member, "pub/group.jpg", true}, {primary, "pub/group.jpg", true}, {other, "pub/group.jpg", false},
		{member, "pub/nogroup.jpg", false}, {primary, "pub/nogroup.jpg", false}, {other, "pub/nogroup.jpg", true},
		{Everyone, "pub/nogroup.jpg", false},
		{other, "priv/sub/x.jpg", false}, {owner, "priv/sub/x.jpg", true}, // an unsearchable grandparent
		{owner, "pub/noown.jpg", false}, {other, "pub/noown.jpg", true},
		{owner, "priv/open.jpg", true}, {other, "priv/open.jpg", false}, {Root, "priv/open.jpg", true},
		{member, "grp/g.jpg", true}, {other, "grp/g.jpg", false},
		{other, "nolist/in.jpg", true}, // searchable, not listable: a known name opens
		{other, "nosearch/x.jpg", false}, {owner, "nosearch/x.jpg", true},
		{Everyone, "pub/a.jpg", true}, {Everyone, "pub/group.jpg", false}, {Everyone, "priv/open.jpg", false},
	} {
		e := snap.Lookup(c.path)
		if e == nil {
			t.Fatalf("%s not in the catalog", c.path)
		}
		if got := c.cred.CanRead(e); got != c.read {
			t.Errorf("uid %d gid %d groups %v reads %s: %v, want %v", c.cred.Uid, c.cred.Gid, c.cred.Groups, c.path, got, c.read)
		}
	}
	for _, c := range []struct {
		cred Cred
		path string
		list bool
	}{
		{owner, "priv", true}, {other, "priv", false}, {Root, "priv", true},
		{other, "nolist", false}, {owner, "nolist", true},
		{other, "nosearch", false}, {member, "grp", true}, {other, "pub", true},
		{other, "pub/a.jpg", false},                           // not a directory
		{other, "priv/sub", false}, {owner, "priv/sub", true}, // listable, but not reachable
	} {
		if got := c.cred.CanList(snap.Lookup(c.path)); got != c.list {
			t.Errorf("uid %d lists %s: %v, want %v", c.cred.Uid, c.path, got, c.list)
		}
	}
	// Root searches every directory, but executes only a file someone may.
	for p, want := range map[string]bool{"pub/a.jpg": false, "pub/run": true, "priv": true, "nolist": true} {
		if got := Root.Allows(snap.Lookup(p), Exec); got != want {
			t.Errorf("root executes %s: %v, want %v", p, got, want)
		}
	}
}

func TestParseStartTime(t *testing.T) {
	line := "4711 (a (b) c) S 1 4711 4711 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615 0"
	if got, err := ParseStartTime([]byte(line)); err != nil || got != 987654 {
		t.Errorf("start %d, %v; want 987654", got, err)
	}
	for _, bad := range []string{"", "4711 x S 1", "4711 (x) S 1 2 3", "4711 (x) S 1 4711 4711 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 -5 1"} {
		if _, err := ParseStartTime([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	self, err := StartTime("/proc", os.Getpid())
	if err != nil || self == 0 {
		t.Fatalf("own start time: %d %v", self, err)
	}
	if !Alive("/proc", Proc{os.Getpid(), self}) || Alive("/proc", Proc{os.Getpid(), self + 1}) {
		t.Error("Alive does not tell this process from one with its pid and another start")
	}
}

func FuzzParseStartTime(f *testing.F) {
	f.Add([]byte("1 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 0"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseStartTime(b) // never panics
	})
}

func TestParseCred(t *testing.T) {
	for _, c := range []struct {
		status string
		want   string
		ok     bool
	}{
		{"Name:\tpython3\nUid:\t1000\t1000\t1000\t1001\nGid:\t100\t100\t100\t101\nGroups:\t4 24 27 \n", "1001 101 [4 24 27]", true},
		{"Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\n", "0 0 []", true},
		{"Uid:\t0\t0\t0\nGid:\t0\t0\t0\t0\n", "", false},
		{"Gid:\t0\t0\t0\t0\n", "", false},
		{"Uid:\t0\t0\t0\t0\n", "", false},
		{"Uid:\t0\t0\t0\tx\nGid:\t0\t0\t0\t0\n", "", false},
		{"Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t5 y\n", "", false},
	} {
		got, err := ParseCred([]byte(c.status))
		if (err == nil) != c.ok || c.ok && fmt.Sprintf("%d %d %v", got.Uid, got.Gid, got.Groups) != c.want {
			t.Errorf("%q: %+v %v, want %s (ok %v)", c.status, got, err, c.want, c.ok)
		}
	}
	self, err := CredOf("/proc", os.Getpid())
	if err != nil || self.Uid != uint32(os.Getuid()) || self.Gid != uint32(os.Getgid()) {
		t.Errorf("own credentials: %+v %v", self, err)
	}
	if _, err := CredOf("/proc", 1<<30); !errors.Is(err, ErrGone) {
		t.Errorf("credentials of a pid that does not exist: %v, want ErrGone", err)
	}
	if _, err := StartTime("/proc", 1<<30); !errors.Is(err, ErrGone) {
		t.Errorf("start time of a pid that does not exist: %v, want ErrGone", err)
	}
	many := "Uid:\t5\t5\t5\t5\nGid:\t5\t5\t5\t5\nGroups:" + strings.Repeat(" 7", 3*maxGroups) + "\n"
	if c, err := ParseCred([]byte(many)); err != nil || len(c.Groups) != maxGroups {
		t.Errorf("%d groups kept of %d (%v), want %d", len(c.Groups), 3*maxGroups, err, maxGroups)
	}
}
