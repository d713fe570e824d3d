package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

// doctorOptions are the mount flags doctor checks, under their mount
// names.
type doctorOptions struct {
	allowOther   bool
	ramCache     sizeValue
	ssdCache     string
	ssdCacheSize sizeValue
	keyFile      string
	insecure     bool
	bind         string
	advertise    string
	join         []string
	dataAddr     string
	metricsAddr  string
	controlName  string
}

// check is one line of doctor's report.
type check struct {
	level  string // "ok", "warn" or "FAIL"
	what   string
	detail string // what was found, and what to do
}

// doctorEnv is what the checks read from the machine; tests replace it.
type doctorEnv struct {
	fuseDev   string // /dev/fuse
	fuseConf  string // /etc/fuse.conf
	meminfo   string // /proc/meminfo
	root      bool
	release   string // the kernel's, as uname -r gives it
	lookPath  func(string) (string, error)
	listenTCP func(addr string) error
	listenUDP func(addr string) error
	dialTCP   func(addr string) error
}

func hostEnv() doctorEnv {
	var u unix.Utsname
	_ = unix.Uname(&u)
	return doctorEnv{
		fuseDev: "/dev/fuse", fuseConf: "/etc/fuse.conf", meminfo: "/proc/meminfo", root: os.Geteuid() == 0,
		release: unix.ByteSliceToString(u.Release[:]), lookPath: exec.LookPath,
		listenTCP: func(addr string) error {
			l, err := net.Listen("tcp", addr)
			if err == nil {
				l.Close()
			}
			return err
		},
		listenUDP: func(addr string) error {
			c, err := net.ListenPacket("udp", addr)
			if err == nil {
				c.Close()
			}
			return err
		},
		dialTCP: func(addr string) error {
			c, err := net.DialTimeout("tcp", addr, dialTimeout)
			if err == nil {
				c.Close()
			}
			return err
		},
	}
}

func newDoctorCmd() *cobra.Command {
	// doctor takes every mount flag, so that it can be given the same
	// command line; it checks those below.
	mount := newMountCmd(runMount)
	cmd := &cobra.Command{
		Use:   "doctor [MOUNT FLAGS] [SOURCE [MOUNTPOINT]]",
		Short: "Check that this machine can run a mount with these flags, one line per check",
		Long: `doctor checks what a mount needs before it is tried: /dev/fuse, the mount
helper, user_allow_other for --allow-other, the kernel's version, memory
for --ram-cache, the --ssd-cache directory's mode and free space, the
--cluster-key-file's mode and contents, that --bind, --data-addr and
--metrics-addr are free, the addresses the other hosts would be given,
that --join answers, and SOURCE and MOUNTPOINT when given; for a
MOUNTPOINT that is a live dlfs mount, that every member's data address
answers. It takes
every flag dlfs mount takes: give it the mount's command line. Each line
says ok, warn or FAIL, and what to do; it exits 1 if any check fails.`,
		Args: cobra.MaximumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := cmd.Flags()
			var o doctorOptions
			o.allowOther, _ = f.GetBool("allow-other")
			o.insecure, _ = f.GetBool("insecure")
			o.ssdCache, _ = f.GetString("ssd-cache")
			o.keyFile, _ = f.GetString("cluster-key-file")
			o.bind, _ = f.GetString("bind")
			o.advertise, _ = f.GetString("advertise")
			o.join, _ = f.GetStringSlice("join")
			o.dataAddr, _ = f.GetString("data-addr")
			o.metricsAddr, _ = f.GetString("metrics-addr")
			o.controlName, _ = f.GetString("control-name")
			if len(o.join) > 0 && o.bind == "" {
				o.bind = "0.0.0.0:7946" // as mount defaults it
			}
			o.ramCache = *f.Lookup("ram-cache").Value.(*sizeValue)
			o.ssdCacheSize = *f.Lookup("ssd-cache-size").Value.(*sizeValue)
			failed := printChecks(cmd.OutOrStdout(), runDoctor(hostEnv(), o, args))
			switch {
			case failed == 1:
				return errors.New("1 check failed")
			case failed > 1:
				return fmt.Errorf("%d checks failed", failed)
			}
			return nil
		},
	}
	cmd.Flags().AddFlagSet(mount.Flags())
	return cmd
}

// printChecks writes one line per check and returns how many failed.
func printChecks(w io.Writer, checks []check) int {
	failed := 0
	for _, c := range checks {
		fmt.Fprintf(w, "%-4s  %s: %s\n", c.level, c.what, c.detail)
		if c.level == "FAIL" {
			failed++
		}
	}
	return failed
}

