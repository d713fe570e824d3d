package fusefs

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Unmount unmounts the FUSE mount at mp; lazy detaches it even while
// files are open there, and the kernel finishes once they close. A user
// who may not unmount (not root) goes through fusermount3, which unmounts
// the FUSE mounts of the calling user.
func Unmount(mp string, lazy bool) error {
	// A symbolic link at mp is not followed: its target may be any mount.
	flags := unix.UMOUNT_NOFOLLOW
	if lazy {
		flags |= unix.MNT_DETACH
	}
	err := unix.Unmount(mp, flags)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("%s is not mounted (%w)", mp, err)
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("%s is busy: a process has files open there (%w)", mp, err)
	case errors.Is(err, unix.EPERM):
		args := []string{"-u", mp}
		if lazy {
			args = []string{"-uz", mp}
		}
		if out, ferr := exec.Command("fusermount3", args...).CombinedOutput(); ferr != nil {
			return fmt.Errorf("unmount %s: %v: %s", mp, ferr, out)
		}
		return nil
	}
	return fmt.Errorf("unmount %s: %w", mp, err)
}

// MountInfo is one line of /proc/self/mountinfo: a mount as this process's
// mount namespace sees it.
type MountInfo struct {
	Point  string // where it is mounted
	Dev    string // the filesystem's device, MAJOR:MINOR: one per FUSE connection
	FSType string // "fuse.dlfs", "ext4", ...
	Source string // "dlfs:/data", "/dev/sda1", ...
	// Options are the superblock's options (for FUSE, user_id=UID: the
	// user who mounted it).
	Options string
}

// IsFUSE reports whether m is a FUSE mount.
func (m MountInfo) IsFUSE() bool { return m.FSType == "fuse" || strings.HasPrefix(m.FSType, "fuse.") }

// Owner returns the user a FUSE mount belongs to (its user_id option).
func (m MountInfo) Owner() (uid uint32, ok bool) {
	for _, o := range strings.Split(m.Options, ",") {
		if v, found := strings.CutPrefix(o, "user_id="); found {
			n, err := strconv.ParseUint(v, 10, 32)
			return uint32(n), err == nil
		}
	}
	return 0, false
}

// MountAt returns the mount on top at mp (made absolute, its parent
// resolved), as /proc/self/mountinfo lists it; ok is false when nothing
// is mounted there. It reads no file under mp, so it works on a dead mount.
func MountAt(mp string) (m MountInfo, ok bool) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return m, false
	}
	return parseMountInfo(b, mp)
}

func parseMountInfo(b []byte, mp string) (m MountInfo, ok bool) {
	if abs, err := filepath.Abs(mp); err == nil {
		mp = abs
	}
	// mountinfo names mount points with their links resolved; mp itself
	// is not resolved, since a dead mount answers no stat.
	if dir, err := filepath.EvalSymlinks(filepath.Dir(mp)); err == nil {
		mp = filepath.Join(dir, filepath.Base(mp))
	}
	for _, line := range strings.Split(string(b), "\n") {
		// ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPEROPTIONS
		pre, post, found := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !found || len(f) < 5 || len(g) < 3 || unescapeMountInfo(f[4]) != mp {
			continue
		}
		m, ok = MountInfo{Point: mp, Dev: f[2], FSType: g[0], Source: unescapeMountInfo(g[1]), Options: g[2]}, true // the last is on top
	}
	return m, ok
}

// unescapeMountInfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountInfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Diagnose says what err, met on mp or a path under it, tells about the
// mount at mp, with advice that works: a dead mount (ENOTCONN), or one
// this user may not enter (EACCES, EPERM). It returns nil for other
// errors.
func Diagnose(mp string, err error) error {
	switch {
	case errors.Is(err, unix.ENOTCONN):
		return fmt.Errorf("%s is a dead mount (transport endpoint is not connected): its daemon died; run 'dlfs umount %s', or just mount again (dlfs mount clears it)", mp, mp)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		m, ok := MountAt(mp)
		uid, owned := m.Owner()
		if ok && m.IsFUSE() && owned && uid != uint32(os.Getuid()) && !hasOption(m.Options, "allow_other") {
			who := strconv.FormatUint(uint64(uid), 10)
			if u, err := user.LookupId(who); err == nil {
				who = u.Username
			}
			return fmt.Errorf("%s: permission denied: it is %s's FUSE mount (%s), made without --allow-other, so only that user may enter it (root included); run this as %s, or remount with --allow-other", mp, who, m.Source, who)
		}
		return fmt.Errorf("%s: permission denied: this user may not enter it; check its mode and owner (ls -ld %s)", mp, mp)
	}
	return nil
}

// hasOption reports whether a comma-separated option list holds opt.
func hasOption(opts, opt string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == opt {
			return true
		}
	}
	return false
}
