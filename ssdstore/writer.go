package ssdstore

import badger "github.com/dgraph-io/badger/v4"

// The writer goroutine: queued Puts committed in batches into the current
// segment.

// writer commits queued Puts in batches until stop, then drains the queue.
func (s *Store) writer() {
	defer s.wg.Done()
	batch := make([]put, 0, 64)
	for {
		select {
		case p := <-s.queue:
			batch = append(batch[:0], p)
		more:
			for len(batch) < cap(batch) {
				select {
				case p := <-s.queue:
					batch = append(batch, p)
				default:
					break more
				}
			}
			s.commit(batch)
		case <-s.stop:
			for {
				select {
				case p := <-s.queue:
					s.commit([]put{p})
				default:
					return
				}
			}
		}
	}
}

func (s *Store) commit(batch []put) {
	// Every Put of the batch is released, the ones dropped below too: the
	// closure must not see batch once it is cut down to the kept copies.
	queued := batch
	defer func() {
		for _, p := range queued {
			s.pending.Add(-int64(len(p.b.Data)))
		}
	}()
	var n, fresh int64
	for _, p := range batch {
		n += int64(len(p.b.Data)) + headerSize
		if !p.keep {
			fresh += int64(len(p.b.Data)) + headerSize
		}
	}
	if low, full := s.lowSpace(n, fresh); low || full {
		// Below the floor nothing is written; at the disk bound only
		// copies of blocks the store already holds, which leave garbage
		// behind for maintenance to collect.
		kept := batch[:0:0]
		for _, p := range batch {
			if p.keep && !low {
				kept = append(kept, p)
			}
		}
		s.mu.Lock()
		s.dropped += int64(len(batch) - len(kept))
		s.mu.Unlock()
		s.wakeMaintenance()
		if len(kept) == 0 {
			return
		}
		batch = kept
	}
	s.dropMu.RLock()
	defer s.dropMu.RUnlock()
	s.mu.Lock()
	seg := s.cur
	s.mu.Unlock()
	wb := s.db.NewWriteBatch()
	for _, p := range batch {
		if err := wb.Set(dbKey(metaOf(seg, p.b), p.key), encode(p.b)); err != nil {
			s.log.Warn("ssdstore: write failed", "key", p.key, "err", err)
		}
	}
	if err := wb.Flush(); err != nil {
		s.log.Warn("ssdstore: commit failed; blocks stay uncached", "n", len(batch), "err", err)
		return
	}
	segSize := s.dataCap / int64(s.cfg.Segments)
	var stale []meta
	var staleKeys []string
	s.mu.Lock()
	for _, p := range batch {
		m := metaOf(seg, p.b)
		if old, ok := s.index[p.key]; ok {
			s.segBytes[old.seg] -= int64(old.len)
			s.bytes -= int64(old.len)
			if old != m { // another key: another segment, length or ID
				stale = append(stale, old)
				staleKeys = append(staleKeys, p.key)
			}
		}
		s.index[p.key] = m
		s.segBytes[seg] += int64(m.len)
		s.bytes += int64(m.len)
	}
	if s.segBytes[s.cur] >= segSize {
		s.cur++
	}
	over := s.bytes > s.dataCap
	s.mu.Unlock()
	if len(stale) > 0 {
		// A rewritten block's old copy lives under another key (mostly in
		// an older segment): delete it so the segment's drop cannot remove
		// the fresh copy's bytes twice, nor a reopen count them twice.
		_ = s.db.Update(func(txn *badger.Txn) error {
			for i, m := range stale {
				if err := txn.Delete(dbKey(m, staleKeys[i])); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if over {
		s.wakeMaintenance()
	}
	s.noteTraffic(n)
}

// metaOf is the index entry of b written into seg.
func metaOf(seg uint32, b Block) meta {
	return meta{seg: seg, len: uint32(len(b.Data)), id: b.ID}
}
