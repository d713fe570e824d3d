package fusefs

import (
	"context"
	"errors"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dlfs/dlfs/catalog"
)

// Entries checked before they are served
//
// A catalog loaded from a saved snapshot may be behind SOURCE (package
// catalog, Check): its entries are served only once checked. A Dataset
// that says so implements Checker, and every request that hands the
// kernel an entry's attributes or listing (lookup, getattr, opendir,
// readlink, open) asks it first. An entry behind SOURCE is resolved
// again, by its parent and name or by its inode number, once the
// Checker has brought the catalog up to date; a listing with attributes
// (READDIRPLUS) gives none for an entry not checked yet, and the kernel
// looks it up when it is used.

// Checker is what a Dataset implements when its catalog may be behind
// SOURCE.
type Checker interface {
	// Check returns nil if e may be served. If e is behind SOURCE it
	// brings the catalog up to date before it returns an error wrapping
	// catalog.ErrBehind, so that e resolved again is current. It may block
	// on I/O; ctx ends when the kernel interrupts the request.
	Check(ctx context.Context, e *catalog.Entry) error
	// Checked reports, without I/O, whether e may be served unasked.
	Checked(e *catalog.Entry) bool
}

// checkTries bounds the resolutions of one request: an entry still behind
// after the catalog caught up twice changes faster than it is rescanned.
const checkTries = 3

// checked returns resolve's entry once the Dataset may serve it.
func (f *FS) checked(cancel <-chan struct{}, resolve func() (*catalog.Entry, fuse.Status)) (*catalog.Entry, fuse.Status) {
	c, ok := f.data.(Checker)
	for try := 1; ; try++ {
		e, st := resolve()
		if !st.Ok() || !ok || c.Checked(e) {
			return e, st
		}
		err := c.Check(requestContext{cancel}, e)
		if err == nil {
			return e, fuse.OK
		}
		if !errors.Is(err, catalog.ErrBehind) || try == checkTries {
			return nil, fuse.Status(toErrno(f.log, "check "+e.Path(), err))
		}
	}
}

// current is entry with the Dataset's check.
func (f *FS) current(cancel <-chan struct{}, ino uint64) (*catalog.Entry, fuse.Status) {
	return f.checked(cancel, func() (*catalog.Entry, fuse.Status) { return f.entry(ino) })
}

// servable reports, without I/O, whether e may be served as it is.
func (f *FS) servable(e *catalog.Entry) bool {
	c, ok := f.data.(Checker)
	return !ok || c.Checked(e)
}

// child resolves name in directory node dir, with the Dataset's check
// of the directory (its listing) and then of the child.
func (f *FS) child(cancel <-chan struct{}, dir uint64, name string) (*catalog.Entry, fuse.Status) {
	return f.checked(cancel, func() (*catalog.Entry, fuse.Status) {
		d, st := f.current(cancel, dir)
		if !st.Ok() {
			return nil, st
		}
		if !d.IsDir() {
			return nil, fuse.Status(syscall.ENOTDIR)
		}
		if c := d.Child(name); c != nil {
			return c, fuse.OK
		}
		return nil, fuse.ENOENT
	})
}
