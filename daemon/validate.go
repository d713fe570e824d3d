package daemon

import (
	"bufio"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/backing"
	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/fusefs"
	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/ssdstore"
)

// Checking a configuration
//
// Config.Check looks at everything a mount needs before any of it is
// started: the settings, this host (/dev/fuse, the mount helper, the
// kernel, memory), the SSD cache directory (its mode, its lock, its free
// space), the cluster key file, the ports, MOUNTPOINT and SOURCE. It
// returns one Check per thing looked at, which dlfs doctor prints.
// Validate, which Start calls, fails on the first failed Check of those,
// and looks at SOURCE last and only if nothing else failed: a mount that
// cannot work says so before SOURCE is scanned (which takes minutes at
// ten million files), and before a SOURCE that stopped answering is
// touched.

// Level is how a Check went.
type Level int

const (
	OK   Level = iota
	Warn       // the mount works, but not quite as asked
	Fail       // the mount cannot work: Validate refuses the Config
)

func (l Level) String() string {
	switch l {
	case OK:
		return "ok"
	case Warn:
		return "warn"
	}
	return "FAIL"
}

// Check is one thing Config.Check looked at. A failed Check is an error.
type Check struct {
	Level Level
	// What is what was looked at, named as dlfs mount names it: a flag
	// ("--ssd-cache"), SOURCE, MOUNTPOINT, a device, "kernel".
	What string
	// Detail says what was found and, unless all is well, what to do.
	Detail string
}

func (c Check) Error() string { return c.What + ": " + c.Detail }

// Host is what Check reads from the machine it runs on; ThisHost is this
// one, and tests make up others.
type Host struct {
	FUSEDev  string // /dev/fuse
	FUSEConf string // /etc/fuse.conf
	Meminfo  string // /proc/meminfo
	// MemoryMax are the cgroup (v2) memory.max files of this process's
	// cgroup and of its ancestors: the least bounds its memory.
	MemoryMax []string
	Root      bool   // the mount is made without a helper
	Release   string // the kernel's, as uname -r gives it
	ShmemTHP  string // shmem's huge page mode (backing.ShmemTHP); "" unknown
	LookPath  func(file string) (string, error)
	// ListenTCP and ListenUDP listen on addr and close again.
	ListenTCP, ListenUDP func(addr string) error
}

// ThisHost returns the Host this process runs on.
func ThisHost() Host {
	var u unix.Utsname
	_ = unix.Uname(&u)
	return Host{
		FUSEDev: "/dev/fuse", FUSEConf: "/etc/fuse.conf", Meminfo: "/proc/meminfo", MemoryMax: cgroupMemoryMax(),
		Root: os.Geteuid() == 0, Release: unix.ByteSliceToString(u.Release[:]), ShmemTHP: backing.ShmemTHP(), LookPath: exec.LookPath,
		ListenTCP: func(addr string) error {
			l, err := net.Listen("tcp", addr)
			if err == nil {
				l.Close()
			}
			return err
		},
		ListenUDP: func(addr string) error {
			c, err := net.ListenPacket("udp", addr)
			if err == nil {
				c.Close()
			}
			return err
		},
	}
}

// cgroupMemoryMax lists the memory.max files from this process's cgroup
// (v2) up to the root.
func cgroupMemoryMax() []string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	var files []string
	for _, line := range strings.Split(string(b), "\n") {
		p, ok := strings.CutPrefix(line, "0::")
		if !ok {
			continue
		}
		for dir := filepath.Join("/sys/fs/cgroup", p); strings.HasPrefix(dir, "/sys/fs/cgroup"); dir = filepath.Dir(dir) {
			files = append(files, filepath.Join(dir, "memory.max"))
		}
	}
	return files
}

// Validate checks c against this host before anything is started (see
// Check) and returns the failed checks, joined (each a Check), or nil. It
// makes Mountpoint absolute, and Source absolute and free of links, so
// that the catalog saved by one mount is found by the next however SOURCE
// is spelled.
func (c *Config) Validate() error {
	_, err := c.validate(ThisHost())
	return err
}

