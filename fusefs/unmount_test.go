package fusefs

import (
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseMountInfo(t *testing.T) {
	info := []byte(`22 1 0:21 / /proc rw,nosuid shared:5 - proc proc rw
61 22 0:50 / /mnt/my\040data rw,nosuid,nodev,relatime shared:30 - fuse.dlfs dlfs:/srv/data rw,user_id=1000,group_id=1000,default_permissions
62 61 0:51 / /mnt/my\040data rw,relatime - fuse.dlfs dlfs:/srv/other rw,user_id=0,group_id=0,default_permissions,allow_other
`)
	m, ok := parseMountInfo(info, "/mnt/my data")
	if !ok || m.Dev != "0:51" || m.FSType != "fuse.dlfs" || m.Source != "dlfs:/srv/other" || !m.IsFUSE() || !hasOption(m.Options, "allow_other") {
		t.Errorf("the mount on top: %+v %v", m, ok)
	}
	if uid, ok := m.Owner(); !ok || uid != 0 {
		t.Errorf("owner %d %v, want 0", uid, ok)
	}
	if m, ok := parseMountInfo(info, "/proc"); !ok || m.IsFUSE() {
		t.Errorf("/proc: %+v %v", m, ok)
	}
	if _, ok := parseMountInfo(info, "/mnt"); ok {
		t.Error("/mnt is not a mount point")
	}
}

func TestDiagnose(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("stat: %w", unix.ENOTCONN), "dead mount"},
		{unix.EACCES, "permission denied: this user may not enter it; check its mode"},
		{unix.ENOENT, ""},
	} {
		got := Diagnose(dir, c.err)
		if c.want == "" {
			if got != nil {
				t.Errorf("%v: %v, want nil", c.err, got)
			}
			continue
		}
		if got == nil || !strings.Contains(got.Error(), c.want) || !strings.Contains(got.Error(), dir) {
			t.Errorf("%v: %v, want %q", c.err, got, c.want)
		}
	}
}
