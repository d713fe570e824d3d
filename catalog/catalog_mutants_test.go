package catalog

// Tests written against the mutants gremlins left alive (make mutate,
// docs/mutation.md), on the catalog's configuration and bounds.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestOpenFillsDefaults: zero and negative settings take the defaults;
// the ones given are kept.
func TestOpenFillsDefaults(t *testing.T) {
	root := t.TempDir()
	d := DefaultConfig(root)
	for _, v := range []int{0, -1} {
		c, err := Open(context.Background(), Config{Source: root, ScanWorkers: v, StallTimeout: time.Duration(v), MaxEntries: v})
		if err != nil {
			t.Fatal(err)
		}
		if c.cfg.ScanWorkers != d.ScanWorkers || c.cfg.StallTimeout != d.StallTimeout || c.cfg.MaxEntries != DefaultMaxEntries {
			t.Fatalf("settings of %d: %+v", v, c.cfg)
		}
	}
	c, err := Open(context.Background(), Config{Source: root, ScanWorkers: 3, StallTimeout: time.Hour, MaxEntries: 7})
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.ScanWorkers != 3 || c.cfg.StallTimeout != time.Hour || c.cfg.MaxEntries != 7 {
		t.Fatalf("given settings replaced: %+v", c.cfg)
	}
}

// TestScanEntryBound: a tree of exactly MaxEntries entries below its root
// is scanned; one entry more is refused with ErrTooMany.
func TestScanEntryBound(t *testing.T) {
	root := t.TempDir()
	for _, p := range []string{"a", "b", "d/x"} {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const entries = 4 // a, b, d, d/x
	if _, err := Open(context.Background(), Config{Source: root, MaxEntries: entries}); err != nil {
		t.Fatalf("%d entries under a bound of %d: %v", entries, entries, err)
	}
	if _, err := Open(context.Background(), Config{Source: root, MaxEntries: entries - 1}); !errors.Is(err, ErrTooMany) {
		t.Fatalf("%d entries under a bound of %d: %v, want ErrTooMany", entries, entries-1, err)
	}
}

// fixedLister lists fixed files.
type fixedLister []File

func (l fixedLister) List(context.Context) ([]File, error) { return l, nil }

// TestListerEntryBound: a Lister's listing of exactly MaxEntries files is
// taken; one more is refused with ErrTooMany.
func TestListerEntryBound(t *testing.T) {
	files := fixedLister{{Path: "a", Mode: syscall.S_IFREG | 0o644}, {Path: "b", Mode: syscall.S_IFREG | 0o644}, {Path: "c", Mode: syscall.S_IFREG | 0o644}}
	root := t.TempDir()
	if _, err := Open(context.Background(), Config{Source: root, Lister: files, MaxEntries: 3}); err != nil {
		t.Fatalf("3 files under a bound of 3: %v", err)
	}
	if _, err := Open(context.Background(), Config{Source: root, Lister: files, MaxEntries: 2}); !errors.Is(err, ErrTooMany) {
		t.Fatalf("3 files under a bound of 2: %v, want ErrTooMany", err)
	}
}