// validate is Validate on host h; it returns the warnings too.
func (c *Config) validate(h Host) (warnings []Check, err error) {
	if c.Source == "" || c.Mountpoint == "" {
		return nil, Check{Fail, "arguments", "SOURCE and MOUNTPOINT are both required"}
	}
	checks := c.checkAllButSource(h)
	if failures(checks) == nil {
		checks = append(checks, c.checkSource()...)
	}
	for _, ch := range checks {
		if ch.Level == Warn {
			warnings = append(warnings, ch)
		}
	}
	return warnings, failures(checks)
}

// failures joins the failed checks.
func failures(checks []Check) error {
	var errs []error
	for _, ch := range checks {
		if ch.Level == Fail {
			errs = append(errs, ch)
		}
	}
	return errors.Join(errs...)
}

// Check looks at everything the mount needs on host h, in the order
// Validate does, SOURCE last, and returns a Check for each. It makes
// Mountpoint and Source canonical, as Validate does.
func (c *Config) Check(h Host) []Check {
	return append(c.checkAllButSource(h), c.checkSource()...)
}

func (c *Config) checkAllButSource(h Host) []Check {
	var out []Check
	add := func(level Level, what, format string, a ...any) {
		out = append(out, Check{level, what, fmt.Sprintf(format, a...)})
	}
	// The settings.
	if c.DatasetID != "" {
		if err := integrity.ValidDatasetID(c.DatasetID); err != nil {
			add(Fail, "--dataset-id", "%v: give a name such as imagenet-2012", err)
		}
	}
	if n := c.controlName(); strings.ContainsRune(n, '/') || n == "." || n == ".." {
		add(Fail, "--control-name", "%q must be a plain file name, such as .dlfs", n)
	}
	if err := c.loaderConfig().Validate(); err != nil {
		add(Fail, "loader", "%v", err)
	}
	if c.PlacementEpochs < 0 || c.PlacementEpochs > 64 {
		add(Fail, "--placement-epochs", "%d: want 1 to 64", c.PlacementEpochs)
	}
	out = append(out, c.checkCluster(h)...)

	// This host.
	out = append(out, checkFUSE(h, c.AllowOther)...)
	out = append(out, c.checkPassthrough(h))
	if ch, ok := c.checkShmemTHP(h); ok {
		out = append(out, ch)
	}
	out = append(out, c.checkMemory(h)...)
	if c.SSDDir != "" {
		out = append(out, checkCacheDir(c.SSDDir, c.SSDCapacity)...)
	}
	for _, p := range []struct {
		flag, addr string
		udp        bool
	}{{"--bind", c.gossipBind(), true}, {"--data-addr", c.DataAddr, false}, {"--metrics-addr", c.MetricsAddr, false}} {
		if p.addr == "" {
			continue
		}
		err := h.ListenTCP(p.addr)
		if err == nil && p.udp {
			err = h.ListenUDP(p.addr)
		}
		if err != nil {
			add(Fail, p.flag, "%s cannot be listened on (%v): another process holds it (ss -ltnup | grep %s), or the address is not this host's", p.addr, bareErr(err), portOf(p.addr))
		} else {
			add(OK, p.flag, "%s is free", p.addr)
		}
	}
	if c.Mountpoint != "" {
		out = append(out, c.checkMountpoint())
	}
	return out
}

