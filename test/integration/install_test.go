package integration

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The install paths of docs/install.md, each run as an operator would:
// the static build, the container file, the mount helper under mount(8)
// and fstab, and the systemd unit's whole life.

const repo = "../.."

// writeTree makes a small dataset in a new directory: name -> bytes.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func mustRead(t *testing.T, path, want string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != want {
		t.Fatalf("%s holds %q, want %q", path, b, want)
	}
}

// TestStaticBuild: make static builds a binary with no interpreter and
// no shared libraries, which runs --help and mounts a directory; given a
// SOURCE of HDF5 files it exits 1 with one line naming the build.
func TestStaticBuild(t *testing.T) {
	static := filepath.Join(t.TempDir(), "dlfs-static")
	if out, err := exec.Command("make", "-s", "-C", repo, "static", "STATIC="+static).CombinedOutput(); err != nil {
		t.Fatalf("make static: %v\n%s", err, out)
	}
	f, err := elf.Open(static)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s has a %v program header: not static", static, p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s needs %v", static, libs)
	}
	f.Close()
	if out, err := exec.Command(static, "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "dlfs mounts a dataset directory") {
		t.Errorf("%s --help: %v\n%s", static, err, out)
	}

	src := writeTree(t, map[string]string{"a/x.txt": "hello"})
	mnt := t.TempDir()
	p := startMount(t, static, mnt, "mount", src, mnt)
	mustRead(t, filepath.Join(mnt, "a/x.txt"), "hello")
	p.stop(t)

	h5, err := os.ReadFile(filepath.Join(repo, "packed/testdata/small.h5"))
	if err != nil {
		t.Fatal(err)
	}
	h5src := writeTree(t, map[string]string{"train.h5": string(h5)})
	var stderr bytes.Buffer
	cmd := exec.Command(static, "mount", h5src, t.TempDir())
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("the static dlfs mounted a SOURCE of HDF5 files: %v\n%s", err, &stderr)
	}
	var hits []string
	for _, l := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(l, "HDF5") {
			hits = append(hits, l)
		}
	}
	if len(hits) != 1 || !strings.Contains(hits[0], "built without HDF5") || !strings.Contains(hits[0], "train.h5") {
		t.Errorf("want one line naming the file and the build, got:\n%s", &stderr)
	}
}

// dockerLine is one instruction of a Dockerfile: its keyword, upper case,
// and the rest, continuation lines joined.
type dockerLine struct{ cmd, rest string }

func parseDockerfile(b []byte) []dockerLine {
	var out []dockerLine
	cur := ""
	for _, l := range strings.Split(string(b), "\n") {
		t := strings.TrimSpace(l)
		if cur == "" && (t == "" || strings.HasPrefix(t, "#")) {
			continue
		}
		if strings.HasSuffix(t, "\\") {
			cur += strings.TrimSuffix(t, "\\") + " "
			continue
		}
		cur += t
		cmd, rest, _ := strings.Cut(cur, " ")
		out = append(out, dockerLine{strings.ToUpper(cmd), strings.Join(strings.Fields(rest), " ")})
		cur = ""
	}
	return out
}

