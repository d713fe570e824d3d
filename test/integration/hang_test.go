package integration

// A PFS that stops answering (issue 27, "Hangs"): reads through dlfs end
// at --pfs-timeout with ETIMEDOUT, a reader's Ctrl-C ends its read at once,
// and SIGTERM unmounts and exits while reads of SOURCE are stuck.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hungPFS starts a simulated PFS over files a, b and c (c of 3 MiB, three
// blocks), mounts dlfs over it with flags, reads a through dlfs, and hangs
// the PFS.
func hungPFS(t *testing.T, flags ...string) (*pfs, *proc) {
	t.Helper()
	dir := t.TempDir()
	for name, n := range map[string]int{"a": 300 << 10, "b": 300 << 10, "c": 3 << 20, "cls/x.jpg": 1000, "list.txt": 100} {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, name), randomBytes(n, uint64(n)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := startPFS(t, dir)
	d := startDlfs(t, p.Mnt, append([]string{"--infer=false", "--push=false", "--stop-timeout", "10s"}, flags...)...)
	if _, err := os.ReadFile(filepath.Join(d.Mnt, "a")); err != nil {
		t.Fatal(err)
	}
	p.Cmd.Process.Signal(syscall.SIGUSR2)
	p.waitLog(t, "pfssim: hung")
	return p, d
}

// blockedInFUSE waits until process pid is waiting for a FUSE answer.
func blockedInFUSE(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stack"))
		if strings.Contains(string(b), "request_wait_answer") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d never blocked in FUSE:\n%s", pid, b)
		}
	}
}

// exiting reports whether process pid has exited, or is exiting: a thread
// in a FUSE request that the PFS never answers cannot be killed (the
// kernel waits for the answer), so a process that exits with one lingers,
// exiting (PF_EXITING) or a zombie, until the PFS answers.
func exiting(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	flags, _ := strconv.ParseUint(f[6], 10, 64)
	return f[0] == "Z" || flags&0x4 != 0 // PF_EXITING
}

// stopWhileHung sends d SIGTERM while p hangs, and checks that the mount
// goes and the daemon exits within a bound. A thread in a FUSE request
// that the PFS never answers cannot be killed (the kernel waits for the
// answer), so the daemon's process lingers as a zombie until the PFS
// answers: the test then resumes p, and the cleanup reaps d.
func stopWhileHung(t *testing.T, p *pfs, d *proc) {
	t.Helper()
	d.Cmd.Process.Signal(syscall.SIGTERM)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		exited := exiting(d.Cmd.Process.Pid)
		if exited && !isMounted(d.Mnt) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("SIGTERM with the PFS hung: exited %v, mounted %v after 30s\n%s", exited, isMounted(d.Mnt), d.Stderr)
		}
	}
	p.Cmd.Process.Signal(syscall.SIGHUP)
	p.waitLog(t, "pfssim: resumed")
	d.stop(t) // reaps it: exit status 0
}

func TestHungPFSReadTimesOut(t *testing.T) {
	p, d := hungPFS(t, "--pfs-timeout", "1s")
	start := time.Now()
	code, _, stderr := runCmd(t, "timeout", "60", "cat", filepath.Join(d.Mnt, "b"))
	if code == 0 || !strings.Contains(stderr, "timed out") {
		t.Fatalf("a read of a hung PFS: exit %d, %q; want ETIMEDOUT (Connection timed out)", code, stderr)
	}
	t.Logf("the read failed after %v", time.Since(start).Round(time.Millisecond))
	d.alive(t) // stats still answer
	if got := num(dlfsStats(t, d.Mnt), "pfs_stuck"); got < 1 {
		t.Errorf("stats pfs_stuck %v, want the read abandoned in the kernel counted", got)
	}
	// df asks SOURCE too: it answers (ETIMEDOUT at worst) instead of hanging.
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.Mnt, &st); err != nil && err != syscall.ETIMEDOUT {
		t.Errorf("statfs of a mount over a hung PFS: %v", err)
	}
	stopWhileHung(t, p, d)
}

// Ctrl-C of a reader waiting on a hung PFS ends its read at once (dd
// handles SIGINT, so only the FUSE INTERRUPT frees it: the kernel waits
// for the daemon's answer), and SIGTERM unmounts and exits with reads of
// SOURCE stuck and a reader still waiting.
func TestHungPFSInterruptAndStop(t *testing.T) {
	p, d := hungPFS(t, "--pfs-timeout", "1h")
	dd := func(name string) (*exec.Cmd, chan error) {
		cmd := exec.Command("dd", "if="+filepath.Join(d.Mnt, name), "of=/dev/null", "bs=4096", "count=1", "iflag=direct")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		blockedInFUSE(t, cmd.Process.Pid)
		return cmd, exited
	}
	reader, exited := dd("c")
	reader.Process.Signal(syscall.SIGINT)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		reader.Process.Kill()
		t.Fatal("a reader's Ctrl-C did not end its read of a hung PFS")
	}
	second, done := dd("b")
	stopWhileHung(t, p, d)
	select {
	case err := <-done:
		if err == nil {
			t.Error("a read cut short by unmounting succeeded")
		}
	case <-time.After(30 * time.Second):
		second.Process.Kill()
		t.Fatal("a reader stayed stuck after the daemon exited")
	}
}

