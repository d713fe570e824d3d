package loader

import (
	"context"
	"fmt"
	"testing"

	"github.com/dlfs/dlfs/ramcache"
)

// BenchmarkReadMiss is the loader's own cost of a read that misses RAM
// and goes to SOURCE (an in-memory one here): the fetch, its deadline's
// goroutine (deadline.go), the checksum and the copy.
func BenchmarkReadMiss(b *testing.B) {
	files := map[string][]byte{}
	for i := range 1000 {
		files[fmt.Sprint(i)] = data(110 << 10)
	}
	pfs := &fakePFS{files: files}
	l := New(DefaultConfig(), ramcache.New(ramcache.Config{Capacity: 1}), nil, pfs)
	buf := make([]byte, 110<<10)
	b.SetBytes(110 << 10)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := l.ReadAt(context.Background(), entry(fmt.Sprint(i%1000), 110<<10), buf, 0); err != nil {
			b.Fatal(err)
		}
	}
}
