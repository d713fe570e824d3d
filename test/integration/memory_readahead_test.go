package integration

// Issue 29: the daemon's memory stays within README's bound with
// read-ahead within files on.

import (
	"cmp"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestMemoryBoundReadAhead: four readers read large files start to end in
// 1 MiB reads, two epochs in shuffled orders, the page cache dropped
// between them so the second reaches the daemon too. They ask read-ahead
// for more than its share of --staging holds (4 readers × --read-ahead
// 4 MiB against a quarter of 32 MiB), so its total bound is what holds
// it. Sampled every 10 ms while they read: read-ahead's held bytes stay
// within its capacity, and the daemon's RSS plus its backing files
// (memfd pages, which RSS does not count) within README's bound,
// --ram-cache + --staging + 256 MiB + 300 bytes per file. Every file
// reads as SOURCE's bytes.
func TestMemoryBoundReadAhead(t *testing.T) {
	const (
		ram, staging, ahead = 64 << 20, 32 << 20, 4 << 20
		readers, files      = 4, 12
	)
	src := t.TempDir()
	sums := map[string][sha256.Size]byte{}
	var names []string
	for i := range files {
		// 8 to 30 MiB, none a whole number of blocks.
		b := randomBytes(8<<20+i*2<<20+i*4099+1, uint64(2900+i))
		name := fmt.Sprintf("shard_%02d.bin", i)
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		names, sums[name] = append(names, name), sha256.Sum256(b)
	}
	bound := int64(ram + staging + 256<<20 + 300*files)
	d := startDlfs(t, src, "--ram-cache", "64MiB", "--staging", "32MiB", "--read-ahead", "4MiB")

	stop, done := make(chan struct{}), make(chan memoryPeaks)
	go sampleMemory(d.Cmd.Process.Pid, d.Mnt, stop, done)
	peaks := sync.OnceValue(func() memoryPeaks { close(stop); return <-done })
	t.Cleanup(func() { peaks() }) // on a failure, before the daemon stops
	for epoch := range 2 {
		if epoch > 0 {
			dropPageCache(t)
		}
		order := append([]string(nil), names...)
		rand.New(rand.NewPCG(uint64(epoch), 29)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		select {
		case err := <-readFiles(d.Mnt, order, readers, sums):
			if err != nil {
				t.Fatalf("epoch %d: %v", epoch, err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("epoch %d: the readers did not finish within 2 minutes", epoch)
		}
	}
	p := peaks()

	st := dlfsStats(t, d.Mnt)
	fetched := num(st, "read_ahead", "fetched_bytes")
	t.Logf("%d samples: peak RSS %.1f MiB, RSS+backing %.1f MiB of a %.1f MiB bound; read-ahead held at most %.1f MiB of %.1f MiB; fetched %.1f MiB, used %.1f MiB, wasted %.1f MiB",
		p.samples, mib(p.rss), mib(p.mem), mib(bound), mib(p.held), mib(p.capacity),
		fetched/(1<<20), num(st, "read_ahead", "used_bytes")/(1<<20), num(st, "read_ahead", "wasted_bytes")/(1<<20))
	if p.err != nil {
		t.Fatalf("sampling: %v", p.err)
	}
	if c, s := num(st, "read_ahead", "capacity_bytes"), num(st, "read_ahead", "stream_bytes"); c != staging/4 || s != ahead {
		t.Errorf("read-ahead capacity %v, per stream %v; want a quarter of --staging, %d, and --read-ahead, %d", c, s, staging/4, ahead)
	}
	// Not vacuous: read-ahead ran, and the samples caught it holding bytes.
	if fetched == 0 || p.held == 0 {
		t.Errorf("nothing was read ahead (%v), or no sample saw it hold bytes (%d samples)", st["read_ahead"], p.samples)
	}
	if p.over > 0 {
		t.Errorf("read-ahead held more than its capacity in %d of %d samples; first: %s", p.over, p.samples, p.firstOver)
	}
	if p.mem > bound {
		t.Errorf("peak RSS + backing files %.1f MiB exceeds README's bound %.1f MiB", mib(p.mem), mib(bound))
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// memoryPeaks is what sampleMemory saw.
type memoryPeaks struct {
	samples        int
	rss, mem       int64 // VmRSS, and VmRSS + the backing files' bytes
	held, capacity int64 // read-ahead's
	over           int   // samples with held > capacity
	firstOver      string
	err            error // the first failed read of /proc or the stats
}

// sampleMemory samples the daemon pid's memory and mnt's read-ahead
// figures every 10 ms until stop closes, then sends the peaks on done.
// The ticker paces measurement; nothing waits on it for a condition.
func sampleMemory(pid int, mnt string, stop <-chan struct{}, done chan<- memoryPeaks) {
	var p memoryPeaks
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		rss, _ := memory(pid)
		st, err := readStats(mnt)
		switch {
		case err != nil:
			p.err = cmp.Or(p.err, err)
		case rss == 0:
			p.err = cmp.Or(p.err, fmt.Errorf("no VmRSS for pid %d", pid))
		default:
			backing := int64(num(st, "passthrough", "backing_bytes") + num(st, "passthrough", "evicted_open_bytes"))
			held, capacity := int64(num(st, "read_ahead", "held_bytes")), int64(num(st, "read_ahead", "capacity_bytes"))
			p.samples++
			p.rss, p.mem = max(p.rss, rss), max(p.mem, rss+backing)
			p.held, p.capacity = max(p.held, held), max(p.capacity, capacity)
			if held > capacity {
				if p.over++; p.over == 1 {
					p.firstOver = fmt.Sprintf("%d bytes held, capacity %d", held, capacity)
				}
			}
		}
		select {
		case <-stop:
			done <- p
			return
		case <-tick.C:
		}
	}
}

// readStats is dlfsStats for a goroutine other than the test's.
func readStats(mnt string) (map[string]any, error) {
	b, err := os.ReadFile(filepath.Join(mnt, ".dlfs/stats"))
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	return m, nil
}

// readFiles reads the files of order under root, start to end in 1 MiB
// reads, with readers goroutines taking them in turn, and checks each
// against its SHA-256 in sums. The channel it returns gets the first
// error, or nil, once all of them are done.
func readFiles(root string, order []string, readers int, sums map[string][sha256.Size]byte) <-chan error {
	next := make(chan string, len(order))
	for _, f := range order {
		next <- f
	}
	close(next)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1<<20)
			for rel := range next {
				if err := readSum(filepath.Join(root, rel), buf, sums[rel]); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	out := make(chan error, 1)
	go func() {
		wg.Wait()
		out <- errors.Join(errs...)
	}()
	return out
}

// readSum reads path in reads of len(buf) bytes and compares its SHA-256
// with want.
func readSum(path string, buf []byte, want [sha256.Size]byte) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, struct{ io.Reader }{f}, buf) // the wrapper keeps CopyBuffer from using WriterTo
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if [sha256.Size]byte(h.Sum(nil)) != want {
		return fmt.Errorf("%s: %d bytes read differ from SOURCE's", path, n)
	}
	return nil
}
