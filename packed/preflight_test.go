//go:build cgo && !nohdf5

package packed

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/dlfs/dlfs/source"
)

// An HDF5 file on which libhdf5 crashes (a SIGSEGV in H5Gget_info, found
// by FuzzHDF5Listing) is left out of the listing with one log line, after
// a child process crashed on it in the daemon's place; the good file
// beside it is listed and read.
func TestCrashingHDF5IsLeftOut(t *testing.T) {
	dir := t.TempDir()
	for name, from := range map[string]string{"a.h5": "testdata/small.h5", "b.h5": "testdata/crash-h5gget-info.h5"} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		write(t, dir, name, b)
	}
	s, err := source.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var logs bytes.Buffer
	d, err := Open(dir, s, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil || d == nil {
		t.Fatalf("open: %v", err)
	}
	defer d.Close()
	files, err := d.List(context.Background())
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	rows := 0
	for _, f := range files {
		if strings.HasPrefix(f.Path, "b/") || f.Path == "b" {
			t.Errorf("the crashing file is listed: %s", f.Path)
		}
		if strings.HasSuffix(f.Path, ".npy") {
			rows++
			buf := make([]byte, f.Size)
			if n, err := d.ReadAt(f.Path, source.Version{Size: f.Size, Mtime: f.Mtime, Ctime: f.Ctime, Ino: f.Ino}, buf, 0); err != nil || int64(n) != f.Size {
				t.Errorf("read %s: %d bytes, %v", f.Path, n, err)
			}
		}
	}
	if rows == 0 {
		t.Error("nothing of the good file is listed")
	}
	c := 0
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "crashes or hangs") {
			c++
		}
	}
	if c != 1 {
		t.Errorf("%d log lines about the crashing file, want 1:\n%s", c, logs.String())
	}
	if !strings.Contains(logs.String(), "b.h5") {
		t.Errorf("the log line does not name the file:\n%s", logs.String())
	}
}