func runDoctor(env doctorEnv, o doctorOptions, args []string) []check {
	var out []check
	add := func(level, what, format string, a ...any) {
		out = append(out, check{level, what, fmt.Sprintf(format, a...)})
	}

	// /dev/fuse
	if fi, err := os.Stat(env.fuseDev); err != nil {
		add("FAIL", env.fuseDev, "missing (%v): load the fuse module (modprobe fuse), or in a container pass the device in (--device /dev/fuse)", unwrapPath(err))
	} else if fi.Mode()&os.ModeCharDevice == 0 {
		add("FAIL", env.fuseDev, "not a character device (%v): recreate it with mknod %s c 10 229", fi.Mode(), env.fuseDev)
	} else if f, err := os.OpenFile(env.fuseDev, os.O_RDWR, 0); err != nil {
		add("FAIL", env.fuseDev, "cannot be opened read-write (%v): give this user access to it (mode 0666 is usual), or run as root", unwrapPath(err))
	} else {
		f.Close()
		add("ok", env.fuseDev, "a character device, opened read-write")
	}

	// The mount helper: root mounts directly; other users need fusermount3.
	if env.root {
		add("ok", "mount", "running as root: dlfs mounts directly, no helper needed")
	} else if p, err := env.lookPath("fusermount3"); err != nil {
		add("FAIL", "mount", "not root and no fusermount3 on PATH: install fuse3 (apt install fuse3), or run as root")
	} else {
		add("ok", "mount", "not root: %s mounts for this user", p)
	}

	// --allow-other
	if o.allowOther {
		switch {
		case env.root:
			add("ok", "--allow-other", "root may let other users in without user_allow_other")
		case confHas(env.fuseConf, "user_allow_other"):
			add("ok", "--allow-other", "%s has user_allow_other", env.fuseConf)
		default:
			add("FAIL", "--allow-other", "%s lacks user_allow_other, so this user cannot let others in: add that line (as root), or drop --allow-other", env.fuseConf)
		}
	}

	// The kernel: no-open (4.19) is what page-cached epochs rely on.
	if major, minor, ok := kernelVersion(env.release); !ok {
		add("warn", "kernel", "cannot read the version from %q; dlfs needs Linux 4.19 or newer", env.release)
	} else if major < 4 || major == 4 && minor < 19 {
		add("FAIL", "kernel", "Linux %d.%d: dlfs needs 4.19 or newer (FUSE no-open, so that cached files are read without a round trip); upgrade the kernel", major, minor)
	} else {
		add("ok", "kernel", "Linux %s", env.release)
	}

	// Memory for the RAM tier.
	if avail, ok := memAvailable(env.meminfo); ok {
		ram := int64(o.ramCache)
		switch {
		case ram > avail:
			add("warn", "--ram-cache", "%s asked for, %s available now: the tier will push other memory out or be cut short; lower --ram-cache", human(ram), human(avail))
		default:
			add("ok", "--ram-cache", "%s of %s available", human(ram), human(avail))
		}
	}

	// The SSD cache directory.
	if o.ssdCache != "" {
		out = append(out, checkCacheDir(o.ssdCache, int64(o.ssdCacheSize))...)
	}

	// The cluster key file.
	if o.keyFile != "" {
		fi, err := os.Stat(o.keyFile)
		switch {
		case err != nil:
			add("FAIL", "--cluster-key-file", "%s: %v; make one with: head -c 32 /dev/urandom | base64 > %s; chmod 600 %s", o.keyFile, unwrapPath(err), o.keyFile, o.keyFile)
		case fi.Mode().Perm()&0o077 != 0:
			add("FAIL", "--cluster-key-file", "%s is mode %04o: others may read the key that guards the cluster; chmod 600 %s", o.keyFile, fi.Mode().Perm(), o.keyFile)
		default:
			if _, err := readKey(o.keyFile); err != nil {
				add("FAIL", "--cluster-key-file", "%v", err)
			} else {
				add("ok", "--cluster-key-file", "%s: a valid key, mode %04o", o.keyFile, fi.Mode().Perm())
			}
		}
	} else if (o.bind != "" || o.dataAddr != "") && !o.insecure {
		add("FAIL", "--cluster-key-file", "--bind and --data-addr need a cluster key (or --insecure on a network only trusted nodes reach): head -c 32 /dev/urandom | base64 > key; chmod 600 key")
	}

	// The ports: gossip takes TCP and UDP, the data port and metrics TCP.
	for _, p := range []struct {
		flag, addr string
		udp        bool
	}{{"--bind", o.bind, true}, {"--data-addr", o.dataAddr, false}, {"--metrics-addr", o.metricsAddr, false}} {
		if p.addr == "" {
			continue
		}
		err := env.listenTCP(p.addr)
		if err == nil && p.udp {
			err = env.listenUDP(p.addr)
		}
		if err != nil {
			add("FAIL", p.flag, "%s cannot be listened on (%v): another process holds it (ss -ltnup | grep %s), or the address is not this host's", p.addr, unwrapNet(err), portOf(p.addr))
		} else {
			add("ok", p.flag, "%s is free", p.addr)
		}
	}

	// What the other hosts would be given, and who answers.
	out = append(out, checkAddresses(o)...)
	out = append(out, checkJoin(env, o.join)...)

	// SOURCE and MOUNTPOINT, when given.
	if len(args) >= 1 {
		src := args[0]
		if fi, err := os.Stat(src); err != nil || !fi.IsDir() {
			add("FAIL", "SOURCE", "%s is not a directory (%v): give the dataset's directory", src, errOr(err, "a file"))
		} else if d, err := os.Open(src); err != nil {
			add("FAIL", "SOURCE", "%s cannot be listed (%v): the daemon runs as this user and must read the dataset", src, unwrapPath(err))
		} else {
			d.Close()
			add("ok", "SOURCE", "%s is a readable directory", src)
		}
	}
	if len(args) == 2 {
		mnt := args[1]
		ents, err := os.ReadDir(mnt)
		var st unix.Statfs_t
		switch {
		case err != nil:
			add("FAIL", "MOUNTPOINT", "%s: %v; create it: mkdir -p %s", mnt, unwrapPath(err), mnt)
		case unix.Statfs(mnt, &st) == nil && st.Type == unix.FUSE_SUPER_MAGIC:
			add("FAIL", "MOUNTPOINT", "%s is a FUSE mount already: unmount it first (dlfs umount %s)", mnt, mnt)
			out = append(out, checkLiveMembers(env, mnt, o.controlName)...) // a live dlfs: can it reach its peers?
		case len(ents) > 0:
			add("warn", "MOUNTPOINT", "%s is not empty: the mount will hide its %d entries", mnt, len(ents))
		default:
			add("ok", "MOUNTPOINT", "%s is an empty directory", mnt)
		}
	}
	return out
}

