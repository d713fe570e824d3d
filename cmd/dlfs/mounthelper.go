package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
)

// The mount helper: run as /sbin/mount.fuse.dlfs (or mount.dlfs), a link
// to this binary, it lets mount(8) and /etc/fstab mount dlfs:
//
//	mount -t fuse.dlfs -o ram-cache=64GiB,allow_other /mnt/pfs/imagenet /mnt/dlfs/imagenet
//	/mnt/pfs/imagenet  /mnt/dlfs/imagenet  fuse.dlfs  ram-cache=64GiB,allow_other,_netdev  0 0
//
// mount(8) runs it as "mount.fuse.dlfs SPEC DIR [-sfnv] [-N NS] [-o OPTS]"
// and waits for it. It turns each option into a "dlfs mount" flag
// (allow_other is --allow-other, ram-cache=64GiB is --ram-cache=64GiB; a
// list flag such as join is given once per item; config=FILE names a
// config file of them), leaves out the options
// that are mount(8)'s and the kernel's own (rw, noatime, _netdev, nofail,
// ...), and starts "dlfs mount" in its own session with its output
// appended to a log file (the option log=PATH; /var/log/dlfs.log for
// root, ~/.dlfs/dlfs.log for others). It returns once the daemon says
// the mount is usable (READY=1 on a socket of its own, as systemd's
// readiness protocol goes: notify.go), or fails with the log's last lines
// if the daemon exits first. Unmounting (umount DIR, or a systemd mount
// unit stopping) makes the daemon exit.

// helperNames are the names under which this binary is the mount helper.
var helperNames = map[string]bool{"mount.fuse.dlfs": true, "mount.dlfs": true}

// mount(8)'s exit codes (mount(8), RETURN CODES).
const (
	mountUsage   = 1
	mountFailure = 32
)

func init() {
	if name := filepath.Base(os.Args[0]); helperNames[name] {
		os.Exit(mountHelper(name, os.Args[1:], os.Stdout, os.Stderr))
	}
}

// helperCall is one run of the mount helper, parsed.
type helperCall struct {
	args    []string // "dlfs mount"'s arguments: flags, SOURCE, MOUNTPOINT
	log     string   // where the daemon's output goes
	fake    bool     // -f: do everything but mount
	verbose bool     // -v: say what runs
}

// ignoredOptions are mount options that are mount(8)'s or systemd's
// business, or kernel flags that dlfs's mount (read-only, no devices, no
// set-uid) implies or has no use for; mount(8) passes some of them on.
var ignoredOptions = map[string]bool{
	"rw": true, "ro": true, "defaults": true, "auto": true, "noauto": true,
	"user": true, "nouser": true, "users": true, "owner": true, "group": true,
	"_netdev": true, "nofail": true, "sync": true, "async": true, "dirsync": true,
	"atime": true, "noatime": true, "relatime": true, "norelatime": true, "strictatime": true,
	"diratime": true, "nodiratime": true, "lazytime": true, "nolazytime": true,
	"exec": true, "noexec": true, "suid": true, "nosuid": true, "dev": true, "nodev": true,
	"silent": true, "loud": true,
}

// helperOnly are the options the helper takes itself (option -> what it
// holds).
var helperOnly = map[string]string{"log": "PATH"}

// parseHelperArgs parses mount(8)'s call of a helper into "dlfs mount"
// arguments, checking every option against flags (mount's flags). home is
// where a user other than root keeps the log.
func parseHelperArgs(argv []string, flags *pflag.FlagSet, root bool, home string) (helperCall, error) {
	var c helperCall
	var pos, opts []string
	for i := 0; i < len(argv); i++ {
		a := argv[i]
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		for j := 1; j < len(a); j++ {
			switch a[j] {
			case 's', 'n', 'r', 'w': // sloppy, no mtab, and read-only or not: dlfs is read-only
			case 'f':
				c.fake = true
			case 'v':
				c.verbose = true
			case 'o', 't', 'N':
				v := a[j+1:]
				if v == "" {
					if i+1 >= len(argv) {
						return c, fmt.Errorf("-%c needs a value", a[j])
					}
					i++
					v = argv[i]
				}
				if a[j] == 'o' {
					opts = append(opts, strings.Split(v, ",")...)
				} else if a[j] == 'N' {
					return c, fmt.Errorf("-N %s: mounting into another namespace is not supported; run the mount there", v)
				}
				j = len(a)
			default:
				return c, fmt.Errorf("unknown option -%c (usage: SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS])", a[j])
			}
		}
	}
	if len(pos) != 2 {
		return c, fmt.Errorf("want SOURCE and MOUNTPOINT, got %q (usage: SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS])", pos)
	}
	for _, o := range opts {
		key, val, hasVal := strings.Cut(o, "=")
		switch {
		case key == "" || ignoredOptions[key] || strings.HasPrefix(key, "x-") || key == "comment":
			continue
		case helperOnly[key] != "":
			if !hasVal || val == "" {
				return c, fmt.Errorf("option %s: want %s=%s", key, key, helperOnly[key])
			}
			c.log = val
			continue
		}
		name := strings.ReplaceAll(key, "_", "-") // fuse's allow_other is --allow-other
		fl := flags.Lookup(name)
		switch {
		case fl == nil || fl.Hidden || name == "help":
			return c, fmt.Errorf("option %q: dlfs mount has no flag --%s (see dlfs mount --help)", o, name)
		case !hasVal && fl.NoOptDefVal == "":
			return c, fmt.Errorf("option %q: --%s needs a value: %s=VALUE", o, name, key)
		case hasVal:
			c.args = append(c.args, "--"+name+"="+val)
		default:
			c.args = append(c.args, "--"+name)
		}
	}
	// dlfs keys its saved catalog by SOURCE's path: make both absolute,
	// as mount(8) leaves SPEC as written.
	for i, p := range pos {
		abs, err := filepath.Abs(p)
		if err != nil {
			return c, err
		}
		pos[i] = abs
	}
	c.args = append(append([]string{"mount"}, c.args...), pos...)
	if c.log == "" {
		c.log = "/var/log/dlfs.log"
		if !root {
			c.log = filepath.Join(home, ".dlfs", "dlfs.log")
		}
	}
	return c, nil
}

