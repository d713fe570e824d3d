//go:build cgo && !nohdf5

package packed

import "github.com/dlfs/dlfs/loader"

var _ loader.Coalescer = (*h5Dataset)(nil)
