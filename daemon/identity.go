package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/dlfs/dlfs/atomicfile"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/loader"
)

// The dataset's identity (package integrity) hashes the heads of its
// oldest files, read from SOURCE at mount. Their digests are kept beside
// the SSD tier (identityFile, bound to SOURCE as this host mounts it), so
// that a remount whose oldest files are as they were, inode included,
// reads none of them again.

// identityFile is the kept digests' name in the SSD tier's directory.
const identityFile = "identity.json"

// maxIdentityFile bounds what is read of it: IdentityFiles entries fit
// in a few KiB; anything larger is not ours.
const maxIdentityFile = 64 << 10

// identityConfig is what datasetOf needs.
type identityConfig struct {
	pfs        loader.PFS
	format     string
	operatorID string
	timeout    time.Duration // for the heads' reads; 0: a minute
	mount      string        // integrity.MountOf
	saved      string        // where the digests are kept; "" keeps none
	// check, if set, asks SOURCE whether a file is as the catalog has it
	// (catalog.Check): a saved catalog's oldest files are checked before
	// they are trusted, and one behind SOURCE fails datasetOf.
	check func(context.Context, *catalog.Entry) error
	log   *slog.Logger // what start-up waits on; nil: discard
}

// savedHeads is identityFile's contents.
type savedHeads struct {
	Mount string      `json:"mount"`
	Files []savedHead `json:"files"`
}

type savedHead struct {
	Path  string `json:"path"`
	Size  int64  `json:"size"`
	Mtime int64  `json:"mtime"`
	Ctime int64  `json:"ctime"`
	Ino   uint64 `json:"ino"`
	Sum   uint64 `json:"sum"`
	Read  bool   `json:"read"`
}

// datasetOf is the identity of the dataset in snap, as every host
// mounting it computes it. It checks the oldest files against SOURCE
// (c.check), then reads from c.pfs the heads of those it has no kept
// digest for, giving up after c.timeout or when ctx ends; saveErr is a
// failure to keep them for the next mount, which changes nothing now.
func datasetOf(ctx context.Context, snap *catalog.Snapshot, c identityConfig) (_ integrity.Dataset, saveErr, err error) {
	var id integrity.Identifier
	if c.operatorID != "" {
		return id.Dataset(c.format, c.operatorID, nil), nil, nil
	}
	snap.Walk(func(e *catalog.Entry) {
		if e.IsRegular() {
			id.Add(e)
		}
	})
	kept := loadHeads(c.saved, c.mount)
	heads := map[integrity.File]uint64{}
	var toRead []*catalog.Entry
	var out savedHeads
	for _, f := range id.Oldest() {
		e := f.(*catalog.Entry)
		if c.check != nil {
			if err := c.check(ctx, e); err != nil {
				return 0, nil, fmt.Errorf("daemon: the dataset's identity: %w", err)
			}
		}
		v := e.Version()
		h, ok := kept[e.Path()]
		if ok && h.Read && h.Size == v.Size && h.Mtime == v.Mtime && h.Ctime == v.Ctime && h.Ino == v.Ino {
			heads[f] = h.Sum
			out.Files = append(out.Files, h)
		} else { // a head that could not be read is tried again: the other hosts may have it
			toRead = append(toRead, e)
		}
	}
	read, err := readHeads(ctx, toRead, c)
	if err != nil {
		return 0, nil, err
	}
	for _, e := range toRead {
		v := e.Version()
		h := savedHead{Path: e.Path(), Size: v.Size, Mtime: v.Mtime, Ctime: v.Ctime, Ino: v.Ino}
		if sum, ok := read[e]; ok {
			heads[e], h.Sum, h.Read = sum, sum, true
		}
		out.Files = append(out.Files, h)
	}
	if c.saved != "" && len(toRead) > 0 {
		out.Mount = c.mount
		if saveErr = os.MkdirAll(filepath.Dir(c.saved), 0o700); saveErr == nil { // the SSD tier makes it later otherwise
			saveErr = atomicfile.Write(c.saved, "."+identityFile+"-", func(w io.Writer) error { return json.NewEncoder(w).Encode(out) })
		}
	}
	return id.Dataset(c.format, c.operatorID, heads), saveErr, nil
}

