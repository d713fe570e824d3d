package jobs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/access"
	"github.com/dlfs/dlfs/access/accesstest"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
)

// More users of the tests: carl shares alice's group, wheel is in group 0,
// bobGroup is bob in group 3000 (supplementary) and bobPrimary bob with
// 3000 as his primary group.
var (
	carl       = Owner{Cred: access.Cred{Uid: 1003, Gid: 1001}}
	wheel      = Owner{Cred: access.Cred{Uid: 1004, Gid: 0, Groups: []uint32{0}}}
	bobGroup   = Owner{Cred: access.Cred{Uid: 1002, Gid: 1002, Groups: []uint32{3000}}}
	bobPrimary = Owner{Cred: access.Cred{Uid: 1002, Gid: 3000}}
)

// permTree is an ImageFolder "data" of alice's (uid 1001, group 1001):
//   - pub/: four files, and acl.jpg (0644, but its ACL denies bob);
//   - grp/g.jpg, readable by group 3000 only;
//   - hidden/ (0711: searchable, not listable) with a listable class c/
//     and lnk, a symlink to pub;
//   - linked, a symlink to outside/cls (outside/ is 0711: the walk
//     follows the link and never lists outside/), and shut, a symlink to
//     outside/shut (0711);
//
// deep/in/c/x.jpg lies under deep/ (0700); lists/l.txt (readable by
// all) names pub/0.jpg and hidden/c/0.jpg, lists/deep.txt data/pub/0.jpg
// and deep/in/c/x.jpg. snap is called before each
// snapshot is taken (nil: nothing). Needs root.
func permTree(t *testing.T, snap func()) (*Registry, *catalog.Snapshot) {
	t.Helper()
	spec := map[string]string{
		"data/":               "755 1001 1001",
		"data/pub/acl.jpg":    "644 1001 1001",
		"data/grp/":           "755 1001 1001",
		"data/grp/g.jpg":      "640 1001 3000",
		"data/hidden/":        "711 1001 1001",
		"data/hidden/c/":      "755 1001 1001",
		"data/hidden/c/0.jpg": "644 1001 1001",
		"outside/":            "711 1001 1001",
		"outside/cls/":        "755 1001 1001",
		"outside/cls/0.jpg":   "644 1001 1001",
		"outside/shut/":       "711 1001 1001",
		"outside/shut/0.jpg":  "644 1001 1001",
		"deep/":               "700 1001 1001",
		"deep/in/":            "755 1001 1001",
		"deep/in/c/":          "755 1001 1001",
		"deep/in/c/x.jpg":     "644 1001 1001",
		"lists/l.txt":         "644 1001 1001",
		"lists/deep.txt":      "644 1001 1001",
	}
	for _, n := range []string{"0", "1", "2", "3"} {
		spec["data/pub/"+n+".jpg"] = "644 1001 1001"
	}
	root := accesstest.Tree(t, spec)
	for link, target := range map[string]string{"data/hidden/lnk": "../pub", "data/linked": "../outside/cls", "data/shut": "../outside/shut"} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	for l, lines := range map[string]string{"l.txt": "pub/0.jpg\nhidden/c/0.jpg\n", "deep.txt": "data/pub/0.jpg\ndeep/in/c/x.jpg\n"} {
		if err := os.WriteFile(filepath.Join(root, "lists", l), []byte(lines), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// user::rw-, user:1002:---, group::r--, mask::r--, other::r--
	a, err := catalog.NewACL(catalog.ACLEntry{Tag: catalog.ACLUserObj, Perm: 6}, catalog.ACLEntry{Tag: catalog.ACLUser, ID: 1002},
		catalog.ACLEntry{Tag: catalog.ACLGroupObj, Perm: 4}, catalog.ACLEntry{Tag: catalog.ACLMask, Perm: 4}, catalog.ACLEntry{Tag: catalog.ACLOther, Perm: 4})
	if err != nil {
		t.Fatal(err)
	}
	acl := []byte(a.Xattr())
	if err := unix.Setxattr(filepath.Join(root, "data/pub/acl.jpg"), catalog.XattrACL, acl, 0); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			t.Skip("the filesystem keeps no ACLs")
		}
		t.Fatal(err)
	}
	cat, err := catalog.Open(context.Background(), catalog.DefaultConfig(root))
	if err != nil {
		t.Fatal(err)
	}
	s := cat.Snapshot()
	return New(Config{
		Snapshot: func() *catalog.Snapshot {
			if snap != nil {
				snap()
			}
			return s
		},
		ReadFile: func(e *catalog.Entry) ([]byte, error) { return os.ReadFile(filepath.Join(root, e.Path())) },
	}), s
}

