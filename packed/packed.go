// Package packed shows packed datasets as trees of ordinary per-sample
// files, so that a script written for a directory of images runs on them
// unchanged.
//
// # Formats
//
// Open recognises SOURCE by what it holds:
//
//   - a seqfile pack (index.seqidx, made by "dlfs pack") shows the tree
//     that was packed: the same paths, sizes, modes and bytes;
//   - MXNet RecordIO (*.rec, as im2rec writes them) shows each image as
//     LABEL/ID.jpg, so ImageFolder finds the classes;
//   - HDF5 files (*.h5, *.hdf5) show each numeric dataset of shape
//     (N, ...) as a directory of N .npy files, one per row.
//
// A Dataset lists the tree (catalog.Lister) and reads sample bytes by path
// (the loader's PFS), so packed samples go through the same tiers,
// prefetching and cluster as files do.
//
// # Reads
//
// Containers (shards) are opened once, through source.Source, so every
// open stays confined to SOURCE and every read is counted as PFS traffic.
// A read of a whole sample checks its checksum, where the format has one:
// a corrupt record is an error naming the container and offset, never
// wrong bytes.
package packed

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/source"
)

// Dataset is a packed dataset seen as a tree of files.
type Dataset interface {
	catalog.Lister
	// ReadAt reads the sample at path, whose identity the caller expects
	// to be want, as the loader reads files.
	ReadAt(path string, want source.Version, p []byte, off int64) (int, error)
	// Kind names the format, for stats and logs.
	Kind() string
	// Close closes the containers.
	Close() error
}

// ErrFormat wraps errors about containers that are not what they claim.
var ErrFormat = errors.New("packed: bad container")

// tooMany is the error of a dataset that lists more than max samples.
func tooMany(what string, n uint64, max int) error {
	return fmt.Errorf("%w: %s lists %d samples, more than %d; the catalog keeps about 120 bytes of RAM for each: raise --max-files if the memory is there",
		catalog.ErrTooMany, what, n, max)
}

// Config configures Open.
type Config struct {
	// MaxEntries bounds the samples a dataset may list: a crafted file
	// can claim billions of rows in a few bytes. The catalog's bound.
	MaxEntries int          // default catalog.DefaultMaxEntries
	Logger     *slog.Logger // nil: discard
}

// Open returns the packed dataset at dir, read through src, or nil when
// dir is a plain directory tree.
func Open(dir string, src *source.Source, cfg Config) (Dataset, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = catalog.DefaultMaxEntries
	}
	log := cfg.Logger
	if _, err := os.Stat(filepath.Join(dir, seqIndexName)); err == nil {
		d, err := openSeq(src, cfg.MaxEntries)
		if err != nil {
			return nil, err // not a typed nil in the interface
		}
		return d, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("packed: %w", err)
	}
	recs, err := topFiles(dir, ".rec")
	if err != nil {
		return nil, fmt.Errorf("packed: %w", err)
	}
	if len(recs) > 0 {
		return openRec(src, recs, log, cfg.MaxEntries), nil
	}
	h5s, err := topFiles(dir, ".h5", ".hdf5")
	if err != nil {
		return nil, fmt.Errorf("packed: %w", err)
	}
	if len(h5s) > 0 {
		if !HDF5 {
			return nil, noHDF5(h5s)
		}
		return openH5(src, h5s, log, cfg.MaxEntries), nil
	}
	return nil, nil
}

// runPart is one sample of a run: where its bytes lie in the container.
type runPart struct {
	path     string
	off, len int64
}

// readRun reads parts, in offset order in h's container, with one read
// from the first's start to the last's end, and returns each one's bytes.
func readRun(h *source.Handle, parts []runPart) ([][]byte, error) {
	if len(parts) == 0 {
		return nil, nil
	}
	start, end := parts[0].off, parts[0].off
	for i, p := range parts {
		if i > 0 && p.off < parts[i-1].off {
			return nil, fmt.Errorf("packed: run out of offset order at %s", p.path)
		}
		end = max(end, p.off+p.len)
	}
	if end > h.Size() {
		return nil, fmt.Errorf("%w: %s: a run ends at %d, past the end of the file (%d bytes); it is truncated", ErrFormat, h.Path(), end, h.Size())
	}
	buf := make([]byte, end-start)
	if n, err := h.ReadAt(buf, start); err != nil && !(errors.Is(err, io.EOF) && int64(n) == end-start) {
		return nil, err
	}
	out := make([][]byte, len(parts))
	for i, p := range parts {
		out[i] = buf[p.off-start : p.off-start+p.len : p.off-start+p.len]
	}
	return out, nil
}
