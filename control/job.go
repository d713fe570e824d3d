package control

import (
	"fmt"
	"path"
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
//
// Each key is a row of one table (keys.go) that says how the key is
// parsed, checked, written and merged, and which facets of the job it
// decides (Key, Identity, SamePlans, SameDataset).
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
	for _, k := range keys {
		if j.Set[k.name] {
			k.merge(&out, j, base)
		}
	}
	if len(out.Ranks) == 0 {
		out.Ranks = []int{0}
	}
	return out
}

// Validate reports the first key of Set whose value no job line can carry,
// for a Job built in code rather than parsed (package readers): one that
// passes reads back the same through Line and Parse. Parse checks what it
// reads the same way.
func (j Job) Validate() error {
	for _, k := range keys {
		if j.Set[k.name] && k.check != nil {
			if err := k.check(j); err != nil {
				return fmt.Errorf("%w: %s: %v", ErrSyntax, k.name, err)
			}
		}
	}
	for name := range j.Set {
		if _, ok := keyNamed(name); !ok {
			return fmt.Errorf("%w: %s: unknown key; known: %s", ErrSyntax, clip(name), knownKeys())
		}
	}
	if j.Set["rank"] && j.Set["ranks"] {
		return fmt.Errorf("%w: rank given with ranks", ErrSyntax)
	}
	return nil
}

// ParseLine parses line, one whole job as Line writes it (a job another
// node gossips), and returns it merged over DefaultJob and checked.
func ParseLine(line string) (Job, error) {
	cmds, err := Parse([]byte(line))
	if err != nil {
		return Job{}, err
	}
	if len(cmds) != 1 {
		return Job{}, fmt.Errorf("%w: %d commands where one job line was expected", ErrSyntax, len(cmds))
	}
	j, ok := cmds[0].(Job)
	if !ok {
		return Job{}, fmt.Errorf("%w: %q is not a job line", ErrSyntax, clip(line))
	}
	j = j.Merge(DefaultJob())
	return j, j.Check()
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

func (j *Job) set(name, v string) error {
	k, ok := keyNamed(name)
	if !ok {
		return fmt.Errorf("unknown key; known: %s", knownKeys())
	}
	return k.parse(j, v)
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
// the same job (with every key in Set) if j passes Check and Validate.
// Extensions are written only when set, so a job on torchvision's
// defaults keeps them.
func (j Job) Line() string {
	var b strings.Builder
	for _, k := range keys {
		writeKey(&b, j, k)
	}
	return b.String()
}