// checkCluster checks the key and the addresses the other hosts would
// be given.
func (c *Config) checkCluster(h Host) []Check {
	var out []Check
	add := func(level Level, what, format string, a ...any) {
		out = append(out, Check{level, what, fmt.Sprintf(format, a...)})
	}
	if f := c.KeyFile; f != "" {
		fi, err := os.Stat(f)
		switch {
		case err != nil:
			add(Fail, "--cluster-key-file", "%s: %v; make one with: head -c 32 /dev/urandom | base64 > %s; chmod 600 %s", f, bareErr(err), f, f)
		case fi.Mode().Perm()&0o077 != 0:
			add(Fail, "--cluster-key-file", "%s is mode %04o: others may read the key that guards the cluster; chmod 600 %s", f, fi.Mode().Perm(), f)
		default:
			if _, err := ReadKey(f); err != nil {
				add(Fail, "--cluster-key-file", "%v", err)
			} else {
				add(OK, "--cluster-key-file", "%s: a valid key, mode %04o", f, fi.Mode().Perm())
			}
		}
	} else if (c.clustered() || c.DataAddr != "") && len(c.ClusterKey) == 0 && !c.Insecure {
		add(Fail, "--cluster-key-file", "no cluster key: anyone who reaches the gossip or data port could join and read the dataset; give --cluster-key-file (head -c 32 /dev/urandom | base64 > key; chmod 600 key), or --insecure on a network only trusted nodes reach")
	}
	if !c.clustered() {
		return out
	}
	cc := c.clusterConfig()
	ip, data, err := cluster.Addresses(cc)
	if err != nil {
		add(Fail, "addresses", "%v", err)
		return out
	}
	port := "the bound port"
	if _, p, err := net.SplitHostPort(cc.Bind); err == nil && p != "0" {
		port = p
	}
	msg := fmt.Sprintf("the other hosts reach this node's gossip at %s, port %s", ip, port)
	if data != "" {
		msg += ", and its data at " + data
	}
	add(OK, "addresses", "%s", msg)
	return out
}

// ReadKey reads a cluster key file: 16, 24 or 32 raw bytes, or their
// base64 (as "head -c 32 /dev/urandom | base64" writes).
func ReadKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--cluster-key-file: %w", bareErr(err))
	}
	switch len(b) {
	case 16, 24, 32:
		return b, nil
	}
	if k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b))); err == nil {
		switch len(k) {
		case 16, 24, 32:
			return k, nil
		}
	}
	return nil, fmt.Errorf("--cluster-key-file %s: want 16, 24 or 32 bytes, raw or base64; make one with: head -c 32 /dev/urandom | base64 > %s", path, path)
}

// checkFUSE checks the FUSE device, the mount helper, user_allow_other
// for allowOther, and the kernel's version.
func checkFUSE(h Host, allowOther bool) []Check {
	var out []Check
	add := func(level Level, what, format string, a ...any) {
		out = append(out, Check{level, what, fmt.Sprintf(format, a...)})
	}
	if fi, err := os.Stat(h.FUSEDev); err != nil {
		add(Fail, h.FUSEDev, "missing (%v): load the fuse module (modprobe fuse), or in a container pass the device in (--device /dev/fuse)", bareErr(err))
	} else if fi.Mode()&os.ModeCharDevice == 0 {
		add(Fail, h.FUSEDev, "not a character device (%v): recreate it with mknod %s c 10 229", fi.Mode(), h.FUSEDev)
	} else if f, err := os.OpenFile(h.FUSEDev, os.O_RDWR, 0); err != nil {
		add(Fail, h.FUSEDev, "cannot be opened read-write (%v): give this user access to it (mode 0666 is usual), or run as root", bareErr(err))
	} else {
		f.Close()
		add(OK, h.FUSEDev, "a character device, opened read-write")
	}

	// Root mounts directly; other users need fusermount3.
	if h.Root {
		add(OK, "mount", "running as root: dlfs mounts directly, no helper needed")
	} else if p, err := h.LookPath("fusermount3"); err != nil {
		add(Fail, "mount", "not root and no fusermount3 on PATH: install fuse3 (apt install fuse3), or run as root")
	} else {
		add(OK, "mount", "not root: %s mounts for this user", p)
	}

	if allowOther {
		switch {
		case h.Root:
			add(OK, "--allow-other", "root may let other users in without user_allow_other")
		case confHas(h.FUSEConf, "user_allow_other"):
			add(OK, "--allow-other", "%s has user_allow_other", h.FUSEConf)
		default:
			add(Fail, "--allow-other", "%s lacks user_allow_other, so this user cannot let others in: add that line (as root), or drop --allow-other", h.FUSEConf)
		}
	}

	// No-open (4.19) is what page-cached epochs rely on.
	if major, minor, ok := kernelVersion(h.Release); !ok {
		add(Warn, "kernel", "cannot read the version from %q; dlfs needs Linux 4.19 or newer", h.Release)
	} else if major < 4 || major == 4 && minor < 19 {
		add(Fail, "kernel", "Linux %d.%d: dlfs needs 4.19 or newer (FUSE no-open, so that cached files are read without a round trip); upgrade the kernel", major, minor)
	} else {
		add(OK, "kernel", "Linux %s", h.Release)
	}
	return out
}

