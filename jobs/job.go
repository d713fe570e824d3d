package jobs

import (
	"sync"
	"sync/atomic"

	"github.com/dlfs/dlfs/balance"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/control"
	"github.com/dlfs/dlfs/folder"
)

// A registered job and its plans of plain samplers: a rank's order per
// epoch, made when asked for and cached for the planned window.

// Job is a registered job. Its fields do not change; an update replaces
// the Job.
type Job struct {
	Spec    control.Job
	Samples []folder.Sample // the dataset in index order
	Classes int
	// RankEpoch is the epoch each local rank is in. A line with rank=R
	// moves only rank R (each process announces its own); any other line
	// moves every local rank.
	RankEpoch map[int]int
	// Inferred: no one announced the job; package readers inferred it
	// from a stream's reads.
	Inferred bool
	// batchKnown and workersKnown say whether Spec.Batch and Spec.Workers
	// are the DataLoader's: an announced job's line gives them (or takes
	// the defaults); an inferred job's only once its reads showed them.
	// Until then its plans are made with InferredBatch and
	// InferredWorkers, the prefetcher's window, and Batches says nothing.
	batchKnown, workersKnown bool
	// Owner is who the job acts for. Samples hold only what the owner may
	// read by its path, and only the owner's reads move its readers'
	// cursors (Owner.Reads).
	Owner Owner
	// Public: every user may read every sample, so its plans may be shown
	// to all.
	Public bool

	layout func(j *Job) Layout // read-only after Apply; nil: one node
	ahead  *atomic.Int64       // how far its readers may be fetched ahead of; shared by the job's versions
	snap   *catalog.Snapshot   // what Samples index

	mu       sync.Mutex
	plans    map[[2]int][]int32     // (rank, epoch) -> sample indices
	balanced map[int]*balancedEpoch // epoch -> every rank's plan (balance=)
	blocks   map[int][]int          // epochorder: block -> which epoch's permutation each epoch of it uses

	statsMu   sync.Mutex        // guards planStats: reading them never waits for a plan being made
	planStats map[int]PlanStats // epoch -> its plan's figures (balance=), as last made
}

// InferredBatch and InferredWorkers are the DataLoader's shape an
// inferred job is planned with until its reads show it: what the
// prefetcher's window assumes of a loader it knows nothing of.
const (
	InferredBatch   = 32
	InferredWorkers = 4
)

// BatchKnown reports whether Spec.Batch is the DataLoader's batch size
// (not InferredBatch, assumed for an inferred job whose reads have not
// shown it).
func (j *Job) BatchKnown() bool { return j.batchKnown }

// WorkersKnown reports the same of Spec.Workers.
func (j *Job) WorkersKnown() bool { return j.workersKnown }

// Ahead is how many samples the prefetcher may fetch ahead of each of the
// job's readers; 0: no bound (every announced job).
func (j *Job) Ahead() int {
	if j.ahead == nil {
		return 0
	}
	return int(j.ahead.Load())
}

// N is the dataset's length.
func (j *Job) N() int { return len(j.Samples) }

// Epochs returns the epochs planned for rank, in order.
func (j *Job) Epochs(rank int) []int {
	e := make([]int, j.Spec.Lookahead)
	for i := range e {
		e[i] = j.RankEpoch[rank] + i
	}
	return e
}

// Planned reports whether epoch is planned for rank.
func (j *Job) Planned(rank, epoch int) bool {
	first, ok := j.RankEpoch[rank]
	return ok && epoch >= first && epoch < first+j.Spec.Lookahead
}

// Order returns the sample indices rank reads in epoch, in order. The
// slice is shared and must not be modified. Indices are 4 bytes: a plan
// position costs that much here (a dataset holds fewer than 2^31 samples).
func (j *Job) Order(rank, epoch int) []int32 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.orderLocked(rank, epoch)
}

func (j *Job) orderLocked(rank, epoch int) []int32 {
	if j.Spec.Balance != "" {
		return j.balancedLocked(epoch).orders[rank]
	}
	if p, ok := j.plans[[2]int{rank, epoch}]; ok {
		return p
	}
	p := narrow(ReadOrder(j.Spec, j.N(), rank, epoch))
	if j.plans == nil {
		j.plans = map[[2]int][]int32{}
	}
	// Keep only the planned windows.
	for k := range j.plans {
		if !j.Planned(k[0], k[1]) {
			delete(j.plans, k)
		}
	}
	j.plans[[2]int{rank, epoch}] = p
	return p
}

// Batches returns the batch sizes rank trains on in epoch, in order: the
// stock B (and a shorter last) unless balance=solar made them differ; nil
// if the batch size is not known (BatchKnown).
func (j *Job) Batches(rank, epoch int) []int {
	if !j.batchKnown {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.Spec.Balance != "" {
		return j.balancedLocked(epoch).batches[rank]
	}
	n := len(j.orderLocked(rank, epoch))
	var out []int
	for n > 0 {
		out = append(out, min(n, j.Spec.Batch))
		n -= j.Spec.Batch
	}
	return out
}

// current reports whether a local rank is in epoch (or past it).
func (j *Job) current(epoch int) bool {
	for _, e := range j.RankEpoch {
		if e >= epoch {
			return true
		}
	}
	return false
}

// plannedByAny reports whether any local rank plans epoch.
func (j *Job) plannedByAny(epoch int) bool {
	for r := range j.RankEpoch {
		if j.Planned(r, epoch) {
			return true
		}
	}
	return false
}

// permutationLocked is the epoch whose permutation epoch uses: itself,
// unless epochorder=true, which reorders the permutations of each block of
// lookahead epochs for reuse of the caches (balance.EpochOrder). Blocks
// are fixed (epochs b·L to b·L+L−1), so every node and every call agree.
func (j *Job) permutationLocked(epoch, cached int) int {
	if !j.Spec.EpochOrder || j.Spec.Lookahead < 2 {
		return epoch
	}
	l := j.Spec.Lookahead
	block := epoch / l
	order, ok := j.blocks[block]
	if !ok {
		d := Distributed(j.Spec, j.N())
		perms := make([][]int, l)
		for i := range perms {
			perms[i] = d.Global(block*l + i)
		}
		order = balance.EpochOrder(perms, cached)
		if j.blocks == nil {
			j.blocks = map[int][]int{}
		}
		j.blocks[block] = order
	}
	return block*l + order[epoch-block*l]
}

// narrow copies sample indices into 4-byte ones.
func narrow(xs []int) []int32 {
	out := make([]int32, len(xs))
	for i, x := range xs {
		out[i] = int32(x)
	}
	return out
}
