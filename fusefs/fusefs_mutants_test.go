package fusefs

// Tests written against the mutants gremlins left alive (make mutate,
// docs/mutation.md). They use the package's own API only (no helper of
// the other test files), with a dataset that embeds the Dataset interface
// and serves a scanned snapshot.

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dlfs/dlfs/accesslog"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/latency"
)

// TestFillAttr: st_blocks counts 512-byte units, rounded up, and the times
// split into seconds and nanoseconds.
func TestFillAttr(t *testing.T) {
	for size, blocks := range map[int64]uint64{0: 0, 1: 1, 511: 1, 512: 1, 513: 2, 4096: 8, 1<<40 + 1: 1<<31 + 1} {
		var a fuse.Attr
		fillAttr(&catalog.Entry{Ino: 9, Mode: syscall.S_IFREG | 0o644, Size: size}, &a)
		if a.Blocks != blocks || a.Size != uint64(size) || a.Ino != 9 || a.Nlink != 1 {
			t.Errorf("size %d: %d blocks, size %d, ino %d, nlink %d; want %d blocks", size, a.Blocks, a.Size, a.Ino, a.Nlink, blocks)
		}
	}
	var a fuse.Attr
	fillAttr(&catalog.Entry{Mode: syscall.S_IFDIR | 0o755, Mtime: 1_700_000_000_123_456_789}, &a)
	if a.Mtime != 1_700_000_000 || a.Mtimensec != 123_456_789 || a.Ctime != a.Mtime || a.Atimensec != a.Mtimensec || a.Nlink != 2 {
		t.Fatalf("times %d.%09d (ctime %d, atime ns %d), nlink %d", a.Mtime, a.Mtimensec, a.Ctime, a.Atimensec, a.Nlink)
	}
}

// snapData is a Dataset serving a snapshot, with SOURCE at dir; its
// other methods are not called by these tests.
type snapData struct {
	Dataset
	snap *catalog.Snapshot
	dir  string
}

func (d snapData) Snapshot() *catalog.Snapshot { return d.snap }
func (d snapData) Source() string              { return d.dir }

// scanned scans a tree of a file, a directory and a symlink.
func scanned(t *testing.T) *catalog.Snapshot {
	t.Helper()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "f.jpg"), []byte("bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f.jpg", filepath.Join(root, "l")); err != nil {
		t.Fatal(err)
	}
	c, err := catalog.Open(context.Background(), catalog.DefaultConfig(root))
	if err != nil {
		t.Fatal(err)
	}
	return c.Snapshot()
}

// TestAccessLogOffsets: only reads (and listings) carry an offset in the
// access log; every other request's line has none.
func TestAccessLogOffsets(t *testing.T) {
	snap := scanned(t)
	alog := accesslog.New(accesslog.Config{PollInterval: time.Millisecond})
	r, w := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opened := false
	go alog.Run(ctx, func() (io.WriteCloser, error) {
		if opened {
			return nil, syscall.ENXIO
		}
		opened = true
		return w, nil
	})
	deadline := time.Now().Add(10 * time.Second)
	for !alog.Active() {
		if time.Now().After(deadline) {
			t.Fatal("the access log never attached")
		}
		time.Sleep(time.Millisecond)
	}
	f := New(Config{AccessLog: alog}, snapData{snap: snap, dir: t.TempDir()}, nil)
	file, dir, link := snap.Lookup("f.jpg"), snap.Lookup("d"), snap.Lookup("l")
	hdr := func(ino uint64) fuse.InHeader { return fuse.InHeader{NodeId: ino} }
	var entry fuse.EntryOut
	var attr fuse.AttrOut
	var open fuse.OpenOut
	h := hdr(catalog.RootIno)
	f.Lookup(nil, &h, "f.jpg", &entry)
	f.GetAttr(nil, &fuse.GetAttrIn{InHeader: hdr(file.Ino)}, &attr)
	f.SetAttr(nil, &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{InHeader: hdr(file.Ino)}}, &attr)
	f.Open(nil, &fuse.OpenIn{InHeader: hdr(file.Ino)}, &open)
	lh := hdr(link.Ino)
	f.Readlink(nil, &lh)
	f.OpenDir(nil, &fuse.OpenIn{InHeader: hdr(dir.Ino)}, &open)
	f.ReleaseDir(&fuse.ReleaseIn{InHeader: hdr(dir.Ino), Fh: open.Fh})
	var statfs fuse.StatfsOut
	f.StatFs(nil, &h, &statfs)
	ops := map[string]bool{}
	sc := bufio.NewScanner(r)
	for len(ops) < 8 && sc.Scan() {
		line := sc.Text()
		op := ""
		for _, field := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(field, "op="); ok {
				op = v
			}
		}
		ops[op] = true
		if strings.Contains(line, " offset=") {
			t.Errorf("%s carries an offset: %s", op, line)
		}
	}
	for _, op := range []string{"lookup", "getattr", "setattr", "open", "readlink", "opendir", "releasedir", "statfs"} {
		if !ops[op] {
			t.Errorf("no line for %s (got %v)", op, ops)
		}
	}
}

// TestLatencyObserved: with Latency set, every request is timed into its
// operation's histogram, whether or not the access log is read.
func TestLatencyObserved(t *testing.T) {
	snap := scanned(t)
	vec := latency.NewVec("test_seconds", "test", "op", 0)
	f := New(Config{Latency: vec}, snapData{snap: snap}, nil)
	for o := range numOps {
		if f.hist[o] == nil {
			t.Fatalf("no histogram for %s", opNames[o])
		}
	}
	var attr fuse.AttrOut
	f.GetAttr(nil, &fuse.GetAttrIn{InHeader: fuse.InHeader{NodeId: catalog.RootIno}}, &attr)
	if got := vec.With("getattr").Summary().Count; got != 1 {
		t.Fatalf("getattr observed %d times, want 1", got)
	}
	if none := New(Config{}, snapData{snap: snap}, nil); !none.begin().IsZero() {
		t.Fatal("requests timed with nothing watching")
	}
}

// TestNewUsesTheLogger: the logger given is the one used; none given,
// nothing is logged and nothing fails.
func TestNewUsesTheLogger(t *testing.T) {
	l := slog.New(slog.NewTextHandler(io.Discard, nil))
	if f := New(Config{Logger: l}, nil, nil); f.log != l {
		t.Fatal("the logger given was replaced")
	}
	if f := New(Config{}, nil, nil); f.log == nil {
		t.Fatal("no logger when none was given")
	}
}

// TestInvalidateUnmounted: a refresh's diff before the mount (or after
// it went) changes nothing and does not fail.
func TestInvalidateUnmounted(t *testing.T) {
	snap := scanned(t)
	f := New(Config{}, snapData{snap: snap}, nil)
	f.Invalidate(catalog.Diff{Changed: []*catalog.Entry{snap.Lookup("f.jpg"), snap.Root}, Removed: []*catalog.Entry{snap.Lookup("d")}, Added: []*catalog.Entry{snap.Lookup("l")}})
}