// checkMemory weighs the RAM tier and the prefetcher's staging against
// the memory this host (or this process's cgroup) has in all, and has
// available now.
func (c *Config) checkMemory(h Host) []Check {
	total, avail, ok := memInfo(h.Meminfo)
	if !ok {
		return nil
	}
	bound := "this host has"
	for _, f := range h.MemoryMax {
		if lim, ok := memoryMax(f); ok && lim < total {
			total, avail, bound = lim, min(avail, lim), "this process's cgroup allows"
		}
	}
	ram := max(c.RAMCache, 0)
	staging := c.staging()
	switch {
	case ram > total:
		return []Check{{Fail, "--ram-cache", fmt.Sprintf("%s asked for, but %s %s in all: the tier could never be filled without the kernel killing the daemon; lower --ram-cache (to %s, say)",
			FormatBytes(ram), bound, FormatBytes(total), FormatBytes(total/2))}}
	case ram+staging > avail:
		return []Check{{Warn, "--ram-cache", fmt.Sprintf("%s asked for, and %s of --staging, but %s available now: filled, the tier will push other memory out or the daemon out of memory; lower --ram-cache",
			FormatBytes(ram), FormatBytes(staging), FormatBytes(avail))}}
	}
	return []Check{{OK, "--ram-cache", fmt.Sprintf("%s, and %s of --staging, of %s available", FormatBytes(ram), FormatBytes(staging), FormatBytes(avail))}}
}

