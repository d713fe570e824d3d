// Package verify reads a dataset the way a training job does and checks
// every byte: for tests and benchmarks that run readers inside test-bed
// hosts (package testbed), as child processes.
//
// WriteSums records each file's SHA-256 in a list of "PATH SHA256" lines;
// Read reads every listed file under a root with a few threads, in an
// order shuffled by a seed, and counts the files read right and the
// failures (an error, or bytes whose digest differs), naming the first.
package verify

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Result is what a Read found.
type Result struct {
	Files  int    `json:"files"`  // read, every byte right
	Bytes  int64  `json:"bytes"`  // of those
	Errors int    `json:"errors"` // failed or wrong
	First  string `json:"first,omitempty"`
}

// WriteSums writes to out the "PATH SHA256" lines of files (relative to
// dir).
func WriteSums(dir string, files []string, out string) error {
	var s strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		h := sha256.Sum256(b)
		fmt.Fprintf(&s, "%s %s\n", f, hex.EncodeToString(h[:]))
	}
	if err := os.WriteFile(out, []byte(s.String()), 0o644); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	return nil
}

// Read reads every file listed in sums under root with threads readers,
// in an order shuffled by seed, and checks each against its digest.
func Read(root, sums string, seed uint64, threads int) (Result, error) {
	b, err := os.ReadFile(sums)
	if err != nil {
		return Result{}, fmt.Errorf("verify: %w", err)
	}
	type want struct{ path, sum string }
	var wants []want
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		p, s, ok := strings.Cut(line, " ")
		if !ok {
			return Result{}, fmt.Errorf("verify: %s: a line without a digest: %q", sums, line)
		}
		wants = append(wants, want{p, s})
	}
	rand.New(rand.NewPCG(seed, 7)).Shuffle(len(wants), func(i, j int) { wants[i], wants[j] = wants[j], wants[i] })
	var (
		mu  sync.Mutex
		res Result
		wg  sync.WaitGroup
	)
	next := make(chan want)
	for range max(threads, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for w := range next {
				data, err := os.ReadFile(filepath.Join(root, w.path))
				sum := sha256.Sum256(data)
				mu.Lock()
				switch {
				case err != nil:
					res.fail(err.Error())
				case hex.EncodeToString(sum[:]) != w.sum:
					res.fail(w.path + ": wrong bytes")
				default:
					res.Files++
					res.Bytes += int64(len(data))
				}
				mu.Unlock()
			}
		}()
	}
	for _, w := range wants {
		next <- w
	}
	close(next)
	wg.Wait()
	return res, nil
}

func (r *Result) fail(why string) {
	if r.Errors == 0 {
		r.First = why
	}
	r.Errors++
}