// checkCacheDir checks the SSD tier's directory: it exists or can be made,
// is this user's to write, not open to others, with room for size.
func checkCacheDir(dir string, size int64) []check {
	what := "--ssd-cache"
	probe := dir
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		probe = filepath.Dir(dir) // the mount makes it
		if pfi, perr := os.Stat(probe); perr != nil || !pfi.IsDir() {
			return []check{{"FAIL", what, fmt.Sprintf("%s does not exist, nor its parent: mkdir -p %s", dir, dir)}}
		}
	case err != nil:
		return []check{{"FAIL", what, fmt.Sprintf("%s: %v", dir, unwrapPath(err))}}
	case !fi.IsDir():
		return []check{{"FAIL", what, fmt.Sprintf("%s is not a directory: give a directory on the SSD", dir)}}
	}
	var out []check
	if unix.Access(probe, unix.W_OK|unix.X_OK) != nil {
		out = append(out, check{"FAIL", what, fmt.Sprintf("%s is not writable by this user: chown it to the user the daemon runs as", probe)})
	}
	if fi != nil && fi.Mode().Perm()&0o007 != 0 {
		out = append(out, check{"FAIL", what, fmt.Sprintf("%s is mode %04o: other users could read the cached copies of files SOURCE may keep from them; chmod 700 %s", dir, fi.Mode().Perm(), dir)})
	}
	var st unix.Statfs_t
	if err := unix.Statfs(probe, &st); err == nil {
		free := int64(st.Bavail) * st.Bsize
		if free < size {
			out = append(out, check{"warn", what, fmt.Sprintf("%s has %s free, less than --ssd-cache-size %s: the tier will fill the disk first; lower --ssd-cache-size", dir, human(free), human(size))})
		} else if len(out) == 0 {
			out = append(out, check{"ok", what, fmt.Sprintf("%s: writable, private, %s free for %s", dir, human(free), human(size))})
		}
	}
	return out
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

// memAvailable reads MemAvailable from a meminfo file, in bytes.
func memAvailable(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

func unwrapNet(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		var se *os.SyscallError
		if errors.As(oe.Err, &se) {
			return se.Err
		}
		return oe.Err
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

func errOr(err error, s string) any {
	if err != nil {
		return unwrapPath(err)
	}
	return s
}