// A refresh stuck on a hung PFS, and a job line whose list file it must
// read, hold up no other control write: a job line, a report and a
// warm-up and its stop all return while they wait, and their own writers
// can be killed.
func TestHungPFSControlWrites(t *testing.T) {
	p, d := hungPFS(t, "--pfs-timeout", "1h")
	lister := exec.Command("sh", "-c", "echo job=l epoch=0 dataset=list:list.txt > "+filepath.Join(d.Mnt, ".dlfs/control"))
	if err := lister.Start(); err != nil {
		t.Fatal(err)
	}
	listed := make(chan error, 1)
	go func() { listed <- lister.Wait() }()
	blockedInFUSE(t, lister.Process.Pid)
	refresher := exec.Command("sh", "-c", "echo refresh > "+filepath.Join(d.Mnt, ".dlfs/control"))
	if err := refresher.Start(); err != nil {
		t.Fatal(err)
	}
	refreshed := make(chan error, 1)
	go func() { refreshed <- refresher.Wait() }()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st := dlfsStats(t, d.Mnt)
		if running, _ := st["catalog"].(map[string]any)["refresh"].(map[string]any)["running"].(bool); running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the refresh never started")
		}
	}
	writes := make(chan error, 1)
	go func() {
		for _, line := range []string{
			"job=j epoch=0 seed=1",
			"report job=r rank=0 epoch=0 batch=8 workers=2 step=0.1 wait=0 decode=0.01 cpu=0.01 samples=8",
			"warmup .",
			"warmup stop",
		} {
			if err := control(d.Mnt, line); err != nil {
				writes <- fmt.Errorf("%s: %w", line, err)
				return
			}
		}
		writes <- nil
	}()
	select {
	case err := <-writes:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("control writes waited on a refresh stuck on the PFS")
	}
	select {
	case err := <-refreshed:
		t.Fatalf("a refresh of a hung PFS ended: %v", err)
	default:
	}
	refresher.Process.Signal(syscall.SIGKILL)
	lister.Process.Signal(syscall.SIGKILL)
	for _, done := range []chan error{refreshed, listed} {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the writer of a control line stuck on the PFS could not be killed")
		}
	}
	d.alive(t)
	stopWhileHung(t, p, d)
}

// SIGTERM with a file held open under the mount (a training job's) detaches
// it and exits 0 within a bound, instead of waiting for the file to close.
func TestStopWithFileOpen(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "a"), []byte("bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDlfs(t, src, "--stop-timeout", "60s")
	holder := exec.Command("sleep", "600")
	f, err := os.Open(filepath.Join(d.Mnt, "a"))
	if err != nil {
		t.Fatal(err)
	}
	holder.Stdin = f
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	defer func() { holder.Process.Kill(); holder.Wait() }()
	d.stop(t) // exit 0, unmounted, within 30 s
}

// SIGTERM while dlfs mounts a PFS that already stopped answering (its
// first stat of SOURCE hangs) ends the process within --stop-timeout.
func TestHungPFSAtMount(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startPFS(t, dir)
	p.Cmd.Process.Signal(syscall.SIGUSR2)
	p.waitLog(t, "pfssim: hung")
	mnt := t.TempDir()
	var stderr bytes.Buffer
	d := exec.Command(bin.dlfs, "mount", "--stop-timeout", "2s", p.Mnt, mnt)
	d.Stderr = &stderr
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.Wait() }()
	task := filepath.Join("/proc", strconv.Itoa(d.Process.Pid), "task")
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		stuck := false
		tids, _ := os.ReadDir(task)
		for _, tid := range tids {
			b, _ := os.ReadFile(filepath.Join(task, tid.Name(), "stack"))
			stuck = stuck || strings.Contains(string(b), "request_wait_answer")
		}
		if stuck {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("dlfs never reached the hung PFS")
		}
	}
	stopStartWhileHung(t, p, d, exited, &stderr)
}

// stopStartWhileHung sends d, a dlfs mount not yet mounted, SIGTERM while
// p hangs, and checks that it exits, with a failure. A thread of the
// daemon may be in the kernel, in a request the hung PFS never answers:
// the process is then exiting, and ends once p resumes.
func stopStartWhileHung(t *testing.T, p *pfs, d *exec.Cmd, exited <-chan error, stderr fmt.Stringer) {
	t.Helper()
	d.Process.Signal(syscall.SIGTERM)
	for deadline := time.Now().Add(30 * time.Second); !exiting(d.Process.Pid); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("SIGTERM while mounting a hung PFS: still running after 30s\n%s", stderr)
		}
	}
	p.Cmd.Process.Signal(syscall.SIGHUP)
	if err := <-exited; err == nil {
		t.Errorf("dlfs stopped while mounting exited 0; want a failure\n%s", stderr)
	}
}

// A daemon killed outright (SIGKILL, the OOM killer) dies whole: it never
// has a request of its own to its mount in flight, which the kernel would
// wait on for ever (the killed daemon is the one to answer it), keeping
// the process and the mount.
func TestKilledDaemonExits(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		d := startDlfs(t, src)
		d.Cmd.Process.Kill()
		select {
		case <-d.Exited:
		case <-time.After(20 * time.Second):
			t.Fatalf("kill %d: the daemon did not die (a request to its own mount in flight?)", i)
		}
		if code, _, stderr := runCmd(t, bin.dlfs, "umount", d.Mnt); code != 0 {
			t.Fatalf("kill %d: dlfs umount of the dead mount: %s", i, stderr)
		}
	}
}
