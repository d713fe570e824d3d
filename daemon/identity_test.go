package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/source"
)

// countingPFS reads SOURCE and counts the reads; with hang set, a read
// waits until release closes.
type countingPFS struct {
	src     *source.Source
	reads   atomic.Int64
	hang    bool
	release chan struct{}
}

func (p *countingPFS) ReadAt(path string, want source.Version, b []byte, off int64) (int, error) {
	p.reads.Add(1)
	if p.hang {
		<-p.release
	}
	return p.src.ReadAt(path, want, b, off)
}

// TestIdentityHeadsKept: the heads of the oldest files are read once and
// their digests kept beside the SSD tier; a remount reads only the files
// that changed, and gets the identity a fresh read gives; another mount,
// a damaged file or none reads them all; a PFS that does not answer fails
// within the timeout.
func TestIdentityHeadsKept(t *testing.T) {
	dir := t.TempDir()
	for i := range 50 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%02d", i)), []byte(strings.Repeat(fmt.Sprint(i), 3000)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	src, err := source.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	snapOf := func() *catalog.Snapshot {
		cat, err := catalog.Open(context.Background(), catalog.DefaultConfig(dir))
		if err != nil {
			t.Fatal(err)
		}
		return cat.Snapshot()
	}
	saved := filepath.Join(t.TempDir(), "ssd", identityFile)
	pfs := &countingPFS{src: src}
	c := identityConfig{pfs: pfs, format: "directory", mount: "m1", saved: saved}
	first, saveErr, err := datasetOf(context.Background(), snapOf(), c)
	if err != nil || saveErr != nil || pfs.reads.Load() != 32 {
		t.Fatalf("first: %v, %v, %d reads; want 32", err, saveErr, pfs.reads.Load())
	}
	fresh := identityConfig{pfs: pfs, format: "directory", mount: "m1"} // keeps nothing
	pfs.reads.Store(0)
	if again, _, err := datasetOf(context.Background(), snapOf(), c); err != nil || again != first || pfs.reads.Load() != 0 {
		t.Errorf("a remount: %v (first %v), %v, %d reads; want the same identity and no read", again, first, err, pfs.reads.Load())
	}
	// One of the oldest files rewritten (other bytes, same size): read
	// again, alone, and the identity follows its bytes.
	p := filepath.Join(dir, "00")
	if err := os.WriteFile(p, []byte(strings.Repeat("x", 3000)), 0o644); err != nil {
		t.Fatal(err)
	}
	pfs.reads.Store(0)
	changed, _, err := datasetOf(context.Background(), snapOf(), c)
	if err != nil || changed == first || pfs.reads.Load() != 1 {
		t.Errorf("one file changed: %v (first %v), %v, %d reads; want another identity from 1 read", changed, first, err, pfs.reads.Load())
	}
	if want, _, _ := datasetOf(context.Background(), snapOf(), fresh); want != changed {
		t.Errorf("kept digests give %v, a fresh read %v", changed, want)
	}
	for name, prep := range map[string]func(){
		"another mount": func() { c.mount = "m2" },
		"a damaged file": func() {
			c.mount = "m1"
			os.WriteFile(saved, []byte("{\"mount\": \"m1\", \"files\": [tru"), 0o600)
		},
		"no file": func() { os.Remove(saved) },
	} {
		prep()
		pfs.reads.Store(0)
		if _, _, err := datasetOf(context.Background(), snapOf(), c); err != nil || pfs.reads.Load() != 32 {
			t.Errorf("%s: %v, %d reads; want all 32 read", name, err, pfs.reads.Load())
		}
	}
	// A PFS that stops answering.
	hung := &countingPFS{src: src, hang: true, release: make(chan struct{})}
	defer close(hung.release)
	begin := time.Now()
	_, _, err = datasetOf(context.Background(), snapOf(), identityConfig{pfs: hung, format: "directory", mount: "m3", timeout: 50 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "--dataset-id") {
		t.Errorf("a hung PFS: %v after %v; want an error naming --dataset-id", err, time.Since(begin))
	}
	// A head that could not be read is read again at the next mount; a
	// FIFO or a symlink in the kept file's place is not followed.
	os.Remove(saved)
	flaky := &failingPFS{countingPFS: countingPFS{src: src}, fail: "01"} // among the oldest (00 was rewritten above)
	if _, _, err := datasetOf(context.Background(), snapOf(), identityConfig{pfs: flaky, format: "directory", mount: "m4", saved: saved}); err != nil {
		t.Fatal(err)
	}
	flaky.fail, flaky.reads = "", atomic.Int64{}
	if _, _, err := datasetOf(context.Background(), snapOf(), identityConfig{pfs: flaky, format: "directory", mount: "m4", saved: saved}); err != nil || flaky.reads.Load() != 1 {
		t.Errorf("after a failed head read: %v, %d reads; want that one read again", err, flaky.reads.Load())
	}
	os.Remove(saved)
	if err := syscall.Mkfifo(saved, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := datasetOf(context.Background(), snapOf(), c); err != nil { // returns: the FIFO is not opened for reading
		t.Errorf("a FIFO in the kept file's place: %v", err)
	}
	os.Remove(saved)
	// An operator's id reads nothing.
	pfs.reads.Store(0)
	if _, _, err := datasetOf(context.Background(), snapOf(), identityConfig{pfs: pfs, format: "directory", operatorID: "imagenet"}); err != nil || pfs.reads.Load() != 0 {
		t.Errorf("--dataset-id: %v, %d reads", err, pfs.reads.Load())
	}
}

// failingPFS fails reads of one path.
type failingPFS struct {
	countingPFS
	fail string
}

func (p *failingPFS) ReadAt(path string, want source.Version, b []byte, off int64) (int, error) {
	if path == p.fail {
		p.reads.Add(1)
		return 0, fmt.Errorf("a transient error")
	}
	return p.countingPFS.ReadAt(path, want, b, off)
}

// TestWaitSource: a call into SOURCE that never returns is said, then
// given up when the start-up context ends; one that returns is waited for.
func TestWaitSource(t *testing.T) {
	var logged bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logged}, nil))
	ctx, cancel := context.WithCancel(context.Background())
	hung := make(chan struct{})
	defer close(hung)
	ended := make(chan error, 1)
	go func() { ended <- waitSource(ctx, log, "opening SOURCE", func() error { <-hung; return nil }) }()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		said := strings.Contains(logged.String(), "waiting for SOURCE to answer") && strings.Contains(logged.String(), "opening SOURCE")
		mu.Unlock()
		if said {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("waitSource never said what it waits on")
		}
	}
	cancel()
	if err := <-ended; !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "opening SOURCE") {
		t.Errorf("waitSource after its context ended = %v; want context.Canceled naming the wait", err)
	}
	want := errors.New("no such dataset")
	if err := waitSource(context.Background(), log, "x", func() error { return want }); err != want {
		t.Errorf("waitSource = %v; want fn's error", err)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