// TestDockerfile checks the container file without a container engine:
// it lints clean (dockerfile-utils); its build stage runs a make target
// that builds bin/dlfs; its image holds that binary where the DaemonSet
// runs it, as its entry point; its runtime installs fuse3 and, on this
// Debian release, the packages of every HDF5 library the binary built
// here links.
func TestDockerfile(t *testing.T) {
	path := filepath.Join(repo, "Dockerfile")
	if out, err := exec.Command("dockerfile-utils", "lint", path).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("dockerfile-utils lint (make deps installs it): %v\n%s", err, out)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]string{} // ARG defaults
	var stages [][]dockerLine
	for _, l := range parseDockerfile(b) {
		if l.cmd == "ARG" {
			k, v, _ := strings.Cut(l.rest, "=")
			if _, ok := args[k]; !ok {
				args[k] = strings.Trim(v, `"`)
			}
		}
		if l.cmd == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) > 0 {
			stages[len(stages)-1] = append(stages[len(stages)-1], l)
		}
	}
	expand := func(s string) string {
		return regexp.MustCompile(`\$\{(\w+)\}`).ReplaceAllStringFunc(s, func(m string) string { return args[m[2:len(m)-1]] })
	}
	if len(stages) != 2 {
		t.Fatalf("want a build stage and the image, got %d stages", len(stages))
	}
	build, image := stages[0], stages[1]
	if !strings.HasSuffix(build[0].rest, " AS build") {
		t.Errorf("the first stage is not named build: FROM %s", build[0].rest)
	}
	workdir, target := "", ""
	for _, l := range build {
		if l.cmd == "WORKDIR" {
			workdir = l.rest
		}
		if m := regexp.MustCompile(`^make (\w+)$`).FindStringSubmatch(l.rest); l.cmd == "RUN" && m != nil {
			target = m[1]
		}
	}
	if target == "" {
		t.Fatal("the build stage runs no make target")
	}
	out, err := exec.Command("make", "-n", "-C", repo, target).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "build -o bin/dlfs ./cmd/dlfs") {
		t.Fatalf("make %s does not build bin/dlfs: %v\n%s", target, err, out)
	}
	ds, err := os.ReadFile(filepath.Join(repo, "deploy/kubernetes/daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`command: \["([^"]+)"\]`).FindSubmatch(ds)
	if m == nil {
		t.Fatal("the DaemonSet names no command")
	}
	runs := string(m[1])
	var copied, entry, installs string
	for _, l := range image {
		switch l.cmd {
		case "COPY":
			copied = l.rest
		case "ENTRYPOINT":
			entry = l.rest
		case "RUN":
			installs += expand(l.rest) + " "
		}
	}
	if want := "--from=build " + filepath.Join(workdir, "bin/dlfs") + " " + runs; copied != want {
		t.Errorf("the image copies %q, want %q (the DaemonSet runs %s)", copied, want, runs)
	}
	if want := `["` + runs + `"]`; entry != want {
		t.Errorf("ENTRYPOINT %s, want %s", entry, want)
	}
	pkgs := map[string]bool{}
	for _, w := range strings.Fields(installs) {
		pkgs[w] = true
	}
	if !pkgs["fuse3"] {
		t.Errorf("the image installs no fuse3: %s", installs)
	}
	osr, _ := os.ReadFile("/etc/os-release")
	if !strings.Contains(string(osr), "VERSION_CODENAME="+args["DEBIAN"]+"\n") {
		t.Logf("this machine is not Debian %s: the HDF5 packages are not checked", args["DEBIAN"])
		return
	}
	ldd, err := exec.Command("ldd", bin.dlfs).Output()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range regexp.MustCompile(`(libhdf5\S*\.so\S*) =>`).FindAllStringSubmatch(string(ldd), -1) {
		who, err := exec.Command("dpkg", "-S", "*/"+m[1]).Output()
		if err != nil {
			t.Fatalf("dpkg -S %s: %v", m[1], err)
		}
		pkg, _, _ := strings.Cut(string(who), ":")
		if n++; !pkgs[pkg] {
			t.Errorf("dlfs links %s, of %s, which the image does not install: %s", m[1], pkg, installs)
		}
	}
	if n == 0 {
		t.Errorf("dlfs links no HDF5 library:\n%s", ldd)
	}
}

// daemonsAt returns the pids of the dlfs daemons serving mnt, by their
// command lines (the mount helper leaves them in sessions of their own).
func daemonsAt(mnt string) []int {
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) > 2 && filepath.Base(args[0]) == "dlfs" && args[1] == "mount" && args[len(args)-1] == mnt {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitGone polls until no daemon serves mnt and nothing is mounted
// there, or fails the test after timeout.
func waitGone(t *testing.T, mnt string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for wait := time.Millisecond; len(daemonsAt(mnt)) > 0 || isMounted(mnt); wait = min(2*wait, 100*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after %v, daemons %v serve %s, mounted %v", timeout, daemonsAt(mnt), mnt, isMounted(mnt))
		}
		time.Sleep(wait)
	}
}

// stopDaemons ends what a failed test left at mnt: SIGTERM to each daemon,
// then a lazy unmount.
func stopDaemons(mnt string) {
	for _, pid := range daemonsAt(mnt) {
		syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(daemonsAt(mnt)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if isMounted(mnt) {
		syscall.Unmount(mnt, syscall.MNT_DETACH)
	}
}

// installHelper links /sbin/mount.fuse.dlfs to the dlfs under test, where
// mount(8) looks for the helper of type fuse.dlfs, for the test's life.
func installHelper(t *testing.T) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("mount(8) runs helpers of /sbin for root only")
	}
	link := "/sbin/mount.fuse.dlfs"
	if old, err := os.Readlink(link); err == nil && strings.Contains(old, "dlfs-it-bin") {
		os.Remove(link) // an earlier run's, killed before its cleanup
	}
	if _, err := os.Lstat(link); err == nil {
		t.Skipf("%s is installed; this test would replace it", link)
	}
	if err := os.Symlink(bin.dlfs, link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(link) })
}

// TestMountHelper runs the mount helper as mount(8) does: "mount -t
// fuse.dlfs" with options and an fstab line (mount -T) naming a config
// file each mount, serve a file and unmount with umount, the daemon
// exiting; an unknown option, a SOURCE that is not there and a bad config
// file fail mount(8) with the reason.
func TestMountHelper(t *testing.T) {
	installHelper(t)
	src := writeTree(t, map[string]string{"a/x.txt": "hello", "b.txt": "world"})
	logf := filepath.Join(t.TempDir(), "dlfs.log")
	cfgs := writeTree(t, map[string]string{"good.yaml": "ram-cache: 32MiB\nmount:\n  infer: false\n", "bad.yaml": "ram-cache: 32MiB\nbogus: 1\n"})
	goodConfig, badConfig := filepath.Join(cfgs, "good.yaml"), filepath.Join(cfgs, "bad.yaml")

	t.Run("mount -t", func(t *testing.T) {
		mnt := t.TempDir()
		t.Cleanup(func() { stopDaemons(mnt) })
		out, err := exec.Command("mount", "-t", "fuse.dlfs", "-o", "ram-cache=64MiB,allow_other,noatime,nodev,nosuid,_netdev,nofail,infer=false,log="+logf, src, mnt).CombinedOutput()
		if err != nil {
			t.Fatalf("mount: %v\n%s", err, out)
		}
		// mount(8) returned: the mount is usable now, no polling.
		mustRead(t, filepath.Join(mnt, "a/x.txt"), "hello")
		if pids := daemonsAt(mnt); len(pids) != 1 {
			t.Errorf("daemons serving %s: %v", mnt, pids)
		}
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Fatalf("umount: %v\n%s", err, out)
		}
		waitGone(t, mnt, 30*time.Second)
	})
	t.Run("fstab", func(t *testing.T) {
		mnt := t.TempDir()
		t.Cleanup(func() { stopDaemons(mnt) })
		fstab := filepath.Join(t.TempDir(), "fstab")
		line := fmt.Sprintf("%s %s fuse.dlfs config=%s,allow_other,_netdev,x-systemd.requires-mounts-for=/,log=%s 0 0\n", src, mnt, goodConfig, logf)
		if err := os.WriteFile(fstab, []byte("# dlfs\n"+line), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("mount", "-T", fstab, mnt).CombinedOutput(); err != nil {
			t.Fatalf("mount -T %s (%s): %v\n%s", fstab, line, err, out)
		}
		mustRead(t, filepath.Join(mnt, "b.txt"), "world")
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Fatalf("umount: %v\n%s", err, out)
		}
		waitGone(t, mnt, 30*time.Second)
	})
	for _, tc := range []struct{ name, opts, src, want string }{
		{"unknown option", "bogus=1", src, `option "bogus=1": dlfs mount has no flag --bogus`},
		{"no source", "ram-cache=64MiB", src + "-gone", "no such file or directory"},
		{"bad config", "config=" + badConfig, src, badConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mnt := t.TempDir()
			t.Cleanup(func() { stopDaemons(mnt) })
			out, err := exec.Command("mount", "-t", "fuse.dlfs", "-o", tc.opts+",log="+logf, tc.src, mnt).CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.want) {
				t.Errorf("mount: %v, want an error saying %q:\n%s", err, tc.want, out)
			}
			if isMounted(mnt) || len(daemonsAt(mnt)) > 0 {
				t.Errorf("%s mounted after a failed mount", mnt)
			}
		})
	}
}

// unitKeys parses a systemd unit file into "Section.Key" -> values, in
// order, continuation lines joined.
func unitKeys(b []byte) map[string][]string {
	keys := map[string][]string{}
	section, cur := "", ""
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if cur == "" && (l == "" || l[0] == '#' || l[0] == ';') {
			continue
		}
		if strings.HasSuffix(l, "\\") {
			cur += strings.TrimSuffix(l, "\\") + " "
			continue
		}
		l, cur = cur+l, ""
		if strings.HasPrefix(l, "[") {
			section = strings.Trim(l, "[]")
			continue
		}
		k, v, _ := strings.Cut(l, "=")
		keys[section+"."+strings.TrimSpace(k)] = append(keys[section+"."+strings.TrimSpace(k)], strings.TrimSpace(v))
	}
	return keys
}

// envFile reads KEY=VALUE lines, as EnvironmentFile= does.
func envFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if k, v, ok := strings.Cut(l, "="); ok && l[0] != '#' {
			env[k] = strings.Trim(v, `"'`)
		}
	}
	return env
}

