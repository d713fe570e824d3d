//go:build !cgo || nohdf5

package packed

import (
	"strings"
	"testing"

	"github.com/dlfs/dlfs/source"
)

// TestNoHDF5: a build without HDF5 refuses a SOURCE of HDF5 files with
// one line that names the file and the build, instead of showing an empty
// tree.
func TestNoHDF5(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "train.h5", []byte("\x89HDF\r\n\x1a\n"))
	write(t, dir, "val.h5", []byte("\x89HDF\r\n\x1a\n"))
	s, err := source.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d, err := Open(dir, s, Config{})
	if err == nil || d != nil {
		t.Fatalf("Open = %v, %v; want an error", d, err)
	}
	for _, want := range []string{`"train.h5 and 1 more"`, "built without HDF5", "-tags nohdf5"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %s: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error is not one line: %q", err)
	}
}
