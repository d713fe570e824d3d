package prefetch

import (
	"fmt"
	"testing"
)

// checkInvariant checks the stage's INVARIANTs: bytes is the sum of the
// staged blocks' lengths and perIno counts them per file; inflightBytes
// is the sum of inflight; pushedBytes is the sum of pushed and pushing. No
// count is negative.
func (st *Stage) checkInvariant() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	var staged int64
	perIno := map[uint64]int{}
	for key, b := range st.blocks {
		staged += int64(len(b.Data))
		perIno[b.ID]++
		if len(b.Data) == 0 {
			return fmt.Errorf("staged block %q is empty", key)
		}
	}
	if staged != st.bytes {
		return fmt.Errorf("bytes %d, the staged blocks hold %d", st.bytes, staged)
	}
	if len(perIno) != len(st.perIno) {
		return fmt.Errorf("perIno counts %d files, %d have staged blocks", len(st.perIno), len(perIno))
	}
	for ino, n := range st.perIno {
		if n != perIno[ino] {
			return fmt.Errorf("perIno[%d] = %d, %d blocks of it are staged", ino, n, perIno[ino])
		}
	}
	inflight, err := sum("inflight", st.inflight)
	if err != nil {
		return err
	}
	if inflight != st.inflightBytes {
		return fmt.Errorf("inflightBytes %d, inflight holds %d", st.inflightBytes, inflight)
	}
	pushed, err := sum("pushed", st.pushed)
	if err != nil {
		return err
	}
	pushing, err := sum("pushing", st.pushing)
	if err != nil {
		return err
	}
	if pushed+pushing != st.pushedBytes {
		return fmt.Errorf("pushedBytes %d, pushed and pushing hold %d", st.pushedBytes, pushed+pushing)
	}
	for k := range st.served {
		if _, ok := st.blocks[k]; !ok {
			return fmt.Errorf("pages counted as read for %q, which is not staged", k)
		}
	}
	var backed, backedBlocks int64
	for ino, f := range st.backed {
		if st.perIno[ino] == 0 {
			return fmt.Errorf("a backing file kept for file %d, which has no staged block", ino)
		}
		backed += f.Size()
	}
	for _, b := range st.blocks {
		if st.backed[b.ID] != nil {
			backedBlocks += int64(len(b.Data))
		}
	}
	if backed != st.backedBytes || backedBlocks != st.backedBlockBytes {
		return fmt.Errorf("backedBytes %d and backedBlockBytes %d, the backing files kept hold %d and their staged blocks %d",
			st.backedBytes, st.backedBlockBytes, backed, backedBlocks)
	}
	return nil
}

// pushes is the number of pushes under way.
func (st *Stage) pushes() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.pushing)
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
	if err := p.stage.checkInvariant(); err != nil {
		t.Fatalf("INVARIANT broken: %v", err)
	}
}
