package control

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// A Facet is a group of a job's keys that decide one thing about it
// (see Job.Key).
type Facet uint8

// The facets of a job's keys.
const (
	// FacetIdentity: which samples the job's ranks read, whatever its
	// epoch, its local ranks and its DataLoader. Jobs of one identity on
	// several nodes are one job (placement counts its reads once).
	FacetIdentity Facet = 1 << iota
	// FacetPlans: the plan of each epoch, given the dataset: every
	// rank's order and, under balance=, its batches and the epochs'
	// order.
	FacetPlans
	// FacetDataset: the dataset index.
	FacetDataset
	// FacetLoader: the DataLoader's shape, which spreads a rank's
	// order over its workers (the prefetcher's schedule).
	FacetLoader
)

// A key is one key of a job line: how its value is read, checked, written
// and merged, and which facets it belongs to. Every other list of keys is
// derived from keys.
type key struct {
	name   string
	facets Facet
	// parse reads v into j, which holds no value for the key yet; it
	// calls check on what it read.
	parse func(j *Job, v string) error
	// check says whether j's value is one a line can carry, so that
	// Line writes it and Parse reads it back the same; nil: every value
	// is.
	check func(j Job) error
	// format is j's value as Line writes it; false: Line leaves the key
	// out. nil: Line never writes the key (rank=: ranks= says it).
	format func(j Job) (string, bool)
	// merge sets the key's value in out, which holds base's, from j.
	merge func(out *Job, j, base Job)
}

