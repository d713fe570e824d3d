package control

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Job registers or updates a training job: which dataset it reads and how
// its sampler orders it. Only the keys in Set were written; the registry
// fills the others from the job's previous line or from the defaults.
//
//	job=NAME          default "default"
//	root=DIR          dataset directory relative to the mount; default "."
//	dataset=KIND      imagefolder (default) or list:PATH, a file in the
//	                  mount listing sample paths (relative to root), one per line
//	extensions=LIST   comma list; default torchvision's IMG_EXTENSIONS
//	sampler=KIND      distributed (default), random or sequential
//	seed=N epoch=N    the sampler's seed and the epoch about to start (epoch is required)
//	world=N           number of ranks; default 1
//	rank=R            adds R to the ranks running on this node (each
//	                  process announces its own); default 0
//	ranks=R,R,...     sets the ranks running on this node
//	shuffle=BOOL drop_last=BOOL   DistributedSampler's options; defaults true, false
//	batch=N workers=N the DataLoader's batch_size and num_workers; defaults 1, 0
//	lookahead=N       epochs to plan ahead; default 2
//	torch=VERSION     the torch release, for randperm's algorithm; default 2.6
//	balance=KIND      locality or solar: let each sample of a global batch be
//	                  trained on by a rank on the node that caches it
//	                  (package balance); needs sampler=distributed and batch
//	epochorder=BOOL   with balance: choose which planned permutation each
//	                  epoch uses, for reuse of the caches; default false
type Job struct {
	Name       string
	Root       string
	Dataset    string // "imagefolder" or "list"
	ListPath   string // for dataset=list:PATH
	Extensions []string
	Sampler    string // "distributed", "random" or "sequential"
	Seed       uint64
	Epoch      int
	World      int
	Ranks      []int
	Shuffle    bool
	DropLast   bool
	Batch      int
	Workers    int
	Lookahead  int
	Torch27    bool   // torch >= 2.7
	Balance    string // "", "locality" or "solar"
	EpochOrder bool

	Set map[string]bool // keys present in the line
}

func (Job) command() {}

// End drops a job.
type End struct{ Job string }

func (End) command() {}

// Limits on values, so that a typo cannot make the daemon plan billions of
// samples.
const (
	MaxWorld     = 1 << 16
	MaxLookahead = 16
	MaxEpoch     = 1 << 30
)

// DefaultJob returns a job with every default filled in.
func DefaultJob() Job {
	return Job{Name: "default", Root: ".", Dataset: "imagefolder", Sampler: "distributed", World: 1,
		Shuffle: true, Batch: 1, Lookahead: 2} // no ranks given means rank 0: see Merge
}

// Merge returns base with the keys set in j overwritten. A job that ends
// up with no ranks runs rank 0.
func (j Job) Merge(base Job) Job {
	out := base
	out.Set = j.Set
	for k := range j.Set {
		switch k {
		case "job":
			out.Name = j.Name
		case "root":
			out.Root = j.Root
		case "dataset":
			out.Dataset, out.ListPath = j.Dataset, j.ListPath
		case "extensions":
			out.Extensions = j.Extensions
		case "sampler":
			out.Sampler = j.Sampler
		case "seed":
			out.Seed = j.Seed
		case "epoch":
			out.Epoch = j.Epoch
		case "world":
			out.World = j.World
		case "ranks":
			out.Ranks = j.Ranks
		case "rank":
			// Each process of a node announces its own rank: collect them.
			out.Ranks = append([]int(nil), base.Ranks...)
			if !slices.Contains(out.Ranks, j.Ranks[0]) {
				out.Ranks = append(out.Ranks, j.Ranks[0])
				slices.Sort(out.Ranks)
			}
		case "shuffle":
			out.Shuffle = j.Shuffle
		case "drop_last":
			out.DropLast = j.DropLast
		case "batch":
			out.Batch = j.Batch
		case "workers":
			out.Workers = j.Workers
		case "lookahead":
			out.Lookahead = j.Lookahead
		case "torch":
			out.Torch27 = j.Torch27
		case "balance":
			out.Balance = j.Balance
		case "epochorder":
			out.EpochOrder = j.EpochOrder
		}
	}
	if len(out.Ranks) == 0 {
		out.Ranks = []int{0}
	}
	return out
}

