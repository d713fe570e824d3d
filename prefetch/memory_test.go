package prefetch

import (
	"runtime"
	"syscall"
	"testing"

	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
	"github.com/dlfs/dlfs/jobs"
	"github.com/dlfs/dlfs/test/memstat"
)

// TestPlanMemory measures what a planned position costs (issue 13: 16
// bytes or so, so that 14.2 M samples, lookahead 2 and 8 local ranks fit
// well under 2 GB): a DistributedSampler job over 1 M samples, world 8,
// every rank local, two epochs, its orders and the prefetcher's streams.
func TestPlanMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("plans 2 M positions")
	}
	const n, world = 1 << 20, 8
	_, samples := fixture(n)
	spec := control.DefaultJob()
	spec.Name, spec.World, spec.Lookahead, spec.Batch, spec.Workers = "j", world, 2, 256, 8
	spec.Ranks = []int{0, 1, 2, 3, 4, 5, 6, 7}
	j := &jobs.Job{Spec: spec, Samples: samples, RankEpoch: map[int]int{}}
	for _, r := range spec.Ranks {
		j.RankEpoch[r] = 0
	}
	before := memstat.Heap()
	var streams []*stream
	positions := 0
	for _, r := range spec.Ranks {
		s := build(j, r, j.Epochs(r))
		streams = append(streams, s)
		positions += s.len()
	}
	per := float64(memstat.Heap()-before) / float64(positions)
	t.Logf("%d positions: %.1f bytes each (the job's orders and the streams)", positions, per)
	if positions != 2*n {
		t.Fatalf("%d positions, want %d", positions, 2*n)
	}
	if per > 16 {
		t.Errorf("a planned position costs %.1f bytes, want at most 16", per)
	}
	runtime.KeepAlive(streams)
	runtime.KeepAlive(j)
}

// BenchmarkPending is the lookup every read and every RAM eviction makes:
// a file's next pending position in a stream of 1 M positions.
func BenchmarkPending(b *testing.B) {
	const n = 1 << 20
	files, samples := fixture(n)
	spec := control.DefaultJob()
	spec.Name, spec.Lookahead, spec.Batch, spec.Workers = "j", 1, 256, 8
	j := &jobs.Job{Spec: spec, Samples: samples, RankEpoch: map[int]int{0: 0}}
	s := build(j, 0, j.Epochs(0))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if s.pending(files[(i*7919)%n].Ino) < 0 {
			b.Fatal("not planned")
		}
	}
}

// TestDanglingPositions: a sample without a file (a dangling link keeps
// its place in the sampler's order) is consumed from the start, so the
// cursor passes it and nothing fetches it.
func TestDanglingPositions(t *testing.T) {
	_, samples := fixture(6)
	samples[3].Entry = nil
	spec := control.DefaultJob()
	spec.Name, spec.Lookahead, spec.Batch, spec.Workers = "j", 2, 2, 1
	j := &jobs.Job{Spec: spec, Samples: samples, RankEpoch: map[int]int{0: 0}}
	s := build(j, 0, j.Epochs(0))
	if s.len() != 12 || len(s.index) != 10 {
		t.Fatalf("%d positions, %d indexed; want 12 and 10", s.len(), len(s.index))
	}
	for pos := range s.len() {
		if (s.entry(pos) == nil) != s.consumed.get(pos) {
			t.Errorf("position %d: entry %v, consumed %v", pos, s.entry(pos), s.consumed.get(pos))
		}
		if e := s.entry(pos); e != nil && s.pending(e.Ino) < 0 {
			t.Errorf("position %d (ino %d) is not pending", pos, e.Ino)
		}
	}
}

// fixture returns n files numbered from 2 and their samples.
func fixture(n int) ([]catalog.Entry, []folder.Sample) {
	files := make([]catalog.Entry, n)
	samples := make([]folder.Sample, n)
	for i := range files {
		files[i] = catalog.Entry{Ino: uint64(i + 2), Size: 1000, Mode: syscall.S_IFREG | 0o644}
		samples[i] = folder.Sample{Entry: &files[i]}
	}
	return files, samples
}
