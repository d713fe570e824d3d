package prefetch

import (
	"fmt"
	"testing"
)

// checkInvariant checks the INVARIANT of the stage's bookkeeping under
// mu: stagedBytes is the sum of the staged blocks' lengths and stagedIno
// counts them per file; inflightBytes is the sum of inflight;
// pushedBytes is the sum of pushedIno and pushing. No count is negative.
func (p *Prefetcher) checkInvariant() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var staged int64
	perIno := map[uint64]int{}
	for key, b := range p.staged {
		staged += int64(len(b.Data))
		perIno[b.ID]++
		if len(b.Data) == 0 {
			return fmt.Errorf("staged block %q is empty", key)
		}
	}
	if staged != p.stagedBytes {
		return fmt.Errorf("stagedBytes %d, the staged blocks hold %d", p.stagedBytes, staged)
	}
	if len(perIno) != len(p.stagedIno) {
		return fmt.Errorf("stagedIno counts %d files, %d have staged blocks", len(p.stagedIno), len(perIno))
	}
	for ino, n := range p.stagedIno {
		if n != perIno[ino] {
			return fmt.Errorf("stagedIno[%d] = %d, %d blocks of it are staged", ino, n, perIno[ino])
		}
	}
	inflight, err := sum("inflight", p.inflight)
	if err != nil {
		return err
	}
	if inflight != p.inflightBytes {
		return fmt.Errorf("inflightBytes %d, inflight holds %d", p.inflightBytes, inflight)
	}
	pushed, err := sum("pushedIno", p.pushedIno)
	if err != nil {
		return err
	}
	pushing, err := sum("pushing", p.pushing)
	if err != nil {
		return err
	}
	if pushed+pushing != p.pushedBytes {
		return fmt.Errorf("pushedBytes %d, pushedIno and pushing hold %d", p.pushedBytes, pushed+pushing)
	}
	return nil
}

// sum adds up the bytes of m (named name), none of which may be negative.
func sum(name string, m map[uint64]int64) (int64, error) {
	var n int64
	for ino, b := range m {
		if b < 0 {
			return 0, fmt.Errorf("%s[%d] = %d", name, ino, b)
		}
		n += b
	}
	return n, nil
}

// checkInvariant fails t if p's stage bookkeeping is inconsistent.
func checkInvariant(t testing.TB, p *Prefetcher) {
	t.Helper()
	if err := p.checkInvariant(); err != nil {
		t.Fatalf("INVARIANT broken: %v", err)
	}
}