// execArgv turns an Exec*= line into a command as systemd does: a leading
// "-" lets it fail; "$VAR" alone is split into words, "${VAR}" is
// substituted as is.
func execArgv(t *testing.T, line string, env map[string]string) (argv []string, mayFail bool) {
	t.Helper()
	if strings.HasPrefix(line, "-") {
		line, mayFail = line[1:], true
	}
	if strings.ContainsAny(line[:1], "@+!:") || strings.ContainsAny(line, `"'`) {
		t.Fatalf("this emulation of systemd does not read %q", line)
	}
	subst := regexp.MustCompile(`\$\{(\w+)\}`)
	for _, w := range strings.Fields(line) {
		if m := regexp.MustCompile(`^\$(\w+)$`).FindStringSubmatch(w); m != nil {
			argv = append(argv, strings.Fields(env[m[1]])...)
			continue
		}
		argv = append(argv, subst.ReplaceAllStringFunc(w, func(s string) string { return env[s[2:len(s)-1]] }))
	}
	return argv, mayFail
}

// notifyMsg is a datagram on a notify socket and its sender's pid.
type notifyMsg struct {
	pid  int32
	text string
}

// listenNotify listens on a notify socket as systemd does, with the
// senders' credentials (SO_PASSCRED: systemd takes READY=1 from the main
// process only, NotifyAccess=main), until the test ends.
func listenNotify(t *testing.T) (string, <-chan notifyMsg) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	raw.Control(func(fd uintptr) { err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_PASSCRED, 1) })
	if err != nil {
		t.Fatal(err)
	}
	msgs := make(chan notifyMsg, 16)
	done := make(chan struct{})
	go func() { // ends when the socket closes
		defer close(done)
		buf, oob := make([]byte, 4096), make([]byte, syscall.CmsgSpace(syscall.SizeofUcred))
		for {
			n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			m := notifyMsg{pid: -1, text: string(buf[:n])}
			if cms, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil && len(cms) > 0 {
				if cred, err := syscall.ParseUnixCredentials(&cms[0]); err == nil {
					m.pid = cred.Pid
				}
			}
			select {
			case msgs <- m:
			default:
			}
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return path, msgs
}

// awaitNotify waits for a message from pid holding the line want; it
// fails the test if the process exits first or timeout passes.
func awaitNotify(t *testing.T, msgs <-chan notifyMsg, pid int, want string, exited <-chan struct{}, timeout time.Duration) {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case m := <-msgs:
			if int(m.pid) != pid {
				t.Errorf("notify message %q from pid %d, not the main process %d: systemd ignores it", m.text, m.pid, pid)
				continue
			}
			for _, l := range strings.Split(m.text, "\n") {
				if l == want {
					return
				}
			}
		case <-exited:
			t.Fatalf("the service exited before it sent %s", want)
		case <-timer.C:
			t.Fatalf("no %s within %v", want, timeout)
		}
	}
}

