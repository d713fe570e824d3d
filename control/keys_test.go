package control

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

// randomJob is a merged job whose every value a line can carry and that
// passes Check, drawn from r.
func randomJob(r *rand.Rand) Job {
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	j := DefaultJob()
	j.Name = pick("default", "a", "imnet-1k", "x.y_z")
	j.Root = pick(".", "train", "a/b/c")
	if r.IntN(2) == 0 {
		j.Dataset, j.ListPath = "list", pick("l.txt", "lists/train.txt")
	}
	if r.IntN(2) == 0 {
		j.Extensions = strings.Split(pick(".jpg", ".jpg,.JPEG", ".npy,.a,.b"), ",")
	}
	j.Sampler = pick("distributed", "random", "sequential")
	j.Seed = r.Uint64()
	j.Epoch = r.IntN(MaxEpoch + 1)
	j.World = 1 + r.IntN(MaxWorld)
	j.Ranks = append([]int(nil), r.Perm(min(j.World, 5))[:1+r.IntN(min(j.World, 5))]...)
	j.Shuffle, j.DropLast, j.Torch27 = r.IntN(2) == 0, r.IntN(2) == 0, r.IntN(2) == 0
	j.Batch = 1 + r.IntN(1<<20)
	j.Workers = r.IntN(1025)
	j.Lookahead = 1 + r.IntN(MaxLookahead)
	if j.Sampler == "distributed" && j.Batch > 1 && r.IntN(2) == 0 {
		j.Balance = pick("locality", "solar")
		j.EpochOrder = r.IntN(2) == 0
	}
	return j
}

// TestLineRoundTripProperty: every job Line writes parses back to itself,
// for random jobs over every key of the table; Validate accepts each.
func TestLineRoundTripProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	written := map[string]bool{}
	for range 5000 {
		j := randomJob(r)
		if err := j.Check(); err != nil {
			t.Fatalf("random job %+v: %v", j, err)
		}
		checkLine(t, j)
		cmds, _ := Parse([]byte(j.Line()))
		if err := cmds[0].(Job).Validate(); err != nil {
			t.Fatalf("the parsed line %q fails Validate: %v", j.Line(), err)
		}
		for k := range cmds[0].(Job).Set {
			written[k] = true
		}
	}
	for _, k := range keys {
		if !written[k.name] && k.name != "rank" { // rank= is read, never written (ranks= is)
			t.Errorf("key %s was never written", k.name)
		}
	}
}