// loadHeads returns the kept digests by path, if path holds some for
// mount; none for a file missing, damaged or of another mount.
func loadHeads(path, mount string) map[string]savedHead {
	if path == "" {
		return nil
	}
	// Not a FIFO that would block the mount, nor a symlink: a regular file.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	var s savedHeads
	if err := json.NewDecoder(io.LimitReader(f, maxIdentityFile)).Decode(&s); err != nil || s.Mount != mount {
		return nil
	}
	out := make(map[string]savedHead, len(s.Files))
	for _, h := range s.Files {
		out[h.Path] = h
	}
	return out
}

// readHeads reads the first integrity.HeadBytes of each file from
// c.pfs, in one goroutine: on a PFS that stops answering it is abandoned
// (a read of SOURCE cannot be interrupted) and the mount fails. A file
// that cannot be read has no digest (it counts as unread).
func readHeads(ctx context.Context, files []*catalog.Entry, c identityConfig) (map[*catalog.Entry]uint64, error) {
	out := map[*catalog.Entry]uint64{}
	if len(files) == 0 {
		return out, nil
	}
	timeout := c.timeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	type head struct {
		e   *catalog.Entry
		sum uint64
		ok  bool
	}
	got := make(chan head, len(files))
	go func() {
		for _, e := range files {
			b := make([]byte, min(e.Size, integrity.HeadBytes))
			k, err := c.pfs.ReadAt(e.Path(), e.Version(), b, 0)
			got <- head{e, integrity.HeadSum(b), err == nil && k == len(b)}
		}
	}()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTimer(time.Second) // said at once, then every waitLogEvery
	defer tick.Stop()
	start := time.Now()
	for done := 0; done < len(files); {
		select {
		case h := <-got:
			done++
			if h.ok {
				out[h.e] = h.sum
			}
		case <-tick.C: // what the mount waits on, said while it waits (files are read in order)
			c.logger().Warn("waiting for SOURCE to answer a read of one of its oldest files (the dataset's identity)",
				"path", files[done].Path(), "waited_seconds", int(time.Since(start).Seconds()), "gives_up_after", timeout)
			tick.Reset(waitLogEvery)
		case <-deadline.C:
			return nil, fmt.Errorf("daemon: SOURCE did not answer reads of its oldest files (for the dataset's identity) within %v: check the PFS, or give --dataset-id", timeout)
		case <-ctx.Done():
			return nil, fmt.Errorf("daemon: reading the oldest files of SOURCE (for the dataset's identity): %w", ctx.Err())
		}
	}
	return out, nil
}

// waitLogEvery is how often start-up says what of SOURCE it waits on.
const waitLogEvery = 10 * time.Second

func (c identityConfig) logger() *slog.Logger {
	if c.log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.log
}

// removeIdentityTemps removes a killed daemon's half-written identityFile.
func removeIdentityTemps(dir string) ([]string, error) {
	removed, err := atomicfile.RemoveStale(dir, "."+identityFile+"-")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return removed, err
}

// waitSource runs fn, which asks SOURCE something that cannot be
// interrupted, and waits for it until ctx ends, saying at once and then
// every waitLogEvery what it waits on. When ctx ends first, fn is left
// behind (the process is stopping) and ctx's error returned.
func waitSource(ctx context.Context, log *slog.Logger, what string, fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	tick := time.NewTimer(time.Second)
	defer tick.Stop()
	start := time.Now()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			log.Warn("waiting for SOURCE to answer", "what", what, "waited_seconds", int(time.Since(start).Seconds()))
			tick.Reset(waitLogEvery)
		case <-ctx.Done():
			return fmt.Errorf("daemon: %s: %w", what, ctx.Err())
		}
	}
}
