package integration

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
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
// fuse.dlfs" with options and an fstab line (mount -T) each mount, serve
// a file and unmount with umount, the daemon exiting; an unknown option
// and a SOURCE that is not there fail mount(8) with the reason.
func TestMountHelper(t *testing.T) {
	installHelper(t)
	src := writeTree(t, map[string]string{"a/x.txt": "hello", "b.txt": "world"})
	logf := filepath.Join(t.TempDir(), "dlfs.log")

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
		line := fmt.Sprintf("%s %s fuse.dlfs ram-cache=32MiB,allow_other,_netdev,x-systemd.requires-mounts-for=/,log=%s 0 0\n", src, mnt, logf)
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
