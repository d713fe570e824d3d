package catalog

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// namedACL is user::rw-, user:65534:---, group::r--, mask::r--, other::r--
// as the value of system.posix_acl_access.
var namedACL = encodeACL([]ACLEntry{
	{Tag: ACLUserObj, Perm: 6, ID: aclUndefinedID}, {Tag: ACLUser, Perm: 0, ID: 65534},
	{Tag: ACLGroupObj, Perm: 4, ID: aclUndefinedID}, {Tag: ACLMask, Perm: 4, ID: aclUndefinedID},
	{Tag: ACLOther, Perm: 4, ID: aclUndefinedID},
})

func TestParseACL(t *testing.T) {
	u := func(tag, perm uint16, id uint32) ACLEntry { return ACLEntry{Tag: tag, Perm: perm, ID: id} }
	obj := func(tag, perm uint16) ACLEntry { return ACLEntry{Tag: tag, Perm: perm} }
	for _, c := range []struct {
		name string
		es   []ACLEntry
		ok   bool
	}{
		{"minimal", []ACLEntry{obj(ACLUserObj, 6), obj(ACLGroupObj, 4), obj(ACLOther, 4)}, true},
		{"named", []ACLEntry{obj(ACLUserObj, 6), u(ACLUser, 0, 65534), u(ACLUser, 4, 7), obj(ACLGroupObj, 4), u(ACLGroup, 4, 9), obj(ACLMask, 4), obj(ACLOther, 0)}, true},
		{"a mask alone", []ACLEntry{obj(ACLUserObj, 6), obj(ACLGroupObj, 4), obj(ACLMask, 0), obj(ACLOther, 4)}, true},
		{"named without a mask", []ACLEntry{obj(ACLUserObj, 6), u(ACLUser, 0, 65534), obj(ACLGroupObj, 4), obj(ACLOther, 4)}, false},
		{"no other", []ACLEntry{obj(ACLUserObj, 6), obj(ACLGroupObj, 4)}, false},
		{"no owner", []ACLEntry{obj(ACLGroupObj, 4), obj(ACLOther, 4)}, false},
		{"no group", []ACLEntry{obj(ACLUserObj, 6), obj(ACLOther, 4)}, false},
		{"owner twice", []ACLEntry{obj(ACLUserObj, 6), obj(ACLUserObj, 6), obj(ACLGroupObj, 4), obj(ACLOther, 4)}, false},
		{"out of order", []ACLEntry{obj(ACLUserObj, 6), obj(ACLGroupObj, 4), u(ACLUser, 4, 7), obj(ACLMask, 4), obj(ACLOther, 4)}, false},
		{"permission 8", []ACLEntry{obj(ACLUserObj, 8), obj(ACLGroupObj, 4), obj(ACLOther, 4)}, false},
		{"unknown tag", []ACLEntry{obj(ACLUserObj, 6), obj(0x40, 4), obj(ACLGroupObj, 4), obj(ACLOther, 4)}, false},
	} {
		a, err := ParseACL(encodeACL(c.es))
		if (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok %v", c.name, err, c.ok)
			continue
		}
		if err != nil {
			if !errors.Is(err, ErrACL) {
				t.Errorf("%s: %v is not ErrACL", c.name, err)
			}
			continue
		}
		if len(a.Entries()) != len(c.es) || a.Entries()[1].Perm != c.es[1].Perm || a.Xattr() != string(encodeACL(a.Entries())) {
			t.Errorf("%s: parsed %+v", c.name, a.Entries())
		}
	}
	many := make([]ACLEntry, 0, MaxACLEntries+1)
	many = append(many, obj(ACLUserObj, 6))
	for i := 0; len(many) < MaxACLEntries-3; i++ {
		many = append(many, u(ACLUser, 4, uint32(i)))
	}
	many = append(many, obj(ACLGroupObj, 4), obj(ACLMask, 4), obj(ACLOther, 4))
	if _, err := ParseACL(encodeACL(many)); err != nil {
		t.Errorf("%d entries: %v", len(many), err)
	}
	many = append(many[:1], append([]ACLEntry{u(ACLUser, 4, 1<<30)}, many[1:]...)...)
	if _, err := ParseACL(encodeACL(many)); err == nil {
		t.Errorf("%d entries parsed", len(many))
	}
	for _, bad := range [][]byte{nil, {2, 0, 0}, {1, 0, 0, 0}, append([]byte{2, 0, 0, 0}, 1, 0, 6, 0, 0, 0, 0)} {
		if _, err := ParseACL(bad); err == nil {
			t.Errorf("%x parsed", bad)
		}
	}
}

// TestACLFor: an ACL of the owner, group and other entries equal to the
// mode's bits is the mode (none kept); one that differs from it in any
// of them, or has a mask or named entries, is kept.
func TestACLFor(t *testing.T) {
	minimal := encodeACL([]ACLEntry{{Tag: ACLUserObj, Perm: 6}, {Tag: ACLGroupObj, Perm: 4}, {Tag: ACLOther, Perm: 4}})
	for mode, keep := range map[uint32]bool{0o644: false, 0o744: true, 0o654: true, 0o640: true, 0o645: true} {
		a, err := aclFor(minimal, mode)
		if err != nil || (a != nil) != keep {
			t.Errorf("the minimal ACL rw-r--r-- on mode %o: kept %v (%v), want %v", mode, a != nil, err, keep)
		}
	}
	if a, err := aclFor(namedACL, 0o644); err != nil || a == nil {
		t.Errorf("a named entry on mode 644: %v %v, want kept", a, err)
	}
	if _, err := aclFor(namedACL[:12], 0o644); err == nil {
		t.Error("a broken ACL read")
	}
}

