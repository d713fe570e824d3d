// Package folder computes the sample index of torchvision's ImageFolder
// (DatasetFolder) from the catalog, in exactly the order torchvision builds
// it, so that a sampler's indices name files.
//
// # torchvision's rules, replicated
//
//   - Classes are the sorted names of root's subdirectories, hidden ones
//     included; a symlink to a directory counts (scandir's is_dir follows
//     links). The control directory is never listed, so it never becomes
//     a class.
//   - Each class directory is walked as sorted(os.walk(dir, followlinks=True)):
//     directories in order of their full path string (so "a-x" comes
//     before "a/b"), files in each sorted by name. Symlinked directories
//     are entered; their samples keep the path through the link.
//   - A file is a sample if its lower-cased name ends with one of the
//     extensions (torchvision lower-cases the name, not the extensions).
//
// Byte order of UTF-8 is code-point order, so Go's string sort agrees
// with Python's.
//
// # Limits
//
// Symlinks whose target leaves the dataset cannot be followed from the
// catalog; their samples are left out and counted in Index.Unresolved.
// A symlink cycle is walked as the kernel lets os.walk walk it, until a
// path needs more than 40 links; a walk that would visit more directories
// than a budget (16 times the catalog's directories, and at least
// MinWalkDirs) is refused, since two links to a parent make 2^40.
package folder

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/dlfs/dlfs/catalog"
)

