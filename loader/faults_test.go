package loader

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/ramcache"
	"github.com/dlfs/dlfs/source"
)

type panickyPFS struct{}

func (panickyPFS) ReadAt(string, source.Version, []byte, int64) (int, error) {
	var b []byte
	return int(b[3]), nil // a decoder's bounds bug on a corrupt record
}

// A panic in a read of SOURCE (a packed format's decoder) fails that read;
// it does not kill the daemon from the read's own goroutine.
func TestPanicInPFSRead(t *testing.T) {
	l := New(Config{}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, panickyPFS{})
	defer l.Close()
	_, err := l.ReadAt(context.Background(), entry("f", 10), make([]byte, 10), 0)
	if err == nil || !strings.Contains(err.Error(), "internal error") {
		t.Fatalf("a read whose decoder panics: %v, want an internal error", err)
	}
}

// hungPacked is a packed SOURCE that never answers until released.
type hungPacked struct {
	*fakePacked
	release chan struct{}
}

func (h *hungPacked) ReadAt(path string, want source.Version, p []byte, off int64) (int, error) {
	<-h.release
	return h.fakePacked.ReadAt(path, want, p, off)
}

func (h *hungPacked) ReadRun(paths []string, wants []source.Version) ([][]byte, error) {
	<-h.release
	return h.fakePacked.ReadRun(paths, wants)
}

// A coalesced read past its deadline fails all its samples at once: they
// are not read again one by one, each waiting as long, while a demand read
// sharing the last of them waits behind all.
func TestTimedOutRunNotRetriedOneByOne(t *testing.T) {
	files := map[string][]byte{}
	var order []string
	var es []*catalog.Entry
	for i := range 20 {
		p := fmt.Sprintf("f%02d", i)
		files[p] = data(100)
		order = append(order, p)
		es = append(es, entry(p, 100))
	}
	pfs := &hungPacked{fakePacked: &fakePacked{fakePFS: &fakePFS{files: files}, order: order}, release: make(chan struct{})}
	defer close(pfs.release)
	l := New(Config{PFSTimeout: 50 * time.Millisecond, PFSCalls: 4}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
	defer l.Close()
	out, err := l.PrefetchRun(context.Background(), es[0], es[1:], func(*catalog.Entry, int64, ramcache.Block) bool { return true })
	if !errors.Is(err, ErrPFSTimeout) && len(out) != 0 {
		t.Errorf("a run on a hung PFS: %v, %v", out, err)
	}
	if got := l.Stats().PFSStuck; got != 1 {
		t.Errorf("%d reads of SOURCE abandoned, want the run's one: its samples were tried again one by one", got)
	}
}

// Reads that keep coming while Close waits for the fetches under way do
// not race it (a WaitGroup reused while waited on panics).
func TestCloseWhileReading(t *testing.T) {
	for range 50 {
		pfs := &fakePFS{files: map[string][]byte{}}
		l := New(Config{}, ramcache.New(ramcache.Config{Capacity: 1 << 20}), nil, pfs)
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					l.ReadAt(context.Background(), entry(fmt.Sprint(i%64, "x", g), 10), make([]byte, 10), 0)
				}
			}()
		}
		l.Close()
		close(stop)
		wg.Wait()
	}
}
