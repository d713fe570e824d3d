package integration

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/conformance"
	"github.com/dlfs/dlfs/test/datagen"
)

func TestTree(t *testing.T) {
	src := conformance.OddTree(t, t.TempDir())
	d := startDlfs(t, src, "--ssd-cache", t.TempDir(), "--ssd-cache-size", "64MiB")
	conformance.Tree(t, src, d.Mnt)
	if err := os.WriteFile(filepath.Join(d.Mnt, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("create: got %v, want EROFS", err)
	}
	ents, err := os.ReadDir(d.Mnt)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == ".dlfs" {
			t.Error(".dlfs is listed")
		}
	}
	conformance.StatsKeys(t, dlfsStats(t, d.Mnt))
}

// dataset writes a small ImageFolder tree and returns its file list.
func dataset(t *testing.T, dir string, files int) []string {
	t.Helper()
	fs, err := datagen.ImageFolder(dir, datagen.Spec{Classes: 7, Files: files, MeanSize: 110_000, Spread: 40_000, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.Path
	}
	return out
}

func fromSource(src string) func(string) []byte {
	return func(rel string) []byte {
		b, _ := os.ReadFile(filepath.Join(src, rel))
		return b
	}
}

// TestTiersOverPFS: the first epoch reads SOURCE through pfssim once; the
// second comes from the RAM tier; after a remount the SSD tier serves it
// all. pfssim counts the PFS traffic independently of dlfs.
func TestTiersOverPFS(t *testing.T) {
	src := t.TempDir()
	files := dataset(t, src, 300)
	pfs := startPFS(t, src, "-open-latency", "1ms")
	ssd := t.TempDir()
	flags := []string{"--ram-cache", "256MiB", "--ssd-cache", ssd, "--ssd-cache-size", "256MiB"}

	d := startDlfs(t, pfs.Mnt, flags...)
	size := readAll(t, d.Mnt, files, 4, 1, fromSource(src))
	c1 := pfs.counters(t)
	if c1.Bytes < size {
		t.Fatalf("epoch 1: pfssim saw %d bytes, the dataset has %d", c1.Bytes, size)
	}
	if c1.Opens < int64(len(files)) {
		t.Fatalf("epoch 1: pfssim saw %d opens for %d files", c1.Opens, len(files))
	}

	dropPageCache(t) // make the kernel ask dlfs again
	readAll(t, d.Mnt, files, 4, 2, fromSource(src))
	c2 := pfs.counters(t)
	if c2.Bytes != c1.Bytes || c2.Opens != c1.Opens {
		t.Errorf("epoch 2 (RAM warm): pfssim saw %d more bytes and %d more opens, want 0", c2.Bytes-c1.Bytes, c2.Opens-c1.Opens)
	}
	if st := dlfsStats(t, d.Mnt); num(st, "served", "ram", "bytes") < float64(size) {
		t.Errorf("epoch 2: stats say %v bytes served from RAM, want >= %d", num(st, "served", "ram", "bytes"), size)
	}
	d.stop(t)

	d = startDlfs(t, pfs.Mnt, flags...)
	readAll(t, d.Mnt, files, 4, 3, fromSource(src))
	c3 := pfs.counters(t)
	if c3.Bytes != c2.Bytes {
		t.Errorf("after remount (SSD warm): pfssim saw %d more bytes, want 0", c3.Bytes-c2.Bytes)
	}
	st := dlfsStats(t, d.Mnt)
	// A file read in several requests is promoted to RAM by the first.
	ssdBytes, ramBytes := num(st, "served", "ssd", "bytes"), num(st, "served", "ram", "bytes")
	if ssdBytes < float64(size)/2 || ssdBytes+ramBytes < float64(size) {
		t.Errorf("after remount: stats say %v bytes served from SSD and %v from RAM; want most of %d from SSD",
			ssdBytes, ramBytes, size)
	}
	if got := num(st, "pfs", "bytes"); got != 0 {
		t.Errorf("after remount: stats say %v PFS bytes, want 0", got)
	}
}

// TestMemoryBound reads a dataset five times the RAM tier with the SSD tier
// on and checks the daemon's resident memory stays within the tier + 256 MiB.
func TestMemoryBound(t *testing.T) {
	src := t.TempDir()
	files := dataset(t, src, 1500) // ~165 MB
	const ram = 32 << 20
	d := startDlfs(t, src, "--ram-cache", "32MiB", "--ssd-cache", t.TempDir(), "--ssd-cache-size", "1GiB")
	pid := d.Cmd.Process.Pid
	stop := make(chan struct{})
	peak := make(chan [2]int64)
	go func() {
		var rss, anon int64
		for {
			r, a := memory(pid)
			rss, anon = max(rss, r), max(anon, a)
			select {
			case <-stop:
				peak <- [2]int64{rss, anon}
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	readAll(t, d.Mnt, files, 4, 1, nil)
	dropPageCache(t)
	readAll(t, d.Mnt, files, 4, 2, fromSource(src))
	close(stop)
	p := <-peak
	t.Logf("peak VmRSS %d MiB, RssAnon %d MiB (RAM tier %d MiB)", p[0]>>20, p[1]>>20, ram>>20)
	if p[0] > ram+256<<20 {
		t.Errorf("peak RSS %d MiB exceeds the RAM tier + 256 MiB", p[0]>>20)
	}
}

// memory returns VmRSS and RssAnon of pid in bytes.
func memory(pid int) (rss, anon int64) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb << 10
		case "RssAnon:":
			anon = kb << 10
		}
	}
	return rss, anon
}

// TestImageFolder: torchvision's ImageFolder over the mount and over SOURCE
// sees the same classes, samples, targets and bytes.
func TestImageFolder(t *testing.T) {
	src := t.TempDir()
	dataset(t, src, 120)
	conformance.OddTree(t, filepath.Join(src, "class_odd")) // odd names, a hidden dir, symlinks, mixed-case extensions
	d := startDlfs(t, src)
	want := imageFolder(t, src)
	got := imageFolder(t, d.Mnt)
	if want.Classes == nil || len(want.Samples) < 120 {
		t.Fatalf("ImageFolder over SOURCE found %d classes and %d samples", len(want.Classes), len(want.Samples))
	}
	if strings.Join(got.Classes, "|") != strings.Join(want.Classes, "|") {
		t.Errorf("classes over the mount %v, over SOURCE %v", got.Classes, want.Classes)
	}
	if len(got.Samples) != len(want.Samples) {
		t.Fatalf("%d samples over the mount, %d over SOURCE", len(got.Samples), len(want.Samples))
	}
	for i := range want.Samples {
		if string(mustJSON(got.Samples[i])) != string(mustJSON(want.Samples[i])) {
			t.Errorf("sample %d: mount %v, SOURCE %v", i, got.Samples[i], want.Samples[i])
		}
	}
}

type folderIndex struct {
	Classes []string `json:"classes"`
	Samples [][]any  `json:"samples"`
}

func imageFolder(t *testing.T, root string) folderIndex {
	t.Helper()
	cmd := exec.Command("/usr/bin/python3", "imagefolder_compare.py", root)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("imagefolder_compare.py %s: %v\n%s\n(make test installs python3-torchvision)", root, err, stderr)
	}
	var idx folderIndex
	if err := json.Unmarshal(out, &idx); err != nil {
		t.Fatal(err)
	}
	return idx
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
