package readers

import (
	"path"
	"strings"

	"github.com/dlfs/dlfs/catalog"
)

// fileRead is a stream's first read of a file: the process that read it
// (a DataLoader worker, or the stream's own) and whether it waited on the
// PFS.
type fileRead struct {
	e      *catalog.Entry
	proc   int
	waited bool
}

// commonDir is the deepest directory holding every file of rs ("." for
// the mount).
func commonDir(rs []fileRead) string {
	if len(rs) == 0 {
		return "."
	}
	dir := path.Dir(rs[0].e.Path())
	for _, r := range rs {
		for dir != "." && !strings.HasPrefix(r.e.Path(), dir+"/") {
			dir = path.Dir(dir)
		}
	}
	return dir
}

// under reports whether p (a path relative to the mount) is root or lies
// below it; every path lies below "." and "".
func under(p, root string) bool {
	return root == "." || root == "" || p == root || strings.HasPrefix(p, root+"/")
}

// maxOlderBranches: a stream moved into a new directory only if the files
// it read before lie in at most this many (a training set, say), not
// across many (a shuffled reader of many classes).
const maxOlderBranches = 2

// newPass returns the files of rs (oldest first) that a stream read since
// it moved into a directory it had not read in before, as a validation
// pass over val/ follows an epoch over train/; moved is false if it did
// not. Below the deepest directory holding them all, each file lies in a
// branch (the first name below it); the stream moved if the newest
// files' branch holds none of the older files, and those lie in at most
// maxOlderBranches branches.
func newPass(rs []fileRead) (pass []fileRead, moved bool) {
	if len(rs) < 2 {
		return rs, false
	}
	all := commonDir(rs)
	branch := func(r fileRead) string {
		rel := r.e.Path()
		if all != "." {
			rel = rel[len(all)+1:]
		}
		b, _, ok := strings.Cut(rel, "/")
		if !ok {
			return "" // the file itself lies in all
		}
		return b
	}
	newest := branch(rs[len(rs)-1])
	i := len(rs) - 1
	for i > 0 && branch(rs[i-1]) == newest {
		i--
	}
	older := map[string]bool{}
	for _, r := range rs[:i] {
		older[branch(r)] = true
	}
	if i == 0 || older[newest] || len(older) > maxOlderBranches {
		return rs, false
	}
	return rs[i:], true
}
