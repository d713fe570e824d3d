package readers

import (
	"testing"
)

// shapeReads are the first reads of positions from..to of a loader with
// batch and procs (one per worker) over an epoch of length positions,
// epoch after epoch, as unwrapped positions with their processes. Each
// epoch's workers are procs shifted by the epoch × 10 unless persistent.
func shapeReads(from, to, length, batch int, procs []int, persistent bool) []posRead {
	var out []posRead
	for u := from; u < to; u++ {
		e, q := u/length, u%length
		p := procs[(q/batch)%len(procs)]
		if !persistent {
			p += 10 * e
		}
		out = append(out, posRead{u, p})
	}
	return out
}

func TestShapeOf(t *testing.T) {
	const main = 1
	w2, w4 := []int{101, 102}, []int{101, 102, 103, 104}
	drop := func(rs []posRead, every int) []posRead { // reads the page cache served
		var out []posRead
		for i, r := range rs {
			if i%every != every-1 {
				out = append(out, r)
			}
		}
		return out
	}
	reversed := func(rs []posRead) []posRead {
		out := make([]posRead, len(rs))
		for i, r := range rs {
			out[len(rs)-1-i] = r
		}
		return out
	}
	for _, c := range []struct {
		name           string
		obs            []posRead
		length         int
		batch, workers int
	}{
		{"2 workers, batches of 16", shapeReads(0, 200, 200, 16, w2, false), 200, 16, 2},
		{"4 workers, batches of 8, mid-epoch", shapeReads(300, 700, 1000, 8, w4, false), 1000, 8, 4},
		{"arrival order does not matter", reversed(shapeReads(0, 200, 200, 16, w2, false)), 200, 16, 2},
		{"batches of 1", shapeReads(0, 64, 1000, 1, w4, false), 1000, 1, 4},
		{"across an epoch's end, new workers", shapeReads(150, 260, 200, 16, w2, false), 200, 16, 2},
		{"across an epoch's end, persistent workers", shapeReads(150, 260, 200, 16, w2, true), 200, 16, 2},
		{"one whole batch and a short last one", shapeReads(160, 200, 200, 16, w2, false), 200, 0, -1},
		{"one worker: no batch shows", shapeReads(0, 200, 1000, 16, []int{101}, false), 1000, 0, -1},
		{"the stream's own process: no workers", shapeReads(0, 200, 1000, 16, []int{main}, false), 1000, 0, 0},
		{"two batches seen whole, workers not yet", shapeReads(0, 60, 1000, 16, w4, false), 1000, 16, -1},
		{"batches larger than the reads", shapeReads(0, 100, 1000, 256, w2, false), 1000, 0, -1},
		{"repeats only across unseen batches", append(shapeReads(0, 12, 1000, 4, w4, false), shapeReads(32, 44, 1000, 4, w4, false)...), 1000, 4, -1},
		{"too few reads", shapeReads(0, 5, 1000, 2, w2, false), 1000, 0, -1},
		{"gaps from the page cache", drop(shapeReads(0, 400, 1000, 16, w2, false), 37), 1000, 16, 2},
		{"unequal runs: not a DataLoader", []posRead{{0, 101}, {1, 101}, {2, 102}, {3, 102}, {4, 102}, {5, 101}, {6, 102}, {7, 101}, {8, 101}, {9, 102}}, 1000, 0, -1},
		{"runs not at multiples of their length", []posRead{{1, 101}, {2, 101}, {3, 102}, {4, 102}, {5, 101}, {6, 101}, {7, 102}, {8, 102}, {9, 101}, {10, 101}}, 1000, 0, -1},
	} {
		b, w := shapeOf(c.obs, c.length, main)
		if b != c.batch || w != c.workers {
			t.Errorf("%s: batch %d workers %d, want %d and %d", c.name, b, w, c.batch, c.workers)
		}
	}
}
