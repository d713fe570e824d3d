// Package npy writes and reads the header of NumPy's .npy format (format
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
	"errors"
	"fmt"
	"regexp"
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

// Info is what a header says.
type Info struct {
	Descr  string
	Shape  []int
	Offset int // where the data starts
}

// ErrFormat wraps every error about bytes that are not a .npy header.
var ErrFormat = errors.New("npy: bad header")

var dictRE = regexp.MustCompile(`^\{'descr': '([<>|=][a-zA-Z][0-9]+)', 'fortran_order': False, 'shape': \(([0-9, ]*)\), *\} *\n$`)

// Parse reads a version 1.0 header of the form Header writes (C order).
// It never panics.
func Parse(b []byte) (Info, error) {
	if len(b) < 10 || string(b[:6]) != magic {
		return Info{}, fmt.Errorf("%w: no \\x93NUMPY magic", ErrFormat)
	}
	if b[6] != 1 || b[7] != 0 {
		return Info{}, fmt.Errorf("%w: version %d.%d, want 1.0", ErrFormat, b[6], b[7])
	}
	n := int(binary.LittleEndian.Uint16(b[8:]))
	if len(b) < 10+n {
		return Info{}, fmt.Errorf("%w: header of %d bytes in %d", ErrFormat, n, len(b))
	}
	m := dictRE.FindStringSubmatch(string(b[10 : 10+n]))
	if m == nil {
		return Info{}, fmt.Errorf("%w: header dict %q", ErrFormat, b[10:10+n])
	}
	info := Info{Descr: m[1], Offset: 10 + n, Shape: []int{}}
	for _, f := range strings.Split(m[2], ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		d, err := strconv.Atoi(f)
		if err != nil || d < 0 {
			return Info{}, fmt.Errorf("%w: dimension %q", ErrFormat, f)
		}
		info.Shape = append(info.Shape, d)
	}
	return info, nil
}
