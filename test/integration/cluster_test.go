package integration

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestThreeNodes runs three dlfs binaries over one pfssim, as three nodes
// of a cluster on one machine. It checks that:
//   - every byte read through every mount is correct, and each sample is
//     read from the PFS about once cluster-wide;
//   - a node killed with SIGKILL mid-read leaves the others' readers
//     finishing without an error;
//   - a node without the cluster key is refused.
func TestThreeNodes(t *testing.T) {
	src := t.TempDir()
	files := dataset(t, src, 300)
	pfs := startPFS(t, src, "-open-latency", "1ms")
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ssdC := t.TempDir()
	node := func(name string, join ...string) *proc {
		args := []string{"--node-name", name, "--bind", "127.0.0.1:0", "--data-addr", "127.0.0.1:0",
			"--cluster-key-file", keyFile, "--ram-cache", "64MiB"}
		if name == "c" {
			args = append(args, "--ssd-cache", ssdC, "--ssd-cache-size", "256MiB")
		}
		if len(join) > 0 {
			args = append(args, "--join", strings.Join(join, ","))
		}
		return startDlfs(t, pfs.Mnt, args...)
	}
	a := node("a")
	gossip, _ := dlfsStats(t, a.Mnt)["cluster"].(map[string]any)["gossip"].(string)
	b := node("b", gossip)
	c := node("c", gossip)
	for _, n := range []*proc{a, b, c} {
		waitAlive(t, n.Mnt, 3)
	}

	// Every node reads the whole dataset; the PFS sees it about once.
	var wg sync.WaitGroup
	for i, n := range []*proc{a, b, c} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			readAll(t, n.Mnt, files, 4, uint64(i), fromSource(src))
		}()
	}
	wg.Wait()
	var total int64
	for _, f := range files {
		fi, _ := os.Stat(filepath.Join(src, f))
		total += fi.Size()
	}
	if got := pfs.counters(t).Bytes; got > total+total/20 {
		t.Errorf("three nodes read %d bytes from the PFS for a %d-byte dataset (want about once)", got, total)
	}
	for _, n := range []*proc{b, c} {
		st := dlfsStats(t, n.Mnt)
		if num(st, "served", "peer", "reads") == 0 {
			t.Errorf("%s read nothing from its peers", n.Mnt)
		}
		// The peer requests' latency, by member: a and the third node.
		var timed float64
		for _, m := range []string{"a", "b", "c"} {
			timed += num(st, "latency", "peer", m, "count")
		}
		if timed == 0 || num(st, "latency", "read", "peer", "count") == 0 {
			t.Errorf("%s: no peer latency in stats: %v", n.Mnt, st["latency"])
		}
	}

	// A node without the key cannot join, even told to run without one;
	// not told, it refuses to start.
	mnt := t.TempDir()
	code, _, stderr := runCmd(t, bin.dlfs, "mount", "--node-name", "intruder", "--insecure", "--bind", "127.0.0.1:0", "--join", gossip, pfs.Mnt, mnt)
	if code == 0 || !strings.Contains(stderr, "cluster key") {
		t.Errorf("a node without the key: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runCmd(t, bin.dlfs, "mount", "--node-name", "intruder", "--bind", "127.0.0.1:0", "--join", gossip, pfs.Mnt, mnt)
	if code == 0 || !strings.Contains(stderr, "--insecure") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("a node without a key and without --insecure: exit %d, stderr %q", code, stderr)
	}

	// Kill c while a and b read again (their page caches dropped, so they
	// ask the owners again): they finish without an error.
	dropPageCache(t)
	errs := make(chan error, 2)
	var progress atomic.Int64
	for i, n := range []*proc{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j, f := range files {
				got, err := os.ReadFile(filepath.Join(n.Mnt, f))
				if err != nil {
					errs <- fmt.Errorf("node %d, file %d: %v", i, j, err)
					return
				}
				if want, _ := os.ReadFile(filepath.Join(src, f)); string(got) != string(want) {
					errs <- fmt.Errorf("node %d: %s: wrong bytes", i, f)
					return
				}
				progress.Add(1)
			}
		}()
	}
	// Kill c once the readers are under way, so it dies mid-read.
	for deadline := time.Now().Add(10 * time.Second); progress.Load() < 20 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	c.Cmd.Process.Signal(syscall.SIGKILL)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	syscall.Unmount(c.Mnt, syscall.MNT_DETACH)

	// c comes back with its SSD cache and serves its share again without
	// reading it from the PFS. It can reclaim its name once the others have
	// declared the killed c dead (memberlist refuses a live name at a new
	// address).
	waitAlive(t, a.Mnt, 2)
	c = node("c", gossip)
	waitAlive(t, c.Mnt, 3)
	// a must see the new c, not the killed one it may still think alive.
	cGossip, _ := dlfsStats(t, c.Mnt)["cluster"].(map[string]any)["gossip"].(string)
	for deadline := time.Now().Add(30 * time.Second); ; {
		seen := false
		members, _ := dlfsStats(t, a.Mnt)["cluster"].(map[string]any)["members"].([]any)
		for _, m := range members {
			mm := m.(map[string]any)
			seen = seen || mm["name"] == "c" && mm["address"] == cGossip && mm["state"] == "alive"
		}
		if seen {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a never saw c come back at %s: %v", cGossip, members)
		}
		time.Sleep(20 * time.Millisecond)
	}
	dropPageCache(t)
	before := pfs.counters(t).Bytes
	readAll(t, a.Mnt, files, 4, 9, fromSource(src))
	if got := pfs.counters(t).Bytes - before; got != 0 {
		t.Errorf("after c returned, reading everything through a cost %d PFS bytes, want 0", got)
	}
	if num(dlfsStats(t, c.Mnt), "served", "ssd", "reads") == 0 && num(dlfsStats(t, c.Mnt), "cluster", "served_to_peers") == 0 {
		t.Error("the returned node served nothing")
	}
}

// waitAlive polls a mount's stats until it sees want alive members.
func waitAlive(t *testing.T, mnt string, want int) {
	t.Helper()
	waitAliveWithin(t, mnt, want, 30*time.Second)
}

// waitAliveWithin is waitAlive with a deadline of its own.
func waitAliveWithin(t *testing.T, mnt string, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		alive := 0
		members, _ := dlfsStats(t, mnt)["cluster"].(map[string]any)["members"].([]any)
		for _, m := range members {
			if m.(map[string]any)["state"] == "alive" {
				alive++
			}
		}
		if alive == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s sees %d alive members, want %d", mnt, alive, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
