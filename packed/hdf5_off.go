//go:build !cgo || nohdf5

package packed

import (
	"fmt"
	"log/slog"

	"github.com/dlfs/dlfs/source"
)

// HDF5 says whether this build reads HDF5 files: this one, built with
// -tags nohdf5 or CGO_ENABLED=0 (the static build, make static), does
// not, since the HDF5 library is C.
const HDF5 = false

// noHDF5 is Open's error for a SOURCE holding the HDF5 files names.
func noHDF5(names []string) error {
	n := names[0]
	if len(names) > 1 {
		n += fmt.Sprintf(" and %d more", len(names)-1)
	}
	return fmt.Errorf("packed: SOURCE holds HDF5 files (%q), but this dlfs was built without HDF5 (the static build: -tags nohdf5 or CGO_ENABLED=0); mount it with a dlfs built with HDF5 (make build, with libhdf5-dev installed)", n)
}

// openH5 is never called in this build: Open checks HDF5 first.
func openH5(*source.Source, []string, *slog.Logger, int) Dataset { return nil }
