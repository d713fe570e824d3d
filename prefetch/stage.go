package prefetch

import (
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/loader"
	"github.com/dlfs/dlfs/ramcache"
)

// stagedBlock is a block with its key.
type stagedBlock struct {
	key string
	ramcache.Block
}

// trimStage takes off the stage the blocks that no stream would stage
// soon: each stream's window is the first 2×Staging bytes, in the order
// its reads will come from its cursor, of the samples RAM does not hold
// (twice, because RAM has changed since the prefetcher passed them). After
// a plan change (a resumed job announces epoch 0 when its sampler is made,
// and its real epoch only later) the stage can be full of samples the new
// order needs late; bound by staging, the prefetcher could then fetch
// nothing ahead of the reader until the reader happened on them. The
// caller offers them to RAM, which keeps them if their next use warrants.
// RAM is asked without mu (see Locking); the plans' orders do not change
// once built.
func (p *Prefetcher) trimStage() []stagedBlock {
	type view struct {
		s    *stream
		from int // the cursor's step
	}
	p.mu.Lock()
	var views []view
	for _, s := range p.streams {
		if s.cursor < s.len() {
			views = append(views, view{s, s.order.step(s.cursor)})
		}
	}
	staged := make(map[uint64]bool, len(p.stagedIno))
	for ino := range p.stagedIno {
		staged[ino] = true
	}
	p.mu.Unlock()
	if len(staged) == 0 {
		return nil
	}
	window := map[uint64]bool{}
	for _, v := range views {
		var bytes int64
		seen := 0 // staged samples met: once all are, the rest cannot matter
		for k := v.from; k < v.s.len() && bytes < 2*p.cfg.Staging && seen < len(staged); k++ {
			e := v.s.entry(v.s.order.at(k))
			if e == nil || window[e.Ino] || p.load.InRAM(e) {
				continue
			}
			window[e.Ino] = true
			bytes = catalog.AddSize(bytes, e.Size)
			if staged[e.Ino] {
				seen++
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []stagedBlock
	for key, b := range p.staged {
		if staged[b.ID] && !window[b.ID] {
			p.unstageLocked(key, b)
			out = append(out, stagedBlock{key, b})
		}
	}
	return out
}

// Hold implements loader.Stage.
func (p *Prefetcher) Hold(key string, b ramcache.Block) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.neededLocked(b.ID, false) || p.stagedBytes+int64(len(b.Data)) > p.cfg.Staging {
		return // unplanned (nothing would ever drop it) or no room
	}
	p.stageLocked(key, b)
}

// stageLocked adds b to the stage unless it is there already, and reports
// whether it added it.
func (p *Prefetcher) stageLocked(key string, b ramcache.Block) bool {
	if _, dup := p.staged[key]; dup {
		return false
	}
	p.staged[key] = b
	p.stagedIno[b.ID]++
	p.stagedBytes += int64(len(b.Data))
	return true
}

// Take implements loader.Stage.
func (p *Prefetcher) Take(key string, tag uint64, done bool) (ramcache.Block, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.staged[key]
	if !ok {
		return ramcache.Block{}, false
	}
	stale := b.Tag != tag // another version of the file
	if done || stale {
		p.unstageLocked(key, b)
	}
	if stale {
		return ramcache.Block{}, false
	}
	return b, true
}

func (p *Prefetcher) unstageLocked(key string, b ramcache.Block) {
	delete(p.staged, key)
	p.stagedBytes -= int64(len(b.Data))
	if p.stagedIno[b.ID]--; p.stagedIno[b.ID] <= 0 {
		delete(p.stagedIno, b.ID)
	}
}

// neededLocked reports whether a stream still has ino ahead of its cursor
// within what the scheduler has reached (or anywhere, if !soon).
func (p *Prefetcher) neededLocked(ino uint64, soon bool) bool {
	for _, s := range p.streams {
		if q := s.pending(ino); q >= 0 && (!soon || s.order.step(q) < s.frontier) {
			return true
		}
	}
	return false
}

// dropIfUnneededLocked drops e's staged blocks if no stream will read them
// soon; they count as wasted.
func (p *Prefetcher) dropIfUnneededLocked(e *catalog.Entry) {
	if e == nil || p.stagedIno[e.Ino] == 0 || p.neededLocked(e.Ino, true) {
		return
	}
	for _, b := range p.unstageFileLocked(e) {
		p.totals.WastedBytes += int64(len(b.Data))
	}
	p.totals.Wasted++
	if st := p.statsOfLocked(e.Ino, nil); st != nil {
		st.Wasted++
	}
}

// unstageFileLocked takes every staged block of e off the stage and
// returns them.
func (p *Prefetcher) unstageFileLocked(e *catalog.Entry) []stagedBlock {
	var out []stagedBlock
	n := loader.Blocks(e.Size, p.cfg.BlockSize)
	if n > int64(len(p.staged)) {
		// A file of more blocks than the stage holds (a sparse file may
		// claim 2^43): walk the stage instead, under p.mu either way.
		for key, b := range p.staged {
			if b.ID == e.Ino {
				p.unstageLocked(key, b)
				out = append(out, stagedBlock{key, b})
			}
		}
		return out
	}
	for i := int64(0); i < n && p.stagedIno[e.Ino] > 0; i++ {
		key := loader.BlockKey(e.Path(), i)
		if b, ok := p.staged[key]; ok {
			p.unstageLocked(key, b)
			out = append(out, stagedBlock{key, b})
		}
	}
	return out
}

// dropUnneededLocked drops every staged block that no stream will read
// again (after a plan change).
func (p *Prefetcher) dropUnneededLocked() {
	for key, b := range p.staged {
		if !p.neededLocked(b.ID, false) {
			p.unstageLocked(key, b)
			p.totals.Wasted++
			p.totals.WastedBytes += int64(len(b.Data))
		}
	}
}
