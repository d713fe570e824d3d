// Package sampler replicates, bit for bit, the orders in which PyTorch's
// samplers visit a dataset, so that dlfs knows every rank's future reads
// from a seed and an epoch.
//
// # What is replicated
//
//   - torch's CPU generator: MT19937 seeded by manual_seed, which keeps only
//     the low 32 bits of the seed (MT19937).
//   - torch.randperm on the CPU (Randperm). Up to torch 2.6 it swaps
//     position i with i + random() % (n-i). From torch 2.7 on, for n of at
//     least 214,748,364 (uint32 max / 20), it runs an inside-out shuffle
//     with random64() % (i+1) instead; Version selects the behaviour.
//   - DistributedSampler: a generator seeded with seed+epoch, padding by
//     repeating the head of the list, or truncation with drop_last, then
//     indices[rank:total:world].
//   - RandomSampler with an explicitly seeded generator, which the sampler
//     keeps drawing from across epochs (two randperms per epoch, see
//     Random).
//   - SequentialSampler.
//
// # Verification
//
// testdata/golden.json holds permutations drawn by real torch
// (testdata/make_golden.py, Debian's python3-torch 1.13), compared by
// SHA-256 of the whole list, for n up to 1,281,167 and seeds beyond 2^32.
package sampler

// Version selects which torch release's randperm to replicate.
type Version int

const (
	// Torch1 is torch up to 2.6: the swap shuffle for every n.
	Torch1 Version = iota
	// Torch27 is torch 2.7 and later: an inside-out shuffle with 64-bit
	// draws for n >= LargeN.
	Torch27
)

// LargeN is the n from which torch 2.7 changes randperm's algorithm
// (std::numeric_limits<uint32_t>::max() / 20).
const LargeN = (1<<32 - 1) / 20

// Randperm returns torch.randperm(n, generator=g) and advances g as torch
// would.
func Randperm(n int, g *MT19937, v Version) []int {
	if v.insideOut(n) {
		return insideOut(n, g)
	}
	return swapShuffle(n, g)
}

// insideOut reports whether torch of version v draws randperm(n) with the
// inside-out shuffle.
func (v Version) insideOut(n int) bool { return v == Torch27 && n >= LargeN }

// insideOut is torch 2.7's randperm for large n.
func insideOut(n int, g *MT19937) []int {
	p := make([]int, n)
	for i := 0; i < n; i++ {
		z := int(g.Uint64() % uint64(i+1))
		p[i] = p[z]
		p[z] = i
	}
	return p
}

// swapShuffle is torch's randperm for every n up to 2.6, and for small n
// since.
func swapShuffle(n int, g *MT19937) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	for i := 0; i < n-1; i++ {
		z := int(uint64(g.Uint32()) % uint64(n-i))
		p[i], p[i+z] = p[i+z], p[i]
	}
	return p
}

// Distributed describes a torch.utils.data.DistributedSampler.
type Distributed struct {
	N        int    // len(dataset)
	World    int    // num_replicas
	Rank     int    // rank
	Shuffle  bool   // shuffle (torch's default is true)
	Seed     uint64 // seed
	DropLast bool   // drop_last
	Version  Version
}

// NumSamples is the sampler's len(): how many indices each rank gets.
func (d Distributed) NumSamples() int {
	if d.DropLast && d.N%d.World != 0 {
		return ceilDiv(d.N-d.World, d.World)
	}
	return ceilDiv(d.N, d.World)
}

func ceilDiv(a, b int) int {
	if a <= 0 {
		return 0 // math.ceil of a non-positive ratio here is 0 or negative; torch gets 0 for N < world
	}
	return (a + b - 1) / b
}

// Epoch returns the indices rank d.Rank visits in epoch, in order.
func (d Distributed) Epoch(epoch int) []int {
	return d.Shard(d.Global(epoch))
}

// Global returns the list every rank takes its share of in epoch: the
// permutation (or range), padded or truncated to World*NumSamples.
func (d Distributed) Global(epoch int) []int {
	var idx []int
	if d.Shuffle {
		idx = Randperm(d.N, NewMT19937(d.Seed+uint64(epoch)), d.Version)
	} else {
		idx = make([]int, d.N)
		for i := range idx {
			idx[i] = i
		}
	}
	total := d.NumSamples() * d.World
	if !d.DropLast {
		for len(idx) < total && len(idx) > 0 {
			idx = append(idx, idx[:min(total-len(idx), d.N)]...)
		}
	}
	return idx[:min(total, len(idx))]
}

// Shard returns indices[rank:total:world] of a Global list.
func (d Distributed) Shard(global []int) []int {
	out := make([]int, 0, len(global)/d.World+1)
	for i := d.Rank; i < len(global); i += d.World {
		out = append(out, global[i])
	}
	return out
}

// Random describes a torch.utils.data.RandomSampler without replacement
// whose generator was seeded once with Seed before the first epoch and is
// drawn from by nothing else. In epoch e it yields the 2e-th randperm of
// that stream: every epoch draws a second randperm of which it yields
// nothing (torch 1.13 to 2.x: "randperm(n)[:num_samples % n]"), so the
// stream advances by two permutations per epoch.
type Random struct {
	N       int
	Seed    uint64
	Version Version
}

// Epoch returns the order of epoch.
func (r Random) Epoch(epoch int) []int {
	g := NewMT19937(r.Seed)
	for e := 0; e < epoch; e++ {
		skip(r.N, g, r.Version)
		skip(r.N, g, r.Version)
	}
	return Randperm(r.N, g, r.Version)
}

// skip advances g past one randperm(n) without building it.
func skip(n int, g *MT19937, v Version) {
	if v.insideOut(n) {
		for i := 0; i < 2*n; i++ {
			g.Uint32()
		}
		return
	}
	for i := 0; i < n-1; i++ {
		g.Uint32()
	}
}

// Sequential returns 0..n-1: torch's SequentialSampler.
func Sequential(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}
