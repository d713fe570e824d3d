package sampler

// Shuffle draws torch's swap-shuffle randperm (Randperm for every n up to
// torch 2.6, and for n < LargeN since) one position at a time, without
// building the whole permutation: after Next returns the value at position
// i, positions 0..i are final. It reuses its memory across Reset calls
// (two int32 arrays of n), so searching many seeds costs no allocation.
// Not safe for concurrent use.
type Shuffle struct {
	n     int
	i     int
	g     *MT19937
	val   []int32
	stamp []uint32 // val[j] is valid when stamp[j] == cur; else position j holds j
	cur   uint32
}

// Reset starts randperm(n) drawn from g.
func (s *Shuffle) Reset(n int, g *MT19937) {
	if cap(s.val) < n {
		s.val, s.stamp, s.cur = make([]int32, n), make([]uint32, n), 0
	}
	s.val, s.stamp = s.val[:n], s.stamp[:n]
	s.cur++
	if s.cur == 0 { // wrapped: clear the stamps once every 2^32 resets
		clear(s.stamp)
		s.cur = 1
	}
	s.n, s.i, s.g = n, 0, g
}

func (s *Shuffle) at(j int) int32 {
	if s.stamp[j] == s.cur {
		return s.val[j]
	}
	return int32(j)
}

func (s *Shuffle) set(j int, v int32) { s.val[j], s.stamp[j] = v, s.cur }

// Next returns the value at the next position, or -1 past the end.
func (s *Shuffle) Next() int {
	if s.i >= s.n {
		return -1
	}
	i := s.i
	s.i++
	if i == s.n-1 {
		return int(s.at(i)) // torch draws n-1 times
	}
	z := int(uint64(s.g.Uint32()) % uint64(s.n-i))
	a, b := s.at(i), s.at(i+z)
	s.set(i, b)
	s.set(i+z, a)
	return int(b)
}

// Pos is the next position Next fills.
func (s *Shuffle) Pos() int { return s.i }
