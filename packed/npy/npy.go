// Package npy writes the header of NumPy's .npy format (format
// version 1.0): the magic "\x93NUMPY", the version, a little-endian uint16
// header length, then a Python dict literal
//
//	{'descr': '<f4', 'fortran_order': False, 'shape': (32, 32, 3), }
//
// padded with spaces and ended by a newline so that the data starts at a
// multiple of 64 bytes. The data follows in C order.
package npy

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
)

const magic = "\x93NUMPY"

// Header returns the .npy header of a C-order array with the dtype descr
// (such as "<f4" or "|u1") and shape; an empty shape is a scalar.
func Header(descr string, shape []int) []byte {
	dims := make([]string, len(shape))
	for i, d := range shape {
		dims[i] = strconv.Itoa(d)
	}
	tuple := "(" + strings.Join(dims, ", ") + ")"
	if len(shape) == 1 {
		tuple = "(" + dims[0] + ",)"
	}
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, tuple)
	total := 10 + len(dict) + 1
	pad := (64 - total%64) % 64
	b := append([]byte(magic), 1, 0)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(dict)+pad+1))
	b = append(b, dict...)
	b = append(b, strings.Repeat(" ", pad)...)
	return append(b, '\n')
}
