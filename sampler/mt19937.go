package sampler

// MT19937 is the 32-bit Mersenne Twister as torch's CPU generator uses it
// (at::mt19937, the same stream as std::mt19937). Not safe for concurrent
// use.
type MT19937 struct {
	state [mtN]uint32
	i     int
}

const (
	mtN      = 624
	mtM      = 397
	mtMatrix = 0x9908b0df
	mtUpper  = 0x80000000
	mtLower  = 0x7fffffff
)

// NewMT19937 returns a generator seeded as torch.Generator.manual_seed(seed)
// seeds it: only the low 32 bits of the seed count.
func NewMT19937(seed uint64) *MT19937 {
	g := &MT19937{}
	g.Seed(seed)
	return g
}

// Seed resets the generator with init_genrand(uint32(seed)).
func (g *MT19937) Seed(seed uint64) {
	g.state[0] = uint32(seed)
	for j := 1; j < mtN; j++ {
		prev := g.state[j-1]
		g.state[j] = 1812433253*(prev^(prev>>30)) + uint32(j)
	}
	g.i = mtN
}

// Uint32 returns the next draw: torch's generator->random().
func (g *MT19937) Uint32() uint32 {
	if g.i >= mtN {
		g.twist()
	}
	y := g.state[g.i]
	g.i++
	y ^= y >> 11
	y ^= (y << 7) & 0x9d2c5680
	y ^= (y << 15) & 0xefc60000
	y ^= y >> 18
	return y
}

// Uint64 returns torch's generator->random64(): two draws, the first in the
// high word.
func (g *MT19937) Uint64() uint64 {
	hi := uint64(g.Uint32())
	lo := uint64(g.Uint32())
	return hi<<32 | lo
}

func (g *MT19937) twist() {
	for k := 0; k < mtN; k++ {
		y := g.state[k]&mtUpper | g.state[(k+1)%mtN]&mtLower
		v := g.state[(k+mtM)%mtN] ^ y>>1
		if y&1 != 0 {
			v ^= mtMatrix
		}
		g.state[k] = v
	}
	g.i = 0
}
