// Package datagen writes synthetic datasets for tests and benchmarks: an
// ImageFolder-like tree of class directories holding files of random bytes
// whose sizes spread around a mean, as JPEGs of ImageNet do.
package datagen

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
)

// Spec describes a dataset.
type Spec struct {
	Classes  int   // class directories
	Files    int   // files in all
	MeanSize int64 // mean file size in bytes
	Spread   int64 // sizes are uniform in [MeanSize-Spread, MeanSize+Spread]
	Seed     uint64
	Ext      string // file extension; default ".jpg"
}

// File is one generated file.
type File struct {
	Path string // relative, slash-separated
	Size int64
}

// ImageFolder writes the dataset under dir and returns its files in
// generation order. Existing files of the right size are kept, so a second
// call is cheap.
func ImageFolder(dir string, s Spec) ([]File, error) {
	if s.Ext == "" {
		s.Ext = ".jpg"
	}
	if s.Classes <= 0 || s.Files < 0 {
		return nil, fmt.Errorf("datagen: bad spec %+v", s)
	}
	rng := rand.New(rand.NewPCG(s.Seed, 0x646c6673))
	files := make([]File, s.Files)
	for i := range files {
		size := s.MeanSize
		if s.Spread > 0 {
			size += rng.Int64N(2*s.Spread+1) - s.Spread
		}
		files[i] = File{Path: fmt.Sprintf("class_%03d/img_%06d%s", i%s.Classes, i, s.Ext), Size: max(size, 0)}
	}
	for c := 0; c < s.Classes; c++ {
		if err := os.MkdirAll(filepath.Join(dir, fmt.Sprintf("class_%03d", c)), 0o755); err != nil {
			return nil, err
		}
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ferr error
	)
	work := make(chan int)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := writeFile(filepath.Join(dir, files[i].Path), files[i].Size, s.Seed+uint64(i)); err != nil {
					mu.Lock()
					ferr = err
					mu.Unlock()
				}
			}
		}()
	}
	for i := range files {
		work <- i
	}
	close(work)
	wg.Wait()
	return files, ferr
}

func writeFile(path string, size int64, seed uint64) error {
	if fi, err := os.Stat(path); err == nil && fi.Size() == size {
		return nil
	}
	return os.WriteFile(path, Bytes(size, seed), 0o644)
}

// Bytes returns size pseudo-random bytes determined by seed.
func Bytes(size int64, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	b := make([]byte, size)
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}