// TestPlansByPermission: what each user's job over permTree plans.
//   - bob's: pub/ but acl.jpg (its ACL), the class reached through the
//     link to outside/cls, not outside/shut (the walk lists it); nothing
//     of hidden/ (not listable), nor grp/;
//   - wheel's (group 0) and carl's (alice's group) the same as bob's
//     but acl.jpg: group 0 is no root, nor is the owner's group the owner;
//   - bob in group 3000, as a supplementary or his primary group, gets
//     grp/g.jpg too, even after his own job without the group, and when he
//     re-announces that job with the group;
//   - alice's and root's: everything;
//   - over hidden/ (searchable, not listable) bob gets nothing, even
//     through its class c/ or its link to pub; over deep/in (under a
//     directory bob may not search), nothing;
//   - bob's job over a list gets hidden/c/0.jpg (a list walks nothing),
//     not deep/in/c/x.jpg (deep/ is not searchable).
func TestPlansByPermission(t *testing.T) {
	r, _ := permTree(t, nil)
	line := " root=data sampler=sequential epoch=0"
	bobs := "data/linked/0.jpg,data/pub/0.jpg,data/pub/1.jpg,data/pub/2.jpg,data/pub/3.jpg"
	for _, c := range []struct {
		job  string
		who  Owner
		want string
	}{
		{"b", bob, bobs},
		{"w", wheel, "data/linked/0.jpg,data/pub/0.jpg,data/pub/1.jpg,data/pub/2.jpg,data/pub/3.jpg,data/pub/acl.jpg"},
		{"c", carl, "data/linked/0.jpg,data/pub/0.jpg,data/pub/1.jpg,data/pub/2.jpg,data/pub/3.jpg,data/pub/acl.jpg"},
		{"bg", bobGroup, "data/grp/g.jpg," + bobs},
		{"bp", bobPrimary, "data/grp/g.jpg," + bobs},
		{"a", alice, "data/grp/g.jpg,data/hidden/c/0.jpg,data/hidden/lnk/0.jpg,data/hidden/lnk/1.jpg,data/hidden/lnk/2.jpg,data/hidden/lnk/3.jpg," +
			"data/hidden/lnk/acl.jpg,data/linked/0.jpg,data/pub/0.jpg,data/pub/1.jpg,data/pub/2.jpg,data/pub/3.jpg,data/pub/acl.jpg,data/shut/0.jpg"},
		{"r", RootOwner, ""},
	} {
		if err := applyAs(r, c.who, "job="+c.job+line); err != nil {
			t.Fatalf("%s: %v", c.job, err)
		}
		got := sorted(paths(r.Get(c.job)))
		if c.job == "r" {
			c.want = sorted(paths(r.Get("a")))
		}
		if got != c.want {
			t.Errorf("job %s of uid %d gid %d groups %v plans %s, want %s", c.job, c.who.Uid, c.who.Gid, c.who.Groups, got, c.want)
		}
	}
	if !r.Get("b").Public || r.Get("w").Public {
		t.Errorf("public: bob's job %v (every sample readable by all), wheel's %v (acl.jpg, which bob may not read)", r.Get("b").Public, r.Get("w").Public)
	}
	// bob announces his job again, now in group 3000.
	if err := applyAs(r, bobGroup, "job=b epoch=1"); err != nil {
		t.Fatal(err)
	}
	if got := sorted(paths(r.Get("b"))); got != "data/grp/g.jpg,"+bobs {
		t.Errorf("bob's job re-announced in group 3000 plans %s", got)
	}
	for _, root := range []string{"data/hidden", "deep/in"} {
		if err := applyAs(r, bob, "job=x root="+root+" epoch=0"); err == nil || !strings.Contains(err.Error(), "may read") {
			t.Errorf("bob's job over %s: %v, %s", root, err, paths(r.Get("x")))
		}
		if err := applyAs(r, alice, "job=y"+root[len(root)-1:]+" root="+root+" epoch=0"); err != nil {
			t.Errorf("alice's job over %s: %v", root, err)
		}
	}
	if err := applyAs(r, bob, "job=l root=data dataset=list:lists/l.txt epoch=0"); err != nil {
		t.Fatal(err)
	}
	if got := paths(r.Get("l")); got != "data/pub/0.jpg,data/hidden/c/0.jpg" {
		t.Errorf("bob's list job plans %s", got)
	}
	if err := applyAs(r, bob, "job=d root=. dataset=list:lists/deep.txt epoch=0"); err != nil {
		t.Fatal(err)
	}
	if got := paths(r.Get("d")); got != "data/pub/0.jpg" {
		t.Errorf("bob's list job over deep.txt plans %s", got)
	}
}

