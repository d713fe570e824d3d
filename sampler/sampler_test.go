package sampler

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"
)

type golden struct {
	Kind     string `json:"kind"`
	N        int    `json:"n"`
	Seed     uint64 `json:"seed"`
	World    int    `json:"world"`
	Rank     int    `json:"rank"`
	Epoch    int    `json:"epoch"`
	Shuffle  bool   `json:"shuffle"`
	DropLast bool   `json:"drop_last"`
	Len      int    `json:"len"`
	Head     []int  `json:"head"`
	SHA256   string `json:"sha256"`
}

func digest(idx []int) string {
	h := sha256.New()
	buf := make([]byte, 0, 16)
	for i, v := range idx {
		buf = buf[:0]
		if i > 0 {
			buf = append(buf, ',')
		}
		h.Write(strconv.AppendInt(buf, int64(v), 10))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestGolden compares whole orders with what torch drew
// (testdata/make_golden.py).
func TestGolden(t *testing.T) {
	b, err := os.ReadFile("testdata/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Torch string   `json:"torch"`
		Cases []golden `json:"cases"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) < 50 {
		t.Fatalf("only %d golden cases", len(g.Cases))
	}
	for _, c := range g.Cases {
		name := fmt.Sprintf("%s/n=%d/seed=%d/world=%d/rank=%d/epoch=%d/shuffle=%v/drop=%v",
			c.Kind, c.N, c.Seed, c.World, c.Rank, c.Epoch, c.Shuffle, c.DropLast)
		t.Run(name, func(t *testing.T) {
			if testing.Short() && c.N > 100_000 {
				t.Skip("large n")
			}
			var idx []int
			switch c.Kind {
			case "randperm":
				idx = Randperm(c.N, NewMT19937(c.Seed), Torch1)
			case "distributed":
				d := Distributed{N: c.N, World: c.World, Rank: c.Rank, Shuffle: c.Shuffle, Seed: c.Seed, DropLast: c.DropLast}
				idx = d.Epoch(c.Epoch)
				if len(idx) != d.NumSamples() {
					t.Errorf("len %d, NumSamples %d", len(idx), d.NumSamples())
				}
			case "random":
				idx = Random{N: c.N, Seed: c.Seed}.Epoch(c.Epoch)
			default:
				t.Fatalf("unknown kind %q", c.Kind)
			}
			if len(idx) != c.Len {
				t.Fatalf("len %d, torch %d", len(idx), c.Len)
			}
			if got := digest(idx); got != c.SHA256 {
				t.Errorf("order differs from torch %s: head %v, torch %v", g.Torch, idx[:min(10, len(idx))], c.Head)
			}
		})
	}
}

// TestMT19937Reference checks the generator against the reference
// implementation's published output (mt19937ar.out: init_genrand(5489)).
func TestMT19937Reference(t *testing.T) {
	g := NewMT19937(5489)
	for i, want := range []uint32{3499211612, 581869302, 3890346734, 3586334585, 545404204} {
		if got := g.Uint32(); got != want {
			t.Fatalf("draw %d: %d, want %d", i, got, want)
		}
	}
	if NewMT19937(5).Uint32() != NewMT19937(1<<32+5).Uint32() {
		t.Error("seeds equal in their low 32 bits must give the same stream")
	}
}

// TestInsideOut checks the shuffle torch >= 2.7 uses for n >= LargeN on a
// small n, against the algorithm worked by hand: it is a permutation, it
// draws 64-bit values, and p[0] is 1 exactly when the second draw is even.
// (No torch >= 2.7 is installable here to draw golden vectors from.)
func TestInsideOut(t *testing.T) {
	p := insideOut(10_000, NewMT19937(9))
	seen := make([]bool, len(p))
	for _, v := range p {
		if seen[v] {
			t.Fatalf("%d appears twice", v)
		}
		seen[v] = true
	}
	g := NewMT19937(9)
	g.Uint64()
	odd := g.Uint64()%2 == 1
	q := insideOut(2, NewMT19937(9))
	if (q[0] == 1) == odd {
		t.Errorf("insideOut(2) = %v with second draw odd=%v", q, odd)
	}
	// Below LargeN both versions are the old swap shuffle.
	if digest(Randperm(1000, NewMT19937(3), Torch27)) != digest(Randperm(1000, NewMT19937(3), Torch1)) {
		t.Error("below LargeN the versions differ")
	}
}

// TestInsideOutByHand: insideOut(5) follows torch 2.7's loop, written out
// here step by step from the generator's 64-bit draws: r[i] = i, then
// r[i] = r[z], r[z] = i with z = draw % (i+1).
func TestInsideOutByHand(t *testing.T) {
	g := NewMT19937(11)
	want := make([]int, 0, 5)
	for i := 0; i < 5; i++ {
		z := int(g.Uint64() % uint64(i+1))
		want = append(want, i)
		want[i] = want[z]
		want[z] = i
	}
	if got := insideOut(5, NewMT19937(11)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("insideOut(5) = %v, want %v", got, want)
	}
}

// TestLargeNThreshold: torch 2.7 switches algorithm at exactly LargeN
// (uint32 max / 20), and torch 1 never does.
func TestLargeNThreshold(t *testing.T) {
	if LargeN != 214748364 {
		t.Errorf("LargeN = %d, want 214748364", LargeN)
	}
	for _, c := range []struct {
		v    Version
		n    int
		want bool
	}{{Torch27, LargeN - 1, false}, {Torch27, LargeN, true}, {Torch27, 1 << 30, true}, {Torch1, LargeN, false}, {Torch1, 1 << 30, false}} {
		if got := c.v.insideOut(c.n); got != c.want {
			t.Errorf("version %d, n %d: inside-out %v, want %v", c.v, c.n, got, c.want)
		}
	}
}
