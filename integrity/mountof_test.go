package integrity

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/source"
)

// TestIdentityOldMtimeAdded: a file added with an mtime older than the
// whole dataset (cp -p, rsync -a, tar x, touch -d 2001) does not enter
// the identity: its ctime is new, and ctime ranks. Nodes mounted before
// and after the addition keep one identity.
func TestIdentityOldMtimeAdded(t *testing.T) {
	a := dataset(200, 1_600_000_000)
	before := identity("directory", "", a)
	old := file{"train/c0/backdated.jpg", a[0].v}
	old.v.Mtime = time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	old.v.Ctime = (1_600_000_000 + 10_000) * 1e9 // written now, after all the others
	if after := identity("directory", "", append(append([]file{}, a...), old)); after != before {
		t.Error("one added file dated 2001 changed the identity")
	}
	// Its real counterpart on disk: a file touched back to 2001.
	dir := t.TempDir()
	var files []statFile
	for i := range 40 {
		rel := filepath.Join("c", string(rune('a'+i%26))+strings.Repeat("x", i/26)+".jpg")
		os.MkdirAll(filepath.Join(dir, "c"), 0o755)
		if err := os.WriteFile(filepath.Join(dir, rel), []byte(rel), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, statFile{dir, rel})
	}
	var id Identifier
	for _, f := range files {
		id.Add(f)
	}
	want := id.Dataset("directory", "", nil)
	p := filepath.Join(dir, "c", "zz-backdated.jpg")
	if err := os.WriteFile(p, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	then := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(p, then, then); err != nil {
		t.Fatal(err)
	}
	var id2 Identifier
	for _, f := range append(files, statFile{dir, "c/zz-backdated.jpg"}) {
		id2.Add(f)
	}
	if got := id2.Dataset("directory", "", nil); got != want {
		t.Error("a real file touched back to 2001 changed the identity")
	}
}

// TestMountOfBinds: the mount identity takes statfs's fsid where there
// is one (a device number can come back for another filesystem), and the
// mount's type and source from mountinfo.
func TestMountOfBinds(t *testing.T) {
	var fs unix.Statfs_t
	fs.Fsid.Val = [2]int32{0x1234, 0x5678}
	if got := fsidOf(fs, 99); got != 0x0000123400005678 {
		t.Errorf("fsidOf with an fsid = %#x; want the fsid", got)
	}
	if got := fsidOf(unix.Statfs_t{}, 99); got != 99 {
		t.Errorf("fsidOf without an fsid = %d; want the device number", got)
	}
	info := []byte("22 1 0:21 / /proc rw - proc proc rw\n" +
		"36 25 0:45 / /pfs rw,nosuid - fuse.lustre mgs@tcp:/scratch rw,user_id=0\n" +
		"37 25 8:1 / /data rw - ext4 /dev/sda1 rw\n")
	if ty, src := mountOfDev(info, unix.Mkdev(0, 45)); ty != "fuse.lustre" || src != "mgs@tcp:/scratch" {
		t.Errorf("mountOfDev(0:45) = %q, %q", ty, src)
	}
	if ty, src := mountOfDev(info, unix.Mkdev(9, 9)); ty != "" || src != "" {
		t.Errorf("mountOfDev of no mount = %q, %q", ty, src)
	}
	m, err := MountOf(t.TempDir(), "directory")
	if err != nil || !strings.Contains(m, "mount=") || strings.Contains(m, `mount="":""`) {
		t.Errorf("MountOf = %q, %v: want the mount's type and source", m, err)
	}
}

// TestOlderTies: the ranking's tie-breaks, each on its own: ctime first,
// then mtime, then size, then the order added.
func TestOlderTies(t *testing.T) {
	v := func(ctime, mtime, size int64) idFile {
		return idFile{v: source.Version{Ctime: ctime, Mtime: mtime, Size: size}}
	}
	for _, c := range []struct {
		name string
		a, b idFile
	}{
		{"ctime ranks first", v(1, 9, 9), v(2, 1, 1)},
		{"then mtime", v(5, 1, 9), v(5, 2, 1)},
		{"then size", v(5, 5, 1), v(5, 5, 2)},
		{"then the order added", idFile{v: source.Version{Ctime: 5, Mtime: 5, Size: 5}, seq: 1}, idFile{v: source.Version{Ctime: 5, Mtime: 5, Size: 5}, seq: 2}},
	} {
		if !older(c.a, c.b) || older(c.b, c.a) {
			t.Errorf("%s: older(a, b) = %v, older(b, a) = %v; want a older", c.name, older(c.a, c.b), older(c.b, c.a))
		}
	}
	same := v(5, 5, 5)
	if older(same, same) {
		t.Error("a file is older than itself")
	}
}

// TestMountOfBirthTime: where the filesystem keeps a directory's birth
// time, the mount identity holds it: a directory made anew at the same
// path is another mount identity even if it got the same inode number.
func TestMountOfBirthTime(t *testing.T) {
	dir := t.TempDir()
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, 0, unix.STATX_BTIME, &stx); err != nil || stx.Mask&unix.STATX_BTIME == 0 {
		t.Skip("this filesystem keeps no birth time")
	}
	m, err := MountOf(dir, "directory")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(" born=%d ", stx.Btime.Sec*1e9+int64(stx.Btime.Nsec))
	if !strings.Contains(m, want) {
		t.Errorf("MountOf = %q; want the birth time %q in it", m, want)
	}
}