// TestACLTableBound: past maxACLBytes of distinct ACLs, a new one is
// refused and one already kept is still found.
func TestACLTableBound(t *testing.T) {
	known, err := ParseACL(namedACL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := aclOf(known); err != nil {
		t.Fatal(err)
	}
	fresh, err := NewACL(ACLEntry{Tag: ACLUserObj, Perm: 6}, ACLEntry{Tag: ACLUser, Perm: 1, ID: 4242424},
		ACLEntry{Tag: ACLGroupObj, Perm: 4}, ACLEntry{Tag: ACLMask, Perm: 5}, ACLEntry{Tag: ACLOther})
	if err != nil {
		t.Fatal(err)
	}
	acls.mu.Lock()
	defer func(m int) { maxACLBytes = m }(maxACLBytes)
	maxACLBytes = acls.bytes
	acls.mu.Unlock()
	if _, err := aclOf(fresh); !errors.Is(err, errACLs) {
		t.Errorf("a new ACL past the bound: %v", err)
	}
	if _, err := aclOf(known); err != nil {
		t.Errorf("a known ACL past the bound: %v", err)
	}
}

func FuzzParseACL(f *testing.F) {
	f.Add(namedACL)
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseACL(b)
		if err == nil && a.Xattr() != string(encodeACL(a.Entries())) {
			t.Fatalf("%x: not canonical", b)
		}
	})
}

// setACL gives path the ACL b, skipping the test where the filesystem
// keeps no ACLs.
func setACL(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := unix.Setxattr(path, XattrACL, b, 0); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			t.Skipf("the filesystem of %s keeps no ACLs", path)
		}
		t.Fatalf("set the ACL of %s: %v", path, err)
	}
}

// TestScanACLs: the scan keeps each entry's access ACL when it says more
// than the mode (a named user, a mask), two files of one directory each
// its own (one of 43 entries, more than the scan's first buffer holds),
// none when it says as much (the minimal ACL the mode is), none for a
// symlink; the saved snapshot keeps
// them, and a refresh reports an ACL changed on SOURCE as a change.
func TestScanACLs(t *testing.T) {
	src := t.TempDir()
	for _, p := range []string{"d", "d/x.jpg", "d/y.jpg", "plain.jpg", "minimal.jpg"} {
		var err error
		if filepath.Ext(p) == "" {
			err = os.Mkdir(filepath.Join(src, p), 0o755)
		} else {
			err = os.WriteFile(filepath.Join(src, p), []byte("data"), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("d/x.jpg", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	setACL(t, filepath.Join(src, "d/x.jpg"), namedACL)
	setACL(t, filepath.Join(src, "d"), namedACL)
	setACL(t, filepath.Join(src, "minimal.jpg"), encodeACL([]ACLEntry{{Tag: ACLUserObj, Perm: 6}, {Tag: ACLGroupObj, Perm: 4}, {Tag: ACLOther, Perm: 4}}))
	// More entries than the scan's first buffer holds.
	big := []ACLEntry{{Tag: ACLUserObj, Perm: 6, ID: aclUndefinedID}}
	for i := range 40 {
		big = append(big, ACLEntry{Tag: ACLUser, Perm: 4, ID: 70000 + uint32(i)})
	}
	big = append(big, ACLEntry{Tag: ACLGroupObj, Perm: 4, ID: aclUndefinedID}, ACLEntry{Tag: ACLMask, Perm: 4, ID: aclUndefinedID},
		ACLEntry{Tag: ACLOther, Perm: 4, ID: aclUndefinedID})
	bigACL := encodeACL(big)
	setACL(t, filepath.Join(src, "d/y.jpg"), bigACL)
	cfg := DefaultConfig(src)
	cfg.Saved = filepath.Join(t.TempDir(), "catalog")
	cfg.Identity = "acls"
	cat, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, s *Snapshot) {
		t.Helper()
		for p, want := range map[string]string{"d": string(namedACL), "d/x.jpg": string(namedACL), "d/y.jpg": string(bigACL), "plain.jpg": "", "minimal.jpg": "", "link": ""} {
			e := s.Lookup(p)
			if e == nil {
				t.Fatalf("%s: no %s", what, p)
			}
			got := ""
			if a := e.ACL(); a != nil {
				got = a.Xattr()
			}
			if got != want {
				t.Errorf("%s: %s has ACL %x, want %x", what, p, got, want)
			}
			if e.Uid() != uint32(os.Getuid()) {
				t.Errorf("%s: %s owned by %d", what, p, e.Uid())
			}
		}
	}
	check("scan", cat.Snapshot())
	if err := Save(cfg.Saved, cat.Snapshot(), cfg.Identity, cat.nextIno.Load()); err != nil {
		t.Fatal(err)
	}
	again, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	check("saved", again.Snapshot())

	other := encodeACL([]ACLEntry{{Tag: ACLUserObj, Perm: 6}, {Tag: ACLUser, Perm: 4, ID: 65534},
		{Tag: ACLGroupObj, Perm: 4}, {Tag: ACLMask, Perm: 4}, {Tag: ACLOther, Perm: 4}})
	setACL(t, filepath.Join(src, "d/x.jpg"), other)
	d, err := cat.Refresh(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Changed) != 1 || d.Changed[0].Path() != "d/x.jpg" {
		t.Errorf("refresh after an ACL change: changed %v, want d/x.jpg", d.Changed)
	}
	want, err := ParseACL(other)
	if err != nil {
		t.Fatal(err)
	}
	if a := cat.Snapshot().Lookup("d/x.jpg").ACL(); a == nil || a.Xattr() != want.Xattr() {
		t.Errorf("d/x.jpg after the refresh: ACL %v", a)
	}
}
