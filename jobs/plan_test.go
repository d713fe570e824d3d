package jobs

import (
	"errors"
	"slices"
	"testing"

	"github.com/dlfs/dlfs/balance"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/sampler"
)

// TestReadOrder: a rank's order is its torch sampler's, with every
// setting of the spec that sampler takes.
func TestReadOrder(t *testing.T) {
	spec := control.DefaultJob()
	spec.World, spec.Seed, spec.DropLast, spec.Torch27, spec.Shuffle = 3, 42, true, true, true
	want := sampler.Distributed{N: 100, World: 3, Rank: 2, Shuffle: true, Seed: 42, DropLast: true, Version: sampler.Torch27}.Epoch(5)
	if got := ReadOrder(spec, 100, 2, 5); !slices.Equal(got, want) {
		t.Errorf("distributed: %v, want %v", got, want)
	}
	spec.Sampler = "random"
	if got, want := ReadOrder(spec, 100, 2, 5), (sampler.Random{N: 100, Seed: 42, Version: sampler.Torch27}).Epoch(5); !slices.Equal(got, want) {
		t.Errorf("random: %v, want %v", got, want)
	}
	spec.Sampler = "sequential"
	if got := ReadOrder(spec, 5, 1, 3); !slices.Equal(got, []int{0, 1, 2, 3, 4}) {
		t.Errorf("sequential: %v", got)
	}
}

// TestBalancedPlan: every global batch goes whole to the ranks' batches
// of its step (balance's invariant), each is shown to each in order, and
// an error from each stops the plan.
func TestBalancedPlan(t *testing.T) {
	for _, kind := range []string{"locality", "solar"} {
		spec := control.DefaultJob()
		spec.World, spec.Batch, spec.Seed, spec.Balance = 4, 5, 7, kind
		const n = 203
		rankNode := []int{0, 0, 1, 1}
		owner := func(i int) int { return i%3 - 1 } // -1 (none), 0 or 1
		var shown [][]int
		p, err := BalancedPlan(spec, n, 2, rankNode, owner, func(b balance.Batch, _ balance.Plan) error {
			shown = append(shown, b.Samples)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		global := balance.GlobalBatches(Distributed(spec, n).Global(2), spec.Batch, spec.World)
		if len(shown) != len(global) {
			t.Fatalf("%s: each saw %d batches, want %d", kind, len(shown), len(global))
		}
		at := make([]int, spec.World) // each rank's position in its order
		for k, gb := range global {
			if !slices.Equal(shown[k], gb) {
				t.Fatalf("%s: batch %d shown as %v, want %v", kind, k, shown[k], gb)
			}
			var got []int
			for r := range spec.World {
				size := p.Batches[r][k]
				for _, s := range p.Orders[r][at[r] : at[r]+size] {
					got = append(got, int(s))
				}
				at[r] += size
			}
			slices.Sort(got)
			want := slices.Sorted(slices.Values(gb))
			if !slices.Equal(got, want) {
				t.Fatalf("%s: batch %d planned as %v, want %v", kind, k, got, want)
			}
		}
		for r := range spec.World {
			if at[r] != len(p.Orders[r]) {
				t.Errorf("%s: rank %d's batches hold %d of its %d samples", kind, r, at[r], len(p.Orders[r]))
			}
		}
	}
	stop := errors.New("stop")
	calls := 0
	spec := control.DefaultJob()
	spec.World, spec.Batch, spec.Balance = 2, 2, "locality"
	_, err := BalancedPlan(spec, 100, 0, []int{0, 1}, func(int) int { return 0 }, func(balance.Batch, balance.Plan) error {
		calls++
		if calls == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 3 {
		t.Errorf("each's error: got %v after %d calls, want stop after 3", err, calls)
	}
}
