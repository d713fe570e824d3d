package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/fusefs"
)

// TestUmountRefusesOthers: dlfs umount of a tmpfs, of a symbolic link to
// it, or of a directory where nothing is mounted fails with one line
// saying what is there, and the tmpfs stays mounted.
func TestUmountRefusesOthers(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", tmp, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(tmp, unix.MNT_DETACH) })
	link := filepath.Join(dir, "link")
	if err := os.Symlink(tmp, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, mp, want string
		lazy           bool
	}{
		{"tmpfs", tmp, tmp + " is not a dlfs mount: it is a tmpfs mount of tmpfs", false},
		{"tmpfs lazily", tmp, tmp + " is not a dlfs mount: it is a tmpfs mount of tmpfs", true},
		{"link to tmpfs", link, link + " is a symbolic link (to " + tmp + "), not a dlfs mount", false},
		{"link to tmpfs lazily", link, link + " is a symbolic link (to " + tmp + "), not a dlfs mount", true},
		{"plain directory", dir, dir + " is not mounted", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := umount(tc.mp, tc.lazy)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("dlfs umount %s: %v; want %q...", tc.mp, err, tc.want)
			}
			if m, ok := fusefs.MountAt(tmp); !ok || m.FSType != "tmpfs" {
				t.Fatalf("the tmpfs is gone after dlfs umount %s", tc.mp)
			}
		})
	}
	// Should a link replace the mount point between the check and the
	// unmount, the unmount does not follow it either.
	for _, lazy := range []bool{false, true} {
		if err := fusefs.Unmount(link, lazy); err == nil {
			t.Errorf("fusefs.Unmount of a link to a tmpfs (lazy %v) succeeded", lazy)
		}
		if _, ok := fusefs.MountAt(tmp); !ok {
			t.Fatalf("fusefs.Unmount (lazy %v) followed a link and unmounted the tmpfs", lazy)
		}
	}
}

// TestIsDlfs: a mount is dlfs's by its type, fuse.dlfs, or by its source
// dlfs:SOURCE on a FUSE mount; nothing else is.
func TestIsDlfs(t *testing.T) {
	for _, tc := range []struct {
		m    fusefs.MountInfo
		want bool
	}{
		{fusefs.MountInfo{FSType: "fuse.dlfs", Source: "dlfs:/data"}, true},
		{fusefs.MountInfo{FSType: "fuse.dlfs", Source: "/data"}, true},
		{fusefs.MountInfo{FSType: "fuse", Source: "dlfs:/data"}, true},
		{fusefs.MountInfo{FSType: "fuse.sshfs", Source: "host:/x"}, false},
		{fusefs.MountInfo{FSType: "tmpfs", Source: "dlfs:/data"}, false},
		{fusefs.MountInfo{FSType: "ext4", Source: "/dev/sda1"}, false},
	} {
		if got := isDlfs(tc.m); got != tc.want {
			t.Errorf("isDlfs(%+v) = %v, want %v", tc.m, got, tc.want)
		}
	}
}