// checkCacheDir checks the SSD tier's directory and size: the size is one
// the tier takes; the directory exists or can be made, is this user's to
// write, is not open to every user's writes, is no other mount's cache,
// and has room for size.
func checkCacheDir(dir string, size int64) []Check {
	const what = "--ssd-cache"
	fail := func(format string, a ...any) []Check { return []Check{{Fail, what, fmt.Sprintf(format, a...)}} }
	if size <= 0 {
		return []Check{{Fail, "--ssd-cache-size", fmt.Sprintf("%d: must be positive with --ssd-cache", size)}}
	}
	if err := ssdstore.CheckCapacity(size); err != nil {
		return []Check{{Fail, "--ssd-cache-size", fmt.Sprintf("%s is too small (%v): give at least %s", FormatBytes(size), err, FormatBytes(ssdstore.MinCapacity*4))}}
	}
	probe := dir
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		probe = filepath.Dir(dir) // the mount makes it
		if pfi, perr := os.Stat(probe); perr != nil || !pfi.IsDir() {
			return fail("%s does not exist, nor its parent: mkdir -p %s", dir, dir)
		}
	case err != nil:
		return fail("%s: %v", dir, bareErr(err))
	case !fi.IsDir():
		return fail("%s is not a directory: give a directory on the SSD", dir)
	}
	if unix.Access(probe, unix.W_OK|unix.X_OK) != nil {
		return fail("%s is not writable by this user: chown it to the user the daemon runs as", probe)
	}
	mode := ""
	if fi != nil {
		// The mount makes the directory 0700 and its files 0600: they
		// hold copies of files SOURCE may keep from other users. One
		// any user may write, though, may hold what another user put
		// there.
		if perm := fi.Mode().Perm(); perm&0o002 != 0 {
			return fail("%s is mode %04o: any user may write in it, and plant or link files the cache would then use; chmod 700 %s, or give a new directory", dir, perm, dir)
		} else if perm != 0o700 {
			mode = fmt.Sprintf(", mode %04o (the mount makes it 0700)", perm)
		}
		if locked, err := ssdstore.Locked(dir); err != nil {
			return fail("%v", err)
		} else if locked {
			return fail("%s: another dlfs is using this cache directory (it holds its lock): give each mount its own --ssd-cache, or stop the other first (fuser -v %s)", dir, filepath.Join(dir, "dlfs.lock"))
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(probe, &st); err != nil {
		return fail("%s: %v", probe, err)
	}
	free := int64(st.Bavail) * st.Bsize
	switch {
	case free < ssdstore.MinFree(size):
		return []Check{{Warn, what, fmt.Sprintf("%s has %s free, under the %s the SSD tier needs: the mount runs without it; free space, or move --ssd-cache", dir, FormatBytes(free), FormatBytes(ssdstore.MinFree(size)))}}
	case free < size:
		return []Check{{Warn, what, fmt.Sprintf("%s has %s free, less than --ssd-cache-size %s: the tier will fill the disk first; lower --ssd-cache-size", dir, FormatBytes(free), FormatBytes(size))}}
	}
	return []Check{{OK, what, fmt.Sprintf("%s: writable, private, %s free for %s%s", dir, FormatBytes(free), FormatBytes(size), mode)}}
}

// checkMountpoint checks that a mount can be made at c.Mountpoint, and
// makes it absolute.
func (c *Config) checkMountpoint() Check {
	const what = "MOUNTPOINT"
	if abs, err := filepath.Abs(c.Mountpoint); err == nil {
		c.Mountpoint = abs
	}
	mp := c.Mountpoint
	fail := func(format string, a ...any) Check { return Check{Fail, what, fmt.Sprintf(format, a...)} }
	var st unix.Stat_t
	// A dead FUSE mount may still answer stat from the kernel's attribute
	// cache (with default_permissions); statfs always asks the daemon.
	var sfs unix.Statfs_t
	err := unix.Statfs(mp, &sfs)
	if err == nil {
		err = unix.Stat(mp, &st)
	}
	switch {
	case errors.Is(err, unix.ENOTCONN):
		return Check{Warn, what, fmt.Sprintf("%s is a dead mount (transport endpoint is not connected): its daemon died; dlfs mount clears it (or run dlfs umount %s)", mp, mp)}
	case errors.Is(err, unix.ENOENT):
		return fail("%s: no such file or directory; create it: mkdir -p %s", mp, mp)
	case err != nil:
		if d := fusefs.Diagnose(mp, err); d != nil {
			return Check{Fail, what, d.Error()}
		}
		return fail("%s: %v", mp, err)
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fail("%s is not a directory", mp)
	}
	var parent unix.Stat_t
	if err := unix.Stat(filepath.Join(mp, ".."), &parent); err == nil && (parent.Dev != st.Dev || parent.Ino == st.Ino) {
		if m, ok := fusefs.MountAt(mp); ok && strings.HasPrefix(m.Source, "dlfs:") {
			return fail("%s is busy: a live dlfs mount of %s is there; unmount it first (dlfs umount %s), or pick another directory", mp, strings.TrimPrefix(m.Source, "dlfs:"), mp)
		}
		return fail("%s is busy: something is already mounted there; unmount it or pick another directory", mp)
	}
	d, err := os.Open(mp)
	if err != nil {
		return fail("%s cannot be listed (%v): the mount point must be this user's", mp, bareErr(err))
	}
	names, _ := d.Readdirnames(3)
	d.Close()
	switch {
	case len(names) > 0 && !c.AllowNonEmpty:
		return fail("%s is not empty (it holds %s): the mount would hide what is there; empty it, pick an empty directory, or give --allow-non-empty", mp, strings.Join(names, ", "))
	case len(names) > 0:
		return Check{OK, what, fmt.Sprintf("%s is not empty (it holds %s): the mount hides what is there (--allow-non-empty)", mp, strings.Join(names, ", "))}
	}
	return Check{OK, what, fmt.Sprintf("%s is an empty directory", mp)}
}

// checkSource checks that SOURCE is a directory this user may list and
// makes it canonical: absolute, with no links. A SOURCE that does not
// answer within the PFS timeout fails it.
func (c *Config) checkSource() []Check {
	if c.Source == "" {
		return nil
	}
	timeout := c.PFSTimeout
	if timeout <= 0 {
		timeout = loader.DefaultConfig().PFSTimeout
	}
	type result struct {
		canon string
		check Check
	}
	done := make(chan result, 1)
	src := c.Source
	// A PFS that stopped answering holds the stat for ever, deaf to
	// signals: the goroutine is left to it (it ends if the PFS answers, or
	// with the process).
	go func() {
		canon, ch := checkSourceDir(src)
		done <- result{canon, ch}
	}()
	select {
	case r := <-done:
		if r.check.Level != Fail {
			c.Source = r.canon
			if c.Mountpoint != "" {
				if ch, ok := checkNesting(r.canon, c.Mountpoint); !ok {
					return []Check{ch}
				}
			}
		}
		return []Check{r.check}
	case <-time.After(timeout):
		return []Check{{Fail, "SOURCE", fmt.Sprintf("%s did not answer within %s (--pfs-timeout): its filesystem has stopped answering; check it (a hard NFS mount whose server is gone, a Lustre OST in recovery)", src, timeout)}}
	}
}

func checkSourceDir(src string) (string, Check) {
	fail := func(format string, a ...any) (string, Check) {
		return "", Check{Fail, "SOURCE", fmt.Sprintf(format, a...)}
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return fail("%s: %v", src, err)
	}
	canon, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return fail("%s: %v; give the dataset's directory", src, bareErr(err))
	}
	fi, err := os.Stat(canon)
	if err != nil {
		return fail("%s: %v; give the dataset's directory", src, bareErr(err))
	}
	if !fi.IsDir() {
		return fail("%s is not a directory: give the dataset's directory", src)
	}
	d, err := os.Open(canon)
	if err != nil {
		return fail("%s cannot be listed (%v): the daemon runs as this user and must read the dataset", src, bareErr(err))
	}
	d.Close()
	if canon != src {
		return canon, Check{OK, "SOURCE", fmt.Sprintf("%s (%s) is a readable directory", canon, src)}
	}
	return canon, Check{OK, "SOURCE", fmt.Sprintf("%s is a readable directory", canon)}
}

