//go:build cgo && !nohdf5

package packed

// HDF5 says whether this build reads HDF5 files: it does unless built
// with -tags nohdf5 or CGO_ENABLED=0 (the static build, make static),
// since the HDF5 library is C.
const HDF5 = true

// noHDF5 is never called in this build: Open checks HDF5 first.
func noHDF5([]string) error { return nil }