// TestFacets: which keys each facet holds, as the lists they replace had
// them (jobs.samePlans, jobs.sameDataset, the daemon's jobIdentity).
func TestFacets(t *testing.T) {
	want := map[string]struct{ identity, plans, dataset bool }{
		"job":        {identity: true},
		"root":       {identity: true, dataset: true},
		"dataset":    {identity: true, dataset: true},
		"extensions": {identity: true, dataset: true},
		"sampler":    {identity: true, plans: true},
		"seed":       {identity: true, plans: true},
		"epoch":      {},
		"world":      {identity: true, plans: true},
		"ranks":      {},
		"shuffle":    {identity: true, plans: true},
		"drop_last":  {identity: true, plans: true},
		"batch":      {plans: true},
		"workers":    {},
		"lookahead":  {plans: true},
		"torch":      {identity: true, plans: true},
		"balance":    {identity: true, plans: true},
		"epochorder": {identity: true, plans: true},
	}
	base := DefaultJob()
	base.Sampler, base.Batch, base.Balance, base.World, base.Ranks = "distributed", 8, "locality", 4, []int{1}
	other := map[string]func(*Job){
		"job":        func(j *Job) { j.Name = "other" },
		"root":       func(j *Job) { j.Root = "other" },
		"dataset":    func(j *Job) { j.Dataset, j.ListPath = "list", "l.txt" },
		"extensions": func(j *Job) { j.Extensions = []string{".x"} },
		"sampler":    func(j *Job) { j.Sampler = "random" },
		"seed":       func(j *Job) { j.Seed = 7 },
		"epoch":      func(j *Job) { j.Epoch = 3 },
		"world":      func(j *Job) { j.World = 5 },
		"ranks":      func(j *Job) { j.Ranks = []int{2, 3} },
		"shuffle":    func(j *Job) { j.Shuffle = false },
		"drop_last":  func(j *Job) { j.DropLast = true },
		"batch":      func(j *Job) { j.Batch = 9 },
		"workers":    func(j *Job) { j.Workers = 3 },
		"lookahead":  func(j *Job) { j.Lookahead = 5 },
		"torch":      func(j *Job) { j.Torch27 = true },
		"balance":    func(j *Job) { j.Balance = "solar" },
		"epochorder": func(j *Job) { j.EpochOrder = true },
	}
	for _, k := range keys {
		if k.name == "rank" {
			continue
		}
		w, ok := want[k.name]
		if !ok {
			t.Errorf("key %s: no facets expected; add it to the test", k.name)
			continue
		}
		j := base
		other[k.name](&j)
		if got := j.Identity() != base.Identity(); got != w.identity {
			t.Errorf("%s: changes the identity: %v, want %v", k.name, got, w.identity)
		}
		if got := !j.SamePlans(base); got != w.plans {
			t.Errorf("%s: changes the plans: %v, want %v", k.name, got, w.plans)
		}
		if got := !j.SameDataset(base); got != w.dataset {
			t.Errorf("%s: changes the dataset: %v, want %v", k.name, got, w.dataset)
		}
	}
	// The workers decide the prefetcher's schedule, not the plans.
	j := base
	j.Workers = 3
	if j.Key(FacetLoader) == base.Key(FacetLoader) {
		t.Error("workers= is not in FacetLoader")
	}
	// nil and no extensions are one dataset: torchvision's defaults.
	j = base
	j.Extensions = []string{}
	if !j.SameDataset(base) {
		t.Error("no extensions and nil extensions are different datasets")
	}
}

// TestValidate: a Job built in code is refused where no line could carry
// it, and accepted as Parse would give it.
func TestValidate(t *testing.T) {
	good := Job{Name: "auto-1", Root: "train", Dataset: "imagefolder", Extensions: []string{".jpg", ".png"}, Epoch: 0,
		Lookahead: 2, Sampler: "distributed", Shuffle: true, Seed: 5, World: 4, Ranks: []int{3},
		Set: map[string]bool{"job": true, "root": true, "dataset": true, "extensions": true, "epoch": true, "lookahead": true,
			"sampler": true, "shuffle": true, "seed": true, "world": true, "ranks": true}}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	checkLine(t, good.Merge(DefaultJob()))
	for name, mutate := range map[string]func(*Job){
		"comma in an extension":  func(j *Job) { j.Extensions = []string{".x,y"} },
		"empty extension":        func(j *Job) { j.Extensions = []string{""} },
		"space in the root":      func(j *Job) { j.Root = "a b" },
		"root not clean":         func(j *Job) { j.Root = "a/../b" },
		"root climbing out":      func(j *Job) { j.Root = "../b" },
		"bad name":               func(j *Job) { j.Name = "a/b" },
		"world 0":                func(j *Job) { j.World = 0 },
		"rank too high":          func(j *Job) { j.Ranks = []int{MaxWorld} },
		"rank twice":             func(j *Job) { j.Ranks = []int{1, 1} },
		"no ranks":               func(j *Job) { j.Ranks = nil },
		"unknown sampler":        func(j *Job) { j.Sampler = "weighted" },
		"lookahead 0":            func(j *Job) { j.Lookahead = 0 },
		"list path with folder":  func(j *Job) { j.ListPath = "l.txt" },
		"unknown key":            func(j *Job) { j.Set["color"] = true },
		"rank with ranks":        func(j *Job) { j.Set["rank"] = true },
		"list naming the mount":  func(j *Job) { j.Dataset, j.ListPath = "list", "." },
		"epoch over the maximum": func(j *Job) { j.Epoch = MaxEpoch + 1 },
	} {
		j := good
		j.Set = map[string]bool{}
		for k := range good.Set {
			j.Set[k] = true
		}
		mutate(&j)
		if err := j.Validate(); err == nil || !errors.Is(err, ErrSyntax) {
			t.Errorf("%s: Validate gave %v, want an ErrSyntax", name, err)
		}
	}
}