// checkNesting fails a SOURCE (canonical) that holds MOUNTPOINT, or lies
// inside it, links resolved: the scan would walk into the mount itself (a
// listing of the mount waits on the scan that asked for it), or the mount
// would hide SOURCE from the daemon that serves it.
func checkNesting(src, mountpoint string) (Check, bool) {
	mp := mountpoint
	if canon, err := filepath.EvalSymlinks(mp); err == nil {
		mp = canon
	}
	fail := func(format string, a ...any) (Check, bool) {
		return Check{Fail, "SOURCE", fmt.Sprintf(format, a...)}, false
	}
	switch {
	case src == mp:
		return fail("%s is MOUNTPOINT too: the mount would hide the dataset it serves; mount it somewhere else", src)
	case within(mp, src):
		return fail("%s holds MOUNTPOINT %s: the scan would read the mount itself; pick a MOUNTPOINT outside SOURCE", src, mp)
	case within(src, mp):
		return fail("%s lies inside MOUNTPOINT %s: the mount would hide the dataset it serves; pick a MOUNTPOINT outside SOURCE", src, mp)
	}
	return Check{}, true
}

// within reports whether path lies below dir (both clean and absolute).
func within(path, dir string) bool {
	return dir == "/" && path != "/" || strings.HasPrefix(path, dir+"/")
}

// confHas reports whether a fuse.conf has option set on a line of its own.
func confHas(path, option string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == option {
			return true
		}
	}
	return false
}

// kernelVersion reads "6.1.0-28-amd64" as 6, 1.
func kernelVersion(release string) (major, minor int, ok bool) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minorStr := parts[1]
	if i := strings.IndexFunc(minorStr, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minorStr = minorStr[:i]
	}
	minor, err2 := strconv.Atoi(minorStr)
	return major, minor, err1 == nil && err2 == nil
}

// memInfo reads MemTotal and MemAvailable from a meminfo file, in bytes.
func memInfo(path string) (total, avail int64, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, false
	}
	var seen int
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "MemTotal:":
			total, seen = kb<<10, seen+1
		case "MemAvailable:":
			avail, seen = kb<<10, seen+1
		}
	}
	return total, avail, seen == 2
}

// memoryMax reads a cgroup's memory.max: a number of bytes, or "max".
func memoryMax(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}

// FormatBytes writes a byte count in binary units: 512 B, 1.5 KiB,
// 4.0 GiB.
func FormatBytes(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	f, i := float64(n), 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.1f %s", f, units[i])
}

// bareErr returns the errno inside err, if any: the path or address is
// already in the message.
func bareErr(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return err
}

func portOf(addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return ":" + p
}