// Check validates the relations between keys of a merged job.
func (j Job) Check() error {
	for _, r := range j.Ranks {
		if r >= j.World {
			return fmt.Errorf("%w: rank %d is not below world=%d", ErrSyntax, r, j.World)
		}
	}
	switch {
	case j.Balance != "" && j.Sampler != "distributed":
		return fmt.Errorf("%w: balance=%s plans DistributedSampler batches; sampler=%s has none", ErrSyntax, j.Balance, j.Sampler)
	case j.Balance != "" && j.Batch <= 1:
		return fmt.Errorf("%w: balance=%s needs batch=B, the DataLoader's batch_size per rank", ErrSyntax, j.Balance)
	case j.EpochOrder && j.Balance == "":
		return fmt.Errorf("%w: epochorder=true needs balance=locality or balance=solar", ErrSyntax)
	}
	return nil
}

func parseJob(fields []string) (Job, error) {
	j := Job{Set: map[string]bool{}}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return j, fmt.Errorf("%w: %q is not key=value", ErrSyntax, clip(f))
		}
		if j.Set[k] || (k == "rank" && j.Set["ranks"]) || (k == "ranks" && j.Set["rank"]) {
			return j, fmt.Errorf("%w: %s given twice", ErrSyntax, clip(k))
		}
		if err := j.set(k, v); err != nil {
			return j, fmt.Errorf("%w: %s=%q: %v", ErrSyntax, k, clip(v), err)
		}
		j.Set[k] = true
	}
	if len(j.Set) == 0 {
		return j, fmt.Errorf("%w: empty job line", ErrSyntax)
	}
	return j, nil
}

func (j *Job) set(k, v string) error {
	var err error
	switch k {
	case "job":
		err = checkName(v)
		j.Name = v
	case "root":
		if j.Root, err = relPath(v); err != nil {
			return err
		}
	case "dataset":
		switch {
		case v == "imagefolder":
			j.Dataset = v
		case strings.HasPrefix(v, "list:"):
			p, err := relPath(v[5:])
			if err != nil {
				return err
			}
			if p == "." {
				return fmt.Errorf("list:PATH names a file, not the mount's root")
			}
			j.Dataset, j.ListPath = "list", p
		default:
			return fmt.Errorf("want imagefolder or list:PATH")
		}
	case "extensions":
		for _, e := range strings.Split(v, ",") {
			if e == "" {
				return fmt.Errorf("empty extension")
			}
			j.Extensions = append(j.Extensions, e)
		}
	case "sampler":
		if v != "distributed" && v != "random" && v != "sequential" {
			return fmt.Errorf("want distributed, random or sequential")
		}
		j.Sampler = v
	case "seed":
		j.Seed, err = parseSeed(v)
	case "epoch":
		j.Epoch, err = parseInt(v, 0, MaxEpoch)
	case "world":
		j.World, err = parseInt(v, 1, MaxWorld)
	case "rank":
		var r int
		r, err = parseInt(v, 0, MaxWorld-1)
		j.Ranks = []int{r}
	case "ranks":
		seen := map[int]bool{}
		for _, s := range strings.Split(v, ",") {
			r, err := parseInt(s, 0, MaxWorld-1)
			if err != nil {
				return err
			}
			if seen[r] {
				return fmt.Errorf("rank %d listed twice", r)
			}
			seen[r] = true
			j.Ranks = append(j.Ranks, r)
		}
	case "shuffle":
		j.Shuffle, err = parseBool(v)
	case "drop_last":
		j.DropLast, err = parseBool(v)
	case "batch":
		j.Batch, err = parseInt(v, 1, 1<<20)
	case "workers":
		j.Workers, err = parseInt(v, 0, 1024)
	case "lookahead":
		j.Lookahead, err = parseInt(v, 1, MaxLookahead)
	case "torch":
		j.Torch27, err = parseTorch(v)
	case "balance":
		if v != "locality" && v != "solar" {
			return fmt.Errorf("want locality or solar")
		}
		j.Balance = v
	case "epochorder":
		j.EpochOrder, err = parseBool(v)
	default:
		return fmt.Errorf("unknown key; known: job root dataset extensions sampler seed epoch world rank ranks shuffle drop_last batch workers lookahead torch balance epochorder")
	}
	return err
}

