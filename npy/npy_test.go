package npy

import (
	"errors"
	"reflect"
	"testing"
)

func TestHeader(t *testing.T) {
	for _, c := range []struct {
		descr string
		shape []int
	}{{"<f4", []int{32, 32, 3}}, {"|u1", []int{7}}, {">i8", nil}, {"<f8", []int{1, 2, 3, 4, 5, 6}}} {
		h := Header(c.descr, c.shape)
		if len(h)%64 != 0 || h[len(h)-1] != '\n' {
			t.Errorf("%v: header of %d bytes", c, len(h))
		}
		info, err := Parse(h)
		want := c.shape
		if want == nil {
			want = []int{}
		}
		if err != nil || info.Descr != c.descr || !reflect.DeepEqual(info.Shape, want) || info.Offset != len(h) {
			t.Errorf("%v: parsed %+v, %v", c, info, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add(Header("<f4", []int{2, 3}))
	f.Add([]byte("\x93NUMPY\x01\x00\x05\x00{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		info, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatal(err)
			}
			return
		}
		if info.Offset > len(b) {
			t.Fatalf("data offset %d past %d bytes", info.Offset, len(b))
		}
	})
}
