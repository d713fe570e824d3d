package fusefs

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/catalog"
)

// TestACLMounted: through a mount (allow_other), a file whose SOURCE ACL
// denies uid 65534 (user:65534:---, mode 0644) shows that ACL (getxattr,
// listxattr) and the kernel denies that user, while a plain 0644 file
// shows none and is readable; another user gets what the ACL's mask
// allows (r--); the control tree has no ACL.
func TestACLMounted(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to act as another user")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	src := t.TempDir()
	if err := os.Chmod(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"denied.jpg", "plain.jpg"} {
		if err := os.WriteFile(filepath.Join(src, n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a, err := catalog.NewACL(catalog.ACLEntry{Tag: catalog.ACLUserObj, Perm: 6}, catalog.ACLEntry{Tag: catalog.ACLUser, ID: 65534},
		catalog.ACLEntry{Tag: catalog.ACLGroupObj, Perm: 4}, catalog.ACLEntry{Tag: catalog.ACLMask, Perm: 4}, catalog.ACLEntry{Tag: catalog.ACLOther, Perm: 4})
	if err != nil {
		t.Fatal(err)
	}
	acl := []byte(a.Xattr())
	if err := unix.Setxattr(filepath.Join(src, "denied.jpg"), catalog.XattrACL, acl, 0); err != nil {
		if err == unix.EOPNOTSUPP {
			t.Skip("SOURCE's filesystem keeps no ACLs")
		}
		t.Fatal(err)
	}
	cfg := catalog.DefaultConfig(src)
	cfg.Hide = []string{".dlfs"}
	cat, err := catalog.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := New(Config{AllowOther: true}, tree{cat}, &plane{})
	mnt := t.TempDir()
	server, err := f.Mount(mnt, "dlfs-test")
	if err != nil {
		t.Skipf("cannot mount: %v", err)
	}
	t.Cleanup(func() { _ = server.Unmount() })

	buf := make([]byte, 1024)
	n, err := unix.Getxattr(filepath.Join(mnt, "denied.jpg"), catalog.XattrACL, buf)
	if err != nil || string(buf[:n]) != string(acl) {
		t.Errorf("the ACL through the mount: %x %v, want %x", buf[:max(n, 0)], err, acl)
	}
	if n, err := unix.Getxattr(filepath.Join(mnt, "denied.jpg"), catalog.XattrACL, nil); err != nil || n != len(acl) {
		t.Errorf("the ACL's size through the mount: %d %v, want %d", n, err, len(acl))
	}
	if _, err := unix.Getxattr(filepath.Join(mnt, "denied.jpg"), catalog.XattrACL, buf[:len(acl)-1]); err != unix.ERANGE {
		t.Errorf("the ACL into a short buffer: %v, want ERANGE", err)
	}
	n, err = unix.Listxattr(filepath.Join(mnt, "denied.jpg"), buf)
	if err != nil || string(buf[:n]) != catalog.XattrACL+"\x00" {
		t.Errorf("listxattr: %q %v", buf[:max(n, 0)], err)
	}
	names := len(catalog.XattrACL) + 1
	if n, err := unix.Listxattr(filepath.Join(mnt, "denied.jpg"), nil); err != nil || n != names {
		t.Errorf("listxattr's size: %d %v, want %d", n, err, names)
	}
	if n, err := unix.Listxattr(filepath.Join(mnt, "denied.jpg"), buf[:names]); err != nil || n != names {
		t.Errorf("listxattr into a buffer of its size: %d %v", n, err)
	}
	if _, err := unix.Listxattr(filepath.Join(mnt, "denied.jpg"), buf[:names-1]); err != unix.ERANGE {
		t.Errorf("listxattr into a short buffer: %v, want ERANGE", err)
	}
	for _, name := range []string{"user.dlfs", "security.capability", "system.posix_acl_default"} {
		if _, err := unix.Getxattr(filepath.Join(mnt, "denied.jpg"), name, buf); err != unix.ENODATA {
			t.Errorf("%s of a file with an access ACL: %v, want ENODATA", name, err)
		}
	}
	for _, p := range []string{"plain.jpg", ".dlfs", ""} {
		if _, err := unix.Getxattr(filepath.Join(mnt, p), catalog.XattrACL, buf); err != unix.ENODATA {
			t.Errorf("the ACL of %q: %v, want ENODATA", p, err)
		}
		if n, err := unix.Listxattr(filepath.Join(mnt, p), buf); n != 0 || err != nil {
			t.Errorf("listxattr of %q: %q %v, want nothing", p, buf[:max(n, 0)], err)
		}
	}

	root, err := os.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, c := range []struct {
		uid  int
		name string
		mode uint32
		ok   bool
	}{
		{65534, "denied.jpg", unix.R_OK, false},
		{65534, "plain.jpg", unix.R_OK, true},
		{2000, "denied.jpg", unix.R_OK, true},
	} {
		err := accessAs(int(root.Fd()), c.uid, c.name, c.mode)
		if (err == nil) != c.ok {
			t.Errorf("uid %d, access %o to %s through the mount: %v, want allowed %v", c.uid, c.mode, c.name, err, c.ok)
		}
	}

	// SOURCE's ACL changes to grant 65534 read; after the refresh, the
	// kernel no longer holds the old one.
	if err := unix.Removexattr(filepath.Join(src, "denied.jpg"), catalog.XattrACL); err != nil {
		t.Fatal(err)
	}
	d, err := cat.Refresh(context.Background())
	if err != nil || len(d.Changed) != 1 {
		t.Fatalf("refresh: %d changed, %v", len(d.Changed), err)
	}
	f.Invalidate(d)
	if err := accessAs(int(root.Fd()), 65534, "denied.jpg", unix.R_OK); err != nil {
		t.Errorf("uid 65534 reads denied.jpg after its ACL was removed and the mount refreshed: %v", err)
	}
	if _, err := unix.Getxattr(filepath.Join(mnt, "denied.jpg"), catalog.XattrACL, buf); err != unix.ENODATA {
		t.Errorf("the removed ACL through the mount: %v, want ENODATA", err)
	}
}

// accessAs asks the kernel whether uid (group uid, no other groups) may
// access name in the directory open as dirfd with mode, from a thread
// whose filesystem ids are the user's; the thread ends with its goroutine.
func accessAs(dirfd, uid int, name string, mode uint32) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with its changed ids
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			errc <- e
			return
		}
		unix.Setfsgid(uid)
		unix.Setfsuid(uid)
		errc <- unix.Faccessat2(dirfd, name, mode, unix.AT_EACCESS)
	}()
	return <-errc
}
