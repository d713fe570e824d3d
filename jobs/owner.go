package jobs

import (
	"fmt"
	"path"
	"strings"

	"github.com/dlfs/dlfs/access"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/folder"
)

// Owner is who a job acts for: the user whose control write announced it,
// or the reading process's user for an inferred job.
type Owner struct {
	access.Cred
	// Foreign: announced by a process in another pid namespace (a
	// container's), whose requests reach dlfs without a pid; reads without
	// a pid count for such jobs only.
	Foreign bool
}

// RootOwner owns what no user announced (tests, tools).
var RootOwner = Owner{}

// Reads reports whether a read by uid counts for the job: a read by its
// own user, or one without a pid (known false) for a job announced from
// another pid namespace.
func (o Owner) Reads(uid uint32, known bool) bool {
	if !known {
		return o.Foreign
	}
	return uid == o.Uid
}

// view names what o may see, for sharing indexes: root sees everything.
func (o Owner) view() string {
	if o.IsRoot() {
		return "root"
	}
	return fmt.Sprint(o.Uid, o.Gid, o.Groups)
}

// visible returns the samples of the ImageFolder or list at root that
// cred may read by the path the script opens: the file readable, every
// directory above it searchable, and every directory from root down to it
// listable (os.walk lists each; a list file's samples need only the
// file). Root keeps them all.
func visible(snap *catalog.Snapshot, root string, samples []folder.Sample, cred access.Cred, walked bool) []folder.Sample {
	if cred.IsRoot() {
		return samples
	}
	v := viewOf(snap, root, cred, walked)
	out := samples[:0:0]
	for _, s := range samples {
		if v.sample(s) {
			out = append(out, s)
		}
	}
	return out
}

// public reports whether every sample is readable by every user.
func public(snap *catalog.Snapshot, root string, samples []folder.Sample, walked bool) bool {
	v := viewOf(snap, root, access.Everyone, walked)
	for _, s := range samples {
		if !v.sample(s) {
			return false
		}
	}
	return true
}

// view decides, for one user, which samples of one dataset it may read.
type view struct {
	snap   *catalog.Snapshot
	root   *catalog.Entry // the dataset root, resolved
	rootP  string         // its path as given
	cred   access.Cred
	walked bool                    // an ImageFolder: directories are listed
	dirs   map[*catalog.Entry]bool // directory -> listable down from root
	paths  map[string]bool         // the same by path, for samples reached through symlinks
	reach  map[*catalog.Entry]bool // directory -> searchable from the top
}

func viewOf(snap *catalog.Snapshot, root string, cred access.Cred, walked bool) *view {
	root = strings.Trim(path.Clean("/"+root), "/")
	r, _ := folder.Resolve(snap, root)
	return &view{snap: snap, root: r, rootP: root, cred: cred, walked: walked,
		dirs: map[*catalog.Entry]bool{}, paths: map[string]bool{}, reach: map[*catalog.Entry]bool{}}
}

// sample reports whether the user may read s by its path.
func (v *view) sample(s folder.Sample) bool {
	e := s.Entry
	if e == nil || v.root == nil || !v.cred.Allows(e, access.Read) || !v.reachable(e.Parent()) {
		return false
	}
	if !v.walked {
		return true // a list file names its samples: nothing is listed
	}
	if p := s.Path(); p != e.Path() {
		return v.listedPath(path.Dir(p)) // through a symlink: the directories as walked
	}
	return v.listed(e.Parent())
}

// reachable reports whether every directory from the top down to d
// (inclusive) is searchable.
func (v *view) reachable(d *catalog.Entry) bool {
	if d == nil {
		return true
	}
	ok, seen := v.reach[d]
	if !seen {
		ok = v.cred.Allows(d, access.Exec) && v.reachable(d.Parent())
		v.reach[d] = ok
	}
	return ok
}

// listed reports whether d and every directory between the dataset root
// and d may be listed (d's real parents; a directory outside the root,
// reached through a symlink, goes by listedPath).
func (v *view) listed(d *catalog.Entry) bool {
	ok, seen := v.dirs[d]
	if seen {
		return ok
	}
	switch {
	case d == v.root:
		ok = v.cred.CanList(d)
	case d == nil || d.Parent() == nil:
		ok = false // not under the root: only a symlinked path gets here
	default:
		ok = v.cred.Allows(d, access.Read|access.Exec) && v.listed(d.Parent())
	}
	v.dirs[d] = ok
	return ok
}

// listedPath is listed for a directory named by its path as walked.
func (v *view) listedPath(p string) bool {
	if p == "." {
		p = ""
	}
	ok, seen := v.paths[p]
	if seen {
		return ok
	}
	d, err := folder.Resolve(v.snap, p)
	switch {
	case err != nil || !d.IsDir():
		ok = false
	case p == v.rootP:
		ok = v.cred.CanList(d)
	case v.rootP != "" && !strings.HasPrefix(p, v.rootP+"/"):
		ok = false // not under the root
	default:
		ok = v.cred.CanList(d) && v.listedPath(path.Dir(p))
	}
	v.paths[p] = ok
	return ok
}
