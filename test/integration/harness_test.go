// Package integration runs the dlfs and pfssim binaries as a user would:
// real mounts, real processes, Python with torch.
package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/mountproc"
	"github.com/dlfs/dlfs/test/pfssim"
)

var bin struct{ dlfs, pfssim string }

func TestMain(m *testing.M) {
	if os.Getenv("DLFS_IT_READER") != "" {
		readerMain() // this binary, run as a reader on a test-bed host
	}
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

// proc is a running mount daemon; the helpers below fail the test instead
// of returning errors.
type proc struct{ *mountproc.Proc }

// startMount runs a daemon binary and waits for its "mounted" line. The
// cleanup stops it with SIGTERM and checks it exits cleanly.
func startMount(t *testing.T, binary, mnt string, args ...string) *proc {
	t.Helper()
	p, err := mountproc.Start(binary, mnt, 60*time.Second, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { (&proc{p}).stop(t) })
	return &proc{p}
}

func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.Stop(30 * time.Second); err != nil {
		t.Error(err)
	}
}

func isMounted(mnt string) bool { return mountproc.Mounted(mnt) }

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

// counters asks the simulator for a fresh dump of its counters.
func (p *pfs) counters(t *testing.T) pfssim.Counters {
	t.Helper()
	c, err := p.PFSCounters(p.stats, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return c
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
		// Not a skip: the checks after it (RAM, SSD, rejoin) would be
		// silently left out. make test runs as root.
		t.Fatalf("cannot drop the page cache (needs root): %v", err)
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