// IMGExtensions is torchvision's IMG_EXTENSIONS.
var IMGExtensions = []string{".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}

// Sample is one item of the dataset, in 24 bytes: its path is its
// catalog entry's own (Entry.Path walks up the parents) unless the walk
// reached it through a symlink.
type Sample struct {
	Entry  *catalog.Entry // the regular file it resolves to; nil for a dangling link
	link   *string        // the path as the script opens it, where it is not Entry's
	Target int32          // class index
}

// NewSample returns the sample the script opens at p (relative to the
// mount), which resolves to e (nil if it resolves to no regular file).
func NewSample(p string, e *catalog.Entry, target int) Sample {
	s := Sample{Entry: e, Target: int32(target)}
	if e == nil || e.Path() != p {
		s.link = &p
	}
	return s
}

// Path is the sample's path as the script opens it, relative to the mount.
func (s Sample) Path() string {
	if s.link != nil {
		return *s.link
	}
	return s.Entry.Path()
}

// Index is a dataset's sample list.
type Index struct {
	Classes    []string
	Samples    []Sample
	Unresolved int // symlinks whose target is outside the dataset
}

// ErrRoot means the dataset root is missing or not a directory.
var ErrRoot = errors.New("folder: bad dataset root")

// maxLinks bounds symlink hops while resolving one path, as the kernel's
// ELOOP does.
const maxLinks = 40

// MinWalkDirs is the least budget of directories one index may walk.
const MinWalkDirs = 20_000

// ErrTooLarge means the walk exceeded its budget (symlink cycles, usually).
var ErrTooLarge = errors.New("folder: too many directories")

// Build indexes the ImageFolder at root (relative to the mount) in snap.
// exts nil means IMGExtensions.
func Build(snap *catalog.Snapshot, root string, exts []string) (*Index, error) {
	if exts == nil {
		exts = IMGExtensions
	}
	root = strings.Trim(path.Clean("/"+root), "/")
	dir, err := resolve(snap, root)
	if err != nil || !dir.IsDir() {
		return nil, fmt.Errorf("%w: %q is not a directory of the dataset", ErrRoot, root)
	}
	idx := &Index{}
	for c := range dir.Children() {
		if t, err := resolve(snap, join(root, c.Name)); err == nil && t.IsDir() {
			idx.Classes = append(idx.Classes, c.Name)
		}
	}
	budget := max(MinWalkDirs, 16*snap.Dirs)
	seen := 0
	for target, class := range idx.Classes {
		w := walker{snap: snap, idx: idx, exts: exts, budget: budget - seen}
		if err := w.walk(join(root, class)); err != nil {
			return nil, fmt.Errorf("%w: walking %q as os.walk(followlinks=True) would visit more than %d directories; is there a symlink cycle? (a link to a parent directory)",
				err, join(root, class), budget)
		}
		seen += w.seen
		sort.Slice(w.dirs, func(i, j int) bool { return w.dirs[i].path < w.dirs[j].path })
		n := 0
		for _, d := range w.dirs {
			n += len(d.files)
		}
		idx.Samples = slices.Grow(idx.Samples, n)
		for _, d := range w.dirs {
			for _, f := range d.files {
				s := Sample{Entry: f.entry, Target: int32(target)}
				if f.linked || !d.direct {
					p := join(d.path, f.name)
					s.link = &p
				}
				idx.Samples = append(idx.Samples, s)
			}
		}
	}
	return idx, nil
}

func valid(name string, exts []string) bool {
	lower := strings.ToLower(name)
	for _, e := range exts {
		if strings.HasSuffix(lower, e) {
			return true
		}
	}
	return false
}

type file struct {
	name   string
	entry  *catalog.Entry // nil for a dangling link (never a sample: not a regular file)
	linked bool           // a symlink: its path is not entry's
}

type dir struct {
	path   string
	direct bool   // path is the directory's own (no symlink on the way)
	files  []file // its samples, sorted by name
}

type walker struct {
	snap   *catalog.Snapshot
	idx    *Index
	exts   []string // a file is a sample if valid with these
	dirs   []dir
	seen   int // directories walked
	budget int // directories it may walk
}

// walk lists dirPath as os.walk does: entries that resolve to directories
// are descended into, all others are files; a directory that cannot be
// resolved is skipped, as os.walk ignores scandir errors.
func (w *walker) walk(dirPath string) error {
	d, err := resolve(w.snap, dirPath)
	if err != nil || !d.IsDir() {
		return nil
	}
	if w.seen++; w.seen > w.budget {
		return ErrTooLarge
	}
	cur := dir{path: dirPath, direct: d.Path() == dirPath}
	var subdirs []string
	for c := range d.Children() {
		t := c
		if c.IsSymlink() {
			if t, err = resolve(w.snap, join(dirPath, c.Name)); err != nil {
				if errors.Is(err, errOutside) {
					w.idx.Unresolved++
				}
				if valid(c.Name, w.exts) {
					cur.files = append(cur.files, file{name: c.Name, linked: true})
				}
				continue
			}
		}
		if t.IsDir() {
			subdirs = append(subdirs, join(dirPath, c.Name))
			continue
		}
		if !valid(c.Name, w.exts) {
			continue
		}
		var e *catalog.Entry
		if t.IsRegular() {
			e = t
		}
		cur.files = append(cur.files, file{name: c.Name, entry: e, linked: c.IsSymlink()})
	}
	w.dirs = append(w.dirs, cur)
	for _, s := range subdirs {
		if err := w.walk(s); err != nil {
			return err
		}
	}
	return nil
}

var (
	errOutside  = errors.New("folder: symlink leaves the dataset")
	errNotFound = errors.New("folder: no such entry")
	errLoop     = errors.New("folder: too many levels of symbolic links")
)

// Resolve follows p (relative to the mount) through symlinks, as the
// kernel would, and returns the entry it names.
func Resolve(snap *catalog.Snapshot, p string) (*catalog.Entry, error) { return resolve(snap, p) }

func resolve(snap *catalog.Snapshot, p string) (*catalog.Entry, error) {
	hops := 0
	var parts []string
	if p != "" {
		parts = strings.Split(p, "/")
	}
	var stack []*catalog.Entry // directories from the root down
	cur := snap.Root
	for len(parts) > 0 {
		name := parts[0]
		parts = parts[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			if len(stack) == 0 {
				return nil, errOutside
			}
			cur, stack = stack[len(stack)-1], stack[:len(stack)-1]
			continue
		}
		if !cur.IsDir() {
			return nil, errNotFound
		}
		next := cur.Child(name)
		if next == nil {
			return nil, errNotFound
		}
		if next.IsSymlink() {
			if hops++; hops > maxLinks {
				return nil, errLoop
			}
			if strings.HasPrefix(next.Target(), "/") {
				return nil, errOutside // absolute: somewhere on the host
			}
			parts = append(strings.Split(next.Target(), "/"), parts...)
			continue
		}
		stack = append(stack, cur)
		cur = next
	}
	return cur, nil
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}
