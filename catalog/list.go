package catalog

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"syscall"

	"github.com/dlfs/dlfs/source"
)

// The scan of a dataset a Lister lists: the tree built from its paths.

// list stats SOURCE into root and asks the Lister for its files, giving
// up when ctx ends (the calls stuck in a PFS that stopped answering are
// left to end on their own goroutine).
func (c *Catalog) list(ctx context.Context, root *Entry) ([]File, error) {
	type result struct {
		files []File
		err   error
	}
	done := make(chan result, 1)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		if err := c.stat(c.cfg.Source, root); err != nil {
			done <- result{nil, fmt.Errorf("%w: %v", ErrSource, err)}
			return
		}
		files, err := c.cfg.Lister.List(lctx)
		if err != nil {
			err = fmt.Errorf("%w: %v", ErrSource, err)
		}
		done <- result{files, err}
	}()
	select {
	case r := <-done:
		return r.files, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("catalog: list %s: %w", c.cfg.Source, ctx.Err())
	}
}

// build makes the tree under root from a Lister's files, keeping the
// inode numbers of paths whose type matches old. It returns how many
// files it left out (bad paths, repeats, a file under a non-directory).
// The tree is first made of nodes, then frozen into entries, each
// directory's children in one array.
func (c *Catalog) build(root, old *Entry, files []File) int {
	// A directory listed more than once takes its last line. The sort by
	// path is not stable (a stable one costs three times as much on a
	// shuffled listing), so the last lines are found before it.
	lastDir := map[string]File{}
	for _, f := range files {
		if f.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			lastDir[f.Path] = f
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	type node struct {
		e      Entry
		target string
		kids   map[string]*node // directories
		prev   *Entry           // a directory's entry in old
	}
	top := &node{e: *root, kids: map[string]*node{}, prev: old}
	skipped := 0
	// child returns the node name in dir, making it (as f) if missing.
	child := func(dir *node, name string, f File) *node {
		if n := dir.kids[name]; n != nil {
			return n
		}
		n := &node{e: Entry{Name: name, Mode: f.Mode, owner: root.owner,
			Size: f.Size, Mtime: f.Mtime, Ctime: f.Ctime, SrcIno: f.Ino}, target: f.Target}
		var prev *Entry
		if dir.prev != nil {
			if p := dir.prev.Child(name); p != nil && p.Mode&syscall.S_IFMT == n.e.Mode&syscall.S_IFMT {
				prev = p
			}
		}
		if prev != nil {
			n.e.Ino = prev.Ino
		} else {
			n.e.Ino = c.nextIno.Add(1) - 1
		}
		if n.e.IsDir() {
			n.kids, n.prev = map[string]*node{}, prev
		}
		dir.kids[name] = n
		return n
	}
	for _, f := range files {
		names := strings.Split(f.Path, "/")
		if !source.Local(f.Path) || (len(names) == 1 && c.hidden(names[0])) {
			skipped++
			continue
		}
		d := top
		for _, name := range names[:len(names)-1] {
			d = child(d, name, File{Mode: syscall.S_IFDIR | 0o755, Mtime: root.Mtime})
			if !d.e.IsDir() {
				break
			}
		}
		if !d.e.IsDir() {
			skipped++
			continue
		}
		last := names[len(names)-1]
		if f.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			f = lastDir[f.Path]
		}
		if n := d.kids[last]; n != nil {
			if n.e.IsDir() && f.Mode&syscall.S_IFMT == syscall.S_IFDIR {
				n.e.Mode, n.e.Mtime = f.Mode, f.Mtime // a directory listed twice: its last line
			} else {
				skipped++
			}
			continue
		}
		child(d, last, f)
	}
	var freeze func(d *Entry, n *node)
	freeze = func(d *Entry, n *node) {
		if len(n.kids) == 0 {
			return
		}
		names := make([]string, 0, len(n.kids))
		for name := range n.kids {
			names = append(names, name)
		}
		sort.Strings(names)
		kids := make([]Entry, len(names))
		arena := newNames(names)
		for i, name := range names {
			k := n.kids[name]
			kids[i] = k.e
			kids[i].Name, kids[i].parent = arena.intern(name), d
			if k.target != "" {
				kids[i].more = &more{target: k.target}
			}
		}
		d.more = &more{kids: kids}
		for i, name := range names {
			if kids[i].IsDir() {
				freeze(&kids[i], n.kids[name])
			}
		}
	}
	freeze(root, top)
	return skipped
}