// helperFlags are the flags an option may name: dlfs mount's own and the
// root's (--config).
func helperFlags() *pflag.FlagSet {
	root := newRootCmd()
	fs := pflag.NewFlagSet("mount", pflag.ContinueOnError)
	fs.AddFlagSet(root.PersistentFlags())
	if mount, _, err := root.Find([]string{"mount"}); err == nil {
		fs.AddFlagSet(mount.Flags())
	}
	return fs
}

// mountHelper runs the helper named name with mount(8)'s arguments and
// returns its exit code.
func mountHelper(name string, argv []string, stdout, stderr io.Writer) int {
	home, _ := os.UserHomeDir()
	c, err := parseHelperArgs(argv, helperFlags(), os.Getuid() == 0, home)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", name, printable(err.Error()))
		return mountUsage
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", name, printable(err.Error()))
		return mountFailure
	}
	if c.verbose || c.fake {
		fmt.Fprintf(stdout, "%s: %s %s >> %s\n", name, printable(exe), strings.Join(printables(c.args), " "), printable(c.log))
	}
	if c.fake {
		return 0
	}
	if err := startDaemon(exe, c); err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", name, printable(err.Error()))
		return mountFailure
	}
	return 0
}

// startDaemon starts "dlfs mount" (exe) in a session of its own, its
// output appended to c.log, and waits until it says the mount is usable
// or exits.
func startDaemon(exe string, c helperCall) error {
	if err := os.MkdirAll(filepath.Dir(c.log), 0o755); err != nil {
		return fmt.Errorf("log %s: %w (give another with -o log=PATH)", c.log, unwrapPath(err))
	}
	logf, err := os.OpenFile(c.log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("log %s: %w (give another with -o log=PATH)", c.log, unwrapPath(err))
	}
	defer logf.Close()
	from, err := logf.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("log %s: %w", c.log, err)
	}
	dir, err := os.MkdirTemp("", "dlfs-mount-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "notify")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("readiness socket: %w", err)
	}
	defer ln.Close()

	cmd := exec.Command(exe, c.args...)
	cmd.Env = append(os.Environ(), notifySocketEnv+"="+sock)
	if os.Getenv("PATH") == "" { // mount(8) may run helpers without one
		cmd.Env = append(cmd.Env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // outlives mount(8) and its terminal
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start dlfs mount: %w", err)
	}
	// Both goroutines end when this process does, which it does at once
	// after either answers; the reader also ends when ln is closed.
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	ready := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := ln.Read(buf)
			if err != nil {
				return
			}
			for _, l := range strings.Split(string(buf[:n]), "\n") {
				if l == "READY=1" {
					close(ready)
					return
				}
			}
		}
	}()
	select {
	case <-ready:
		return nil
	case err := <-exited:
		if err == nil {
			err = errors.New("exit status 0")
		}
		return fmt.Errorf("dlfs mount %s exited (%v) before the mount was usable; the end of %s:\n%s",
			strings.Join(c.args[1:], " "), err, c.log, logTail(c.log, from, 20))
	}
}

// logTail returns the last n lines of the file at path written past
// offset from.
func logTail(path string, from int64, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	from = max(from, fi.Size()-64<<10) // n lines fit in far less
	b, err := io.ReadAll(io.NewSectionReader(f, from, fi.Size()-from))
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