// keys are a job line's keys, in the order Line writes them.
var keys = []key{
	{name: "job", facets: FacetIdentity,
		parse:  func(j *Job, v string) error { j.Name = v; return checkName(v) },
		check:  func(j Job) error { return checkName(j.Name) },
		format: func(j Job) (string, bool) { return j.Name, true },
		merge:  func(out *Job, j, _ Job) { out.Name = j.Name }},
	{name: "root", facets: FacetIdentity | FacetDataset,
		parse: func(j *Job, v string) (err error) {
			j.Root, err = relPath(v)
			return err
		},
		check:  func(j Job) error { return cleanRel(j.Root) },
		format: func(j Job) (string, bool) { return j.Root, true },
		merge:  func(out *Job, j, _ Job) { out.Root = j.Root }},
	{name: "dataset", facets: FacetIdentity | FacetDataset,
		parse: func(j *Job, v string) error {
			switch {
			case v == "imagefolder":
				j.Dataset = v
			case strings.HasPrefix(v, "list:"):
				p, err := relPath(v[5:])
				if err != nil {
					return err
				}
				j.Dataset, j.ListPath = "list", p
			default:
				return fmt.Errorf("want imagefolder or list:PATH")
			}
			return checkDataset(*j)
		},
		check: checkDataset,
		format: func(j Job) (string, bool) {
			if j.Dataset == "list" {
				return "list:" + j.ListPath, true
			}
			return j.Dataset, true
		},
		merge: func(out *Job, j, _ Job) { out.Dataset, out.ListPath = j.Dataset, j.ListPath }},
	// Extensions are written only when there are some, so that a job on
	// torchvision's defaults keeps them.
	{name: "extensions", facets: FacetIdentity | FacetDataset,
		parse: func(j *Job, v string) error {
			j.Extensions = strings.Split(v, ",")
			return checkExtensions(*j)
		},
		check:  checkExtensions,
		format: func(j Job) (string, bool) { return strings.Join(j.Extensions, ","), len(j.Extensions) > 0 },
		merge:  func(out *Job, j, _ Job) { out.Extensions = j.Extensions }},
	{name: "sampler", facets: FacetIdentity | FacetPlans,
		parse:  func(j *Job, v string) error { j.Sampler = v; return checkSampler(*j) },
		check:  checkSampler,
		format: func(j Job) (string, bool) { return j.Sampler, true },
		merge:  func(out *Job, j, _ Job) { out.Sampler = j.Sampler }},
	{name: "seed", facets: FacetIdentity | FacetPlans,
		parse: func(j *Job, v string) (err error) {
			j.Seed, err = parseSeed(v)
			return err
		},
		format: func(j Job) (string, bool) { return strconv.FormatUint(j.Seed, 10), true },
		merge:  func(out *Job, j, _ Job) { out.Seed = j.Seed }},
	intKey("epoch", 0, 0, MaxEpoch, func(j *Job) *int { return &j.Epoch }),
	intKey("world", FacetIdentity|FacetPlans, 1, MaxWorld, func(j *Job) *int { return &j.World }),
	// rank=R adds R to the ranks of the node (each process announces its
	// own); ranks= sets them. A line gives one or the other.
	{name: "rank",
		parse: func(j *Job, v string) error {
			r, err := strconv.Atoi(v)
			if err != nil {
				return wantRank
			}
			j.Ranks = []int{r}
			return checkRank(*j)
		},
		check: checkRank,
		merge: func(out *Job, j, base Job) {
			out.Ranks = append([]int(nil), base.Ranks...)
			if !slices.Contains(out.Ranks, j.Ranks[0]) {
				out.Ranks = append(out.Ranks, j.Ranks[0])
				slices.Sort(out.Ranks)
			}
		}},
	{name: "ranks",
		parse: func(j *Job, v string) error {
			seen := rankSet{}
			for _, s := range strings.Split(v, ",") {
				r, err := strconv.Atoi(s)
				if err != nil {
					return wantRank
				}
				if err := seen.add(r); err != nil {
					return err
				}
				j.Ranks = append(j.Ranks, r)
			}
			return nil
		},
		check: func(j Job) error {
			seen := rankSet{}
			for _, r := range j.Ranks {
				if err := seen.add(r); err != nil {
					return err
				}
			}
			if len(j.Ranks) == 0 {
				return wantRank
			}
			return nil
		},
		format: func(j Job) (string, bool) {
			rs := make([]string, len(j.Ranks))
			for i, r := range j.Ranks {
				rs[i] = strconv.Itoa(r)
			}
			return strings.Join(rs, ","), len(j.Ranks) > 0
		},
		merge: func(out *Job, j, _ Job) { out.Ranks = j.Ranks }},
	boolKey("shuffle", FacetIdentity|FacetPlans, func(j *Job) *bool { return &j.Shuffle }),
	boolKey("drop_last", FacetIdentity|FacetPlans, func(j *Job) *bool { return &j.DropLast }),
	intKey("batch", FacetPlans|FacetLoader, 1, 1<<20, func(j *Job) *int { return &j.Batch }),
	intKey("workers", FacetLoader, 0, 1024, func(j *Job) *int { return &j.Workers }),
	intKey("lookahead", FacetPlans, 1, MaxLookahead, func(j *Job) *int { return &j.Lookahead }),
	{name: "torch", facets: FacetIdentity | FacetPlans,
		parse: func(j *Job, v string) (err error) {
			j.Torch27, err = parseTorch(v)
			return err
		},
		format: func(j Job) (string, bool) {
			if j.Torch27 {
				return "2.7", true
			}
			return "2.6", true
		},
		merge: func(out *Job, j, _ Job) { out.Torch27 = j.Torch27 }},
	// balance= and epochorder= are written only for a job with balance=.
	{name: "balance", facets: FacetIdentity | FacetPlans,
		parse:  func(j *Job, v string) error { j.Balance = v; return checkBalance(*j) },
		check:  checkBalance,
		format: func(j Job) (string, bool) { return j.Balance, j.Balance != "" },
		merge:  func(out *Job, j, _ Job) { out.Balance = j.Balance }},
	{name: "epochorder", facets: FacetIdentity | FacetPlans,
		parse: func(j *Job, v string) (err error) {
			j.EpochOrder, err = parseBool(v)
			return err
		},
		format: func(j Job) (string, bool) { return strconv.FormatBool(j.EpochOrder), j.Balance != "" },
		merge:  func(out *Job, j, _ Job) { out.EpochOrder = j.EpochOrder }},
}

// keyNamed returns the key called name.
func keyNamed(name string) (key, bool) {
	i := slices.IndexFunc(keys, func(k key) bool { return k.name == name })
	if i < 0 {
		return key{}, false
	}
	return keys[i], true
}

// knownKeys lists the keys' names, for errors.
func knownKeys() string {
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = k.name
	}
	return strings.Join(names, " ")
}

// intKey is a key whose value is the integer *field(j), from lo to hi.
func intKey(name string, facets Facet, lo, hi int, field func(*Job) *int) key {
	check := func(j Job) error {
		if n := *field(&j); n < lo || n > hi {
			return wantInt(lo, hi)
		}
		return nil
	}
	return key{name: name, facets: facets,
		parse: func(j *Job, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil {
				return wantInt(lo, hi)
			}
			*field(j) = n
			return check(*j)
		},
		check:  check,
		format: func(j Job) (string, bool) { return strconv.Itoa(*field(&j)), true },
		merge:  func(out *Job, j, _ Job) { *field(out) = *field(&j) }}
}