// relPath cleans v, a path relative to the mount. An absolute path, or one
// that climbs out of the mount, is an error rather than quietly made
// into another path.
func relPath(v string) (string, error) {
	switch c := path.Clean(v); {
	case v == "" || strings.ContainsRune(v, 0):
		return "", fmt.Errorf("want a path relative to the mount")
	case strings.HasPrefix(v, "/"):
		return "", fmt.Errorf("an absolute path; give it relative to the mount (root=train, not root=/train)")
	case c == ".." || strings.HasPrefix(c, "../"):
		return "", fmt.Errorf("climbs out of the mount")
	default:
		return c, nil
	}
}

// checkName says what a job name may be, if s is not one.
func checkName(s string) error {
	if !validName(s) {
		return fmt.Errorf("want a name of letters, digits, '.', '_' or '-', at most 64")
	}
	return nil
}

func validName(s string) bool {
	if s == "" || len(s) > 64 || s == "." || s == ".." {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

func parseInt(s string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("want an integer from %d to %d", lo, hi)
	}
	return n, nil
}

// parseSeed accepts what torch.Generator.manual_seed accepts: an integer
// in [-2^63, 2^64); negative seeds wrap as in torch.
func parseSeed(s string) (uint64, error) {
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return u, nil
	}
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return uint64(i), nil
	}
	return 0, fmt.Errorf("want an integer in [-2^63, 2^64)")
}

func parseBool(s string) (bool, error) {
	switch strings.ToLower(s) {
	case "1", "true", "yes", "on":
		return true, nil
	case "0", "false", "no", "off":
		return false, nil
	}
	return false, fmt.Errorf("want true or false")
}

// parseTorch reads a torch version such as "1.13.1", "2.7" or
// "2.7.0+cu121" and reports whether it is 2.7 or later.
func parseTorch(s string) (bool, error) {
	parts := strings.SplitN(s, ".", 3)
	if len(parts) < 2 {
		return false, fmt.Errorf("want a version like 2.7")
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil || major < 0 || minor < 0 {
		return false, fmt.Errorf("want a version like 2.7")
	}
	return major > 2 || major == 2 && minor >= 7, nil
}

// Line formats j as a job line with every key, which Parse reads back to
// the same job (with every key in Set). Extensions are written only when
// set, so a job on torchvision's defaults keeps them.
func (j Job) Line() string {
	var b strings.Builder
	kv := func(k, v string) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(v)
	}
	kv("job", j.Name)
	kv("root", j.Root)
	if j.Dataset == "list" {
		kv("dataset", "list:"+j.ListPath)
	} else {
		kv("dataset", j.Dataset)
	}
	if j.Extensions != nil {
		kv("extensions", strings.Join(j.Extensions, ","))
	}
	kv("sampler", j.Sampler)
	kv("seed", strconv.FormatUint(j.Seed, 10))
	kv("epoch", strconv.Itoa(j.Epoch))
	kv("world", strconv.Itoa(j.World))
	if len(j.Ranks) > 0 {
		rs := make([]string, len(j.Ranks))
		for i, r := range j.Ranks {
			rs[i] = strconv.Itoa(r)
		}
		kv("ranks", strings.Join(rs, ","))
	}
	kv("shuffle", strconv.FormatBool(j.Shuffle))
	kv("drop_last", strconv.FormatBool(j.DropLast))
	kv("batch", strconv.Itoa(j.Batch))
	kv("workers", strconv.Itoa(j.Workers))
	kv("lookahead", strconv.Itoa(j.Lookahead))
	if j.Torch27 {
		kv("torch", "2.7")
	} else {
		kv("torch", "2.6")
	}
	if j.Balance != "" {
		kv("balance", j.Balance)
		kv("epochorder", strconv.FormatBool(j.EpochOrder))
	}
	return b.String()
}