// TestSystemdService follows docs/install.md's systemd steps on a fresh
// root: make install (DESTDIR), the key, the cache directory and the
// instance's env file; then it runs the installed unit as systemd would
// (its Exec lines parsed from the file, EnvironmentFile, LoadCredential,
// Type=notify's socket, KillSignal): start, ready from the main process,
// the mount used, stopped, and nothing left behind: no mount, no process
// of the service, the SSD cache free for the next start, which it checks
// with a second start and stop. PID 1 here is not systemd (a container),
// so systemctl itself is not run; systemd-analyze verify checks the unit.
func TestSystemdService(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("the unit runs as root")
	}
	if comm, _ := os.ReadFile("/proc/1/comm"); string(comm) != "systemd\n" {
		t.Logf("PID 1 is %q, not systemd: the unit's life is emulated", strings.TrimSpace(string(comm)))
	}
	doc, err := os.ReadFile(filepath.Join(repo, "docs/install.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []string{"make install\n", "install -d -m 0700 /etc/dlfs /var/cache/dlfs/imagenet\n",
		"install -m 0600 deploy/systemd/example.env /etc/dlfs/imagenet.env",
		"head -c 32 /dev/urandom | base64 > /etc/dlfs/cluster.key; chmod 600 /etc/dlfs/cluster.key\n",
		"systemctl enable --now dlfs@imagenet\n"} {
		if !strings.Contains(string(doc), step) {
			t.Errorf("docs/install.md lacks the step this test follows: %s", step)
		}
	}
	root := t.TempDir()
	if out, err := exec.Command("make", "-s", "-C", repo, "install", "DESTDIR="+root, "DLFS_BIN="+bin.dlfs).CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	for link, want := range map[string]string{"sbin/mount.fuse.dlfs": "/usr/local/bin/dlfs", "sbin/mount.dlfs": "/usr/local/bin/dlfs"} {
		if got, err := os.Readlink(filepath.Join(root, link)); err != nil || got != want {
			t.Errorf("make install: %s -> %q (%v), want %s", link, got, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "usr/local/bin/dlfs")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("make install: usr/local/bin/dlfs: %v %v", fi, err)
	}
	installed, err := os.ReadFile(filepath.Join(root, "etc/systemd/system/dlfs@.service"))
	if err != nil {
		t.Fatal(err)
	}
	// The unit as installed, its paths moved under root.
	unit := strings.NewReplacer("/usr/local/bin/dlfs", root+"/usr/local/bin/dlfs", "/etc/dlfs/", root+"/etc/dlfs/").Replace(string(installed))
	inst := filepath.Join(root, "dlfs@imagenet.service")
	if err := os.WriteFile(inst, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("systemd-analyze", "verify", "--man=no", inst).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	keys := unitKeys([]byte(strings.ReplaceAll(unit, "%i", "imagenet")))
	one := func(k string) string {
		if len(keys[k]) != 1 {
			t.Fatalf("the unit has %d %s", len(keys[k]), k)
		}
		return keys[k][0]
	}
	if typ := one("Service.Type"); typ != "notify" {
		t.Fatalf("Type=%s: want notify, so that the service is started once the mount is usable", typ)
	}

	// docs/install.md: the directories, the key, the env file.
	for _, d := range []string{"etc/dlfs", "var/cache/dlfs/imagenet"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("sh", "-c", "head -c 32 /dev/urandom | base64 > "+root+"/etc/dlfs/cluster.key; chmod 600 "+root+"/etc/dlfs/cluster.key").CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	src := writeTree(t, map[string]string{"train/0/a.jpg": "sample a", "train/1/b.jpg": "sample b"})
	mnt := filepath.Join(root, "mnt/dlfs/imagenet")
	metrics := freeAddr(t)
	example, err := os.ReadFile(filepath.Join(repo, "deploy/systemd/example.env"))
	if err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, l := range strings.Split(string(example), "\n") {
		switch k, _, _ := strings.Cut(l, "="); k {
		case "SOURCE":
			l = "SOURCE=" + src
		case "MOUNTPOINT":
			l = "MOUNTPOINT=" + mnt
		case "DLFS_FLAGS":
			l = fmt.Sprintf("DLFS_FLAGS=--ram-cache 64MiB --ssd-cache %s/var/cache/dlfs/imagenet --ssd-cache-size 64MiB --bind %s --data-addr %s --metrics-addr %s --allow-other",
				root, freeAddr(t), freeAddr(t), metrics)
		}
		env = append(env, l)
	}
	envPath := filepath.Join(root, "etc/dlfs/imagenet.env")
	if err := os.WriteFile(envPath, []byte(strings.Join(env, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}

	// systemd's part: the environment and the credential.
	if got := one("Service.EnvironmentFile"); got != envPath {
		t.Fatalf("EnvironmentFile=%s, want %s", got, envPath)
	}
	vars := envFile(t, envPath)
	vars["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	cred, from, _ := strings.Cut(one("Service.LoadCredential"), ":")
	creds := filepath.Join(root, "run/credentials/dlfs@imagenet.service")
	if err := os.MkdirAll(creds, 0o700); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(from); err != nil || os.WriteFile(filepath.Join(creds, cred), b, 0o400) != nil {
		t.Fatalf("LoadCredential %s: %v", from, err)
	}
	vars["CREDENTIALS_DIRECTORY"] = creds
	environ := func(extra ...string) []string {
		out := extra
		for k, v := range vars {
			out = append(out, k+"="+v)
		}
		return out
	}
	run := func(what, line string) {
		argv, mayFail := execArgv(t, line, vars)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = environ()
		if out, err := cmd.CombinedOutput(); err != nil && !mayFail {
			t.Fatalf("%s=%s: %v\n%s", what, line, err, out)
		}
	}
	stopSignal := map[string]syscall.Signal{"SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT}[one("Service.KillSignal")]
	if stopSignal == 0 {
		t.Fatalf("KillSignal=%s", one("Service.KillSignal"))
	}

	for _, start := range []string{"start", "restart"} {
		for _, l := range keys["Service.ExecStartPre"] {
			run("ExecStartPre", l)
		}
		sock, msgs := listenNotify(t)
		argv, _ := execArgv(t, one("Service.ExecStart"), vars)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = environ("NOTIFY_SOCKET=" + sock)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the service's cgroup, for the check below
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pid := cmd.Process.Pid
		exited := make(chan struct{})
		var waitErr error
		go func() { waitErr = cmd.Wait(); close(exited) }()
		t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL); <-exited; stopDaemons(mnt) })

		awaitNotify(t, msgs, pid, "READY=1", exited, 2*time.Minute)
		// Ready means usable: no polling from here.
		mustRead(t, filepath.Join(mnt, "train/1/b.jpg"), "sample b")
		mustRead(t, filepath.Join(src, "train/0/a.jpg"), "sample a")
		mustRead(t, filepath.Join(mnt, "train/0/a.jpg"), "sample a")
		if m := httpGet(t, "http://"+metrics+"/metrics"); !strings.Contains(m, "dlfs_") {
			t.Errorf("%s: no dlfs metrics", start)
		}

		cmd.Process.Signal(stopSignal)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			t.Fatalf("%s: the service did not exit within a minute of %v\n%s", start, stopSignal, &out)
		}
		if waitErr != nil {
			t.Fatalf("%s: the service exited with %v: systemd counts it failed\n%s", start, waitErr, &out)
		}
		select { // STOPPING=1 is sent as the stop begins; a manager needs it not
		case m := <-msgs:
			if !strings.HasPrefix(m.text, "STOPPING=1") || int(m.pid) != pid {
				t.Errorf("%s: after READY=1, %q from %d", start, m.text, m.pid)
			}
		default:
			t.Logf("%s: no STOPPING=1 before the exit", start)
		}
		for _, l := range keys["Service.ExecStopPost"] {
			run("ExecStopPost", l)
		}
		// Nothing left behind.
		if isMounted(mnt) {
			t.Errorf("%s: %s is still mounted after the stop", start, mnt)
		}
		if err := syscall.Kill(-pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s: processes of the service are left after the stop (kill: %v)", start, err)
		}
		if l := daemonsAt(mnt); len(l) > 0 {
			t.Errorf("%s: daemons %v still serve %s", start, l, mnt)
		}
	}
}

// yamlDocs reads the YAML documents of a file, through python3-yaml.
func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	js, err := exec.Command("/usr/bin/python3", "-c", "import json, sys, yaml; json.dump(list(yaml.safe_load_all(open(sys.argv[1]))), sys.stdout)", path).Output()
	if err != nil {
		t.Fatal(err)
	}
	var docs []map[string]any
	if err := json.Unmarshal(js, &docs); err != nil {
		t.Fatal(err)
	}
	return docs
}

// hostMounts returns a pod spec's mounts of host paths: host path ->
// the container's mountPropagation ("" when unset).
func hostMounts(spec map[string]any) map[string]string {
	host := map[string]string{} // volume name -> host path
	for _, v := range spec["volumes"].([]any) {
		v := v.(map[string]any)
		if p, ok := dig(v, "hostPath", "path").(string); ok {
			host[v["name"].(string)] = p
		}
	}
	out := map[string]string{}
	for _, c := range spec["containers"].([]any) {
		for _, m := range dig(c, "volumeMounts").([]any) {
			m := m.(map[string]any)
			if p, ok := host[m["name"].(string)]; ok {
				prop, _ := m["mountPropagation"].(string)
				out[p] = prop
			}
		}
	}
	return out
}

// TestKubernetesPropagation: the DaemonSet carries its mount to the host
// (Bidirectional on the parent of the mount point), and the example
// training pod sees it, and its replacement, through HostToContainer on
// that same parent.
func TestKubernetesPropagation(t *testing.T) {
	pod := filepath.Join(repo, "deploy/kubernetes/training-pod.yaml")
	if out, err := exec.Command("yamllint", "-s", "-d", "{extends: default, rules: {line-length: {max: 120}}}", pod).CombinedOutput(); err != nil {
		t.Errorf("yamllint: %v\n%s", err, out)
	}
	var mnt string
	for _, d := range yamlDocs(t, filepath.Join(repo, "deploy/kubernetes/daemonset.yaml")) {
		if d["kind"] != "DaemonSet" {
			continue
		}
		spec := dig(d, "spec", "template", "spec").(map[string]any)
		args := dig(spec["containers"].([]any)[0], "args").([]any)
		mnt = args[len(args)-1].(string)
		if prop := hostMounts(spec)[filepath.Dir(mnt)]; prop != "Bidirectional" {
			t.Errorf("the DaemonSet mounts %s with propagation %q, want Bidirectional", filepath.Dir(mnt), prop)
		}
	}
	if mnt == "" {
		t.Fatal("no DaemonSet")
	}
	n := 0
	for _, d := range yamlDocs(t, pod) {
		if d["kind"] != "Pod" {
			continue
		}
		n++
		mounts := hostMounts(d["spec"].(map[string]any))
		if prop := mounts[filepath.Dir(mnt)]; prop != "HostToContainer" {
			t.Errorf("the training pod mounts %s with propagation %q, want HostToContainer: %v", filepath.Dir(mnt), prop, mounts)
		}
		if _, ok := mounts[mnt]; ok {
			t.Errorf("the training pod mounts the mount point %s itself: it would keep a dead mount when dlfs is replaced", mnt)
		}
	}
	if n != 1 {
		t.Errorf("%d pods in %s", n, pod)
	}
}
