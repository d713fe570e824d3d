// Package integration runs the dlfs and pfssim binaries as a user would:
// real mounts, real processes, Python with torch.
package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/pfssim"
)

var bin struct{ dlfs, pfssim string }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dlfs-it-bin")
	if err != nil {
		panic(err)
	}
	bin.dlfs = filepath.Join(dir, "dlfs")
	bin.pfssim = filepath.Join(dir, "pfssim")
	for out, pkg := range map[string]string{bin.dlfs: "../../cmd/dlfs", bin.pfssim: "../../cmd/pfssim"} {
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building", pkg, "failed:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running mount daemon (dlfs or pfssim).
type proc struct {
	cmd    *exec.Cmd
	mnt    string
	stderr *syncBuffer
	exited chan struct{}
	err    error // set before exited closes
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startMount runs a daemon binary and waits for its "mounted" line. The
// cleanup stops it with SIGTERM and checks it exits cleanly.
func startMount(t *testing.T, binary, mnt string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(binary, args...), mnt: mnt, stderr: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd.Stderr = p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	mounted := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "mounted") {
				mounted <- sc.Text()
			}
		}
	}()
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	select {
	case <-mounted:
	case <-p.exited:
		t.Fatalf("%s %v exited before mounting: %v\n%s", filepath.Base(binary), args, p.err, p.stderr)
	case <-time.After(60 * time.Second):
		p.cmd.Process.Kill()
		t.Fatalf("%s did not mount within 60s\n%s", filepath.Base(binary), p.stderr)
	}
	t.Cleanup(func() { p.stop(t) })
	return p
}

// stop sends SIGTERM and waits for a clean exit; it is a no-op once the
// process has exited.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	select {
	case <-p.exited:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		if p.err != nil {
			t.Errorf("%s exited with %v\n%s", p.cmd.Path, p.err, p.stderr)
		}
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		t.Errorf("%s did not exit within 30s of SIGTERM\n%s", p.cmd.Path, p.stderr)
	}
	if isMounted(p.mnt) {
		t.Errorf("%s is still mounted after %s exited", p.mnt, filepath.Base(p.cmd.Path))
		syscall.Unmount(p.mnt, syscall.MNT_DETACH)
	}
}

func isMounted(mnt string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	abs, _ := filepath.Abs(mnt)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == abs {
			return true
		}
	}
	return false
}

// pfs is a running simulator with its counters file.
type pfs struct {
	*proc
	stats string
}

func startPFS(t *testing.T, dir string, flags ...string) *pfs {
	t.Helper()
	mnt := t.TempDir()
	stats := filepath.Join(t.TempDir(), "pfs.json")
	args := append(append([]string{"-stats", stats}, flags...), dir, mnt)
	return &pfs{proc: startMount(t, bin.pfssim, mnt, args...), stats: stats}
}

// counters asks the simulator for a fresh dump and polls until it lands.
func (p *pfs) counters(t *testing.T) pfssim.Counters {
	t.Helper()
	before, _ := pfssim.ReadCounters(p.stats)
	if err := p.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	var c pfssim.Counters
	poll(t, 10*time.Second, "pfssim counters dump", func() bool {
		var err error
		c, err = pfssim.ReadCounters(p.stats)
		return err == nil && c.Dumps > before.Dumps
	})
	return c
}

// poll calls cond until it holds or the deadline passes.
func poll(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for wait := time.Millisecond; !cond(); wait = min(wait*2, 100*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(wait)
	}
}

// startDlfs mounts src with the dlfs binary and extra flags.
func startDlfs(t *testing.T, src string, flags ...string) *proc {
	t.Helper()
	mnt := t.TempDir()
	return startMount(t, bin.dlfs, mnt, append(append([]string{"mount"}, flags...), src, mnt)...)
}

// readAll reads files under root with workers threads in a shuffled order,
// like a DataLoader, and checks every byte against want (path → bytes
// source). It returns the bytes read.
func readAll(t *testing.T, root string, files []string, workers int, seed uint64, want func(string) []byte) int64 {
	t.Helper()
	order := append([]string(nil), files...)
	rand.New(rand.NewPCG(seed, 1)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int64
		errs  []string
	)
	next := make(chan string)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rel := range next {
				b, err := os.ReadFile(filepath.Join(root, rel))
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, err.Error())
				case want != nil && !bytes.Equal(b, want(rel)):
					errs = append(errs, rel+": bytes differ from SOURCE")
				}
				total += int64(len(b))
				mu.Unlock()
			}
		}()
	}
	for _, f := range order {
		next <- f
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d reads failed; first: %s", len(errs), errs[0])
	}
	return total
}

// dlfsStats reads MOUNTPOINT/.dlfs/stats.
func dlfsStats(t *testing.T, mnt string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(mnt, ".dlfs/stats"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("stats: %v\n%s", err, b)
	}
	return m
}

// num digs a number out of a stats document: num(m, "served", "ram", "bytes").
func num(m map[string]any, keys ...string) float64 {
	var v any = m
	for _, k := range keys {
		mm, _ := v.(map[string]any)
		v = mm[k]
	}
	f, _ := v.(float64)
	return f
}

// dropPageCache empties the kernel page cache, so reads reach the daemon
// again; it needs root.
func dropPageCache(t *testing.T) {
	t.Helper()
	syscall.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200); err != nil {
		t.Skipf("cannot drop the page cache (needs root): %v", err)
	}
}

// runCmd runs a command and returns its exit code, stdout and stderr.
func runCmd(t *testing.T, name string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return code, out.String(), errb.String()
}

