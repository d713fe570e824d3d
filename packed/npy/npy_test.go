package npy

import (
	"encoding/binary"
	"strings"
	"testing"
)

// TestHeader: the magic, version 1.0, the little-endian length of what
// follows, the dict numpy writes, then spaces and a newline up to a
// multiple of 64 bytes.
func TestHeader(t *testing.T) {
	for _, c := range []struct {
		descr string
		shape []int
		dict  string
	}{
		{"<f4", []int{32, 32, 3}, "{'descr': '<f4', 'fortran_order': False, 'shape': (32, 32, 3), }"},
		{"|u1", []int{7}, "{'descr': '|u1', 'fortran_order': False, 'shape': (7,), }"},
		{">i8", nil, "{'descr': '>i8', 'fortran_order': False, 'shape': (), }"},
		{"<f8", []int{1, 2, 3, 4, 5, 6}, "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2, 3, 4, 5, 6), }"},
	} {
		h := Header(c.descr, c.shape)
		if len(h)%64 != 0 || h[len(h)-1] != '\n' {
			t.Errorf("%v: header of %d bytes", c.shape, len(h))
		}
		if string(h[:8]) != magic+"\x01\x00" || int(binary.LittleEndian.Uint16(h[8:])) != len(h)-10 {
			t.Errorf("%v: prefix %q", c.shape, h[:10])
		}
		if rest := string(h[10:]); !strings.HasPrefix(rest, c.dict) || strings.Trim(rest[len(c.dict):], " ") != "\n" {
			t.Errorf("%v: dict %q, want %q padded with spaces and a newline", c.shape, rest, c.dict)
		}
	}
}