func sorted(csv string) string {
	s := strings.Split(csv, ",")
	slices.Sort(s)
	return strings.Join(s, ",")
}

// TestJobsBelongToTheirUsers: neither a user of the owner's group nor one
// of group 0 may change or end another's job, nor take its name while
// the line that would is checked; each user's announced roots are its
// own.
func TestJobsBelongToTheirUsers(t *testing.T) {
	var during func()
	r, _ := permTree(t, func() {
		if f := during; f != nil {
			during = nil
			f()
		}
	})
	if err := applyAs(r, alice, "job=a root=data epoch=0"); err != nil {
		t.Fatal(err)
	}
	for _, who := range []Owner{carl, wheel} {
		if err := applyAs(r, who, "job=a root=data epoch=3"); !errors.Is(err, ErrNotOwner) {
			t.Errorf("uid %d gid %d moved alice's job: %v", who.Uid, who.Gid, err)
		}
		if err := r.EndAs(who, "a"); !errors.Is(err, ErrNotOwner) {
			t.Errorf("uid %d gid %d ended alice's job: %v", who.Uid, who.Gid, err)
		}
	}
	if j := r.Get("a"); j == nil || j.Spec.Epoch != 0 || j.Owner.Uid != alice.Uid {
		t.Fatalf("alice's job is now %+v", j)
	}
	if got := r.AnnouncedRoots(bob.Uid); len(got) != 0 {
		t.Errorf("bob's announced roots: %v", got)
	}
	if got := r.AnnouncedRoots(alice.Uid); !slices.Equal(got, []string{"data"}) {
		t.Errorf("alice's announced roots: %v", got)
	}
	// While bob's line for job n is checked, alice registers n.
	during = func() {
		if err := applyAs(r, alice, "job=n root=data epoch=0"); err != nil {
			t.Error(err)
		}
	}
	if err := applyAs(r, bob, "job=n root=data epoch=0"); !errors.Is(err, ErrNotOwner) {
		t.Errorf("bob's line for a name alice took meanwhile: %v", err)
	}
	if j := r.Get("n"); j == nil || j.Owner.Uid != alice.Uid {
		t.Errorf("job n belongs to %+v", j)
	}
}

// TestListBound: a list file over MaxListBytes is refused, saying so.
func TestListBound(t *testing.T) {
	r, s := permTree(t, nil)
	r.cfg.MaxListBytes = s.Lookup("lists/l.txt").Size
	if err := applyAs(r, bob, "job=l root=data dataset=list:lists/l.txt epoch=0"); err != nil {
		t.Fatalf("a list of MaxListBytes: %v", err)
	}
	if err := r.EndAs(bob, "l"); err != nil {
		t.Fatal(err)
	}
	r.cfg.MaxListBytes--
	if err := applyAs(r, bob, "job=m root=data dataset=list:lists/l.txt epoch=0"); !errors.Is(err, control.ErrSyntax) || !strings.Contains(err.Error(), "is more than") {
		t.Errorf("a list over MaxListBytes: %v", err)
	}
}