// boolKey is a key whose value is the boolean *field(j).
func boolKey(name string, facets Facet, field func(*Job) *bool) key {
	return key{name: name, facets: facets,
		parse: func(j *Job, v string) (err error) {
			*field(j), err = parseBool(v)
			return err
		},
		format: func(j Job) (string, bool) { return strconv.FormatBool(*field(&j)), true },
		merge:  func(out *Job, j, _ Job) { *field(out) = *field(&j) }}
}

func wantInt(lo, hi int) error { return fmt.Errorf("want an integer from %d to %d", lo, hi) }

var wantRank = wantInt(0, MaxWorld-1)

// rankSet collects a line's ranks: each below MaxWorld, none twice.
type rankSet map[int]bool

func (s rankSet) add(r int) error {
	if r < 0 || r > MaxWorld-1 {
		return wantRank
	}
	if s[r] {
		return fmt.Errorf("rank %d listed twice", r)
	}
	s[r] = true
	return nil
}

func checkRank(j Job) error {
	if len(j.Ranks) != 1 || j.Ranks[0] < 0 || j.Ranks[0] > MaxWorld-1 {
		return wantRank
	}
	return nil
}

// cleanRel says whether p is a clean path relative to the mount, as
// relPath makes it.
func cleanRel(p string) error {
	c, err := relPath(p)
	switch {
	case err != nil:
		return err
	case strings.IndexFunc(p, unicode.IsSpace) >= 0:
		return fmt.Errorf("a path with a space cannot be named in a job line")
	case c != p:
		return fmt.Errorf("want the clean path %q", c)
	}
	return nil
}

func checkDataset(j Job) error {
	switch j.Dataset {
	case "imagefolder":
		if j.ListPath != "" {
			return fmt.Errorf("a list file given with dataset=imagefolder")
		}
		return nil
	case "list":
		if err := cleanRel(j.ListPath); err != nil {
			return err
		}
		if j.ListPath == "." {
			return fmt.Errorf("list:PATH names a file, not the mount's root")
		}
		return nil
	}
	return fmt.Errorf("want imagefolder or list:PATH")
}

func checkExtensions(j Job) error {
	for _, e := range j.Extensions {
		switch {
		case e == "":
			return fmt.Errorf("empty extension")
		case strings.ContainsRune(e, ',') || strings.IndexFunc(e, unicode.IsSpace) >= 0:
			return fmt.Errorf("extension %q holds a comma or a space", clip(e))
		}
	}
	return nil
}

func checkSampler(j Job) error {
	if j.Sampler != "distributed" && j.Sampler != "random" && j.Sampler != "sequential" {
		return fmt.Errorf("want distributed, random or sequential")
	}
	return nil
}

func checkBalance(j Job) error {
	if j.Balance != "locality" && j.Balance != "solar" {
		return fmt.Errorf("want locality or solar")
	}
	return nil
}

// Key is j's keys of any of the facets f, as Line writes them (in Line's
// order; keys Line leaves out are left out). Two jobs that pass Check
// have the same Key of f exactly when they agree on every key of f.
func (j Job) Key(f Facet) string {
	var b strings.Builder
	for _, k := range keys {
		if k.facets&f != 0 {
			writeKey(&b, j, k)
		}
	}
	return b.String()
}

// Identity names which samples j's ranks read (FacetIdentity): its keys
// but the epoch, the local ranks and the DataLoader's.
func (j Job) Identity() string { return j.Key(FacetIdentity) }

// SamePlans reports whether j and o draw the same plan for an epoch of
// one dataset (they may differ in which epoch or ranks they are at).
func (j Job) SamePlans(o Job) bool { return j.Key(FacetPlans) == o.Key(FacetPlans) }

// SameDataset reports whether j and o index the same dataset.
func (j Job) SameDataset(o Job) bool { return j.Key(FacetDataset) == o.Key(FacetDataset) }

// writeKey appends k=value to b if Line writes k for j.
func writeKey(b *strings.Builder, j Job, k key) {
	if k.format == nil {
		return
	}
	v, ok := k.format(j)
	if !ok {
		return
	}
	if b.Len() > 0 {
		b.WriteByte(' ')
	}
	b.WriteString(k.name)
	b.WriteByte('=')
	b.WriteString(v)
}
