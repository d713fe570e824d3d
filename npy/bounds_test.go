package npy

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestParseBounds: every check of Parse at its limit and one past it.
func TestParseBounds(t *testing.T) {
	good := Header("<f4", []int{2, 3})
	info, err := Parse(good)
	if err != nil || info.Offset != len(good) || len(good)%64 != 0 {
		t.Fatalf("%+v, %v", info, err)
	}
	// The declared header length exactly fits what is given; one byte
	// short is refused.
	if _, err := Parse(good[:len(good)-1]); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), fmt.Sprintf("header of %d bytes in %d", len(good)-10, len(good)-1)) {
		t.Errorf("one byte short: %v", err)
	}
	v2 := append([]byte(nil), good...)
	v2[6] = 2
	v11 := append([]byte(nil), good...)
	v11[7] = 1
	dims := func(s string) []byte {
		d := "{'descr': '<f4', 'fortran_order': False, 'shape': (" + s + "), }\n"
		return append([]byte(magic+"\x01\x00"), append([]byte{byte(len(d)), byte(len(d) >> 8)}, d...)...)
	}
	for name, c := range map[string]struct {
		b    []byte
		want string
	}{
		"9 bytes":         {good[:9], "magic"},
		"bad magic":       {append([]byte("\x93NUMPX"), good[6:]...), "magic"},
		"version 2.0":     {v2, "version 2.0"},
		"version 1.1":     {v11, "version 1.1"},
		"fortran order":   {[]byte(strings.Replace(string(good), "False", "True ", 1)), "header dict"},
		"no newline":      {[]byte(strings.TrimSuffix(string(good), "\n") + " "), "header dict"},
		"a negative dim":  {dims("-1,"), "header dict"},
		"a huge dim":      {dims("99999999999999999999,"), "dimension"},
		"a bad descr":     {[]byte(strings.Replace(string(good), "'<f4'", "'f4' ", 1)), "header dict"},
		"length past end": {append(append([]byte(magic+"\x01\x00"), 0xff, 0xff), good[10:]...), "header of 65535 bytes"},
	} {
		if _, err := Parse(c.b); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrFormat saying %q", name, err, c.want)
		}
	}
	for s, want := range map[string]int{"": 0, "0,": 1, "1, 2, 3": 3, "9223372036854775807,": 1} {
		info, err := Parse(dims(s))
		if err != nil || len(info.Shape) != want {
			t.Errorf("shape (%s): %+v, %v", s, info, err)
		}
	}
}
