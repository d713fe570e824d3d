package fusefs

import (
	"path"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dlfs/dlfs/accesslog"
	"github.com/dlfs/dlfs/catalog"
)

// The requests go-fuse calls, each timed for Config.Latency and logged to
// Config.AccessLog around the method that serves it (dataset.go,
// control.go). With neither, a request pays one nil check and an atomic
// load.

// op is a FUSE operation, as the histograms and the access log name it.
type op uint8

const (
	opLookup op = iota
	opGetattr
	opSetattr
	opOpen
	opRead
	opWrite
	opReadlink
	opOpendir
	opReaddir
	opReaddirplus
	opReleasedir
	opStatfs
	opRelease
	numOps
)

var opNames = [numOps]string{"lookup", "getattr", "setattr", "open", "read", "write", "readlink",
	"opendir", "readdir", "readdirplus", "releasedir", "statfs", "release"}

// begin starts timing a request: the zero time when nothing watches.
func (f *FS) begin() time.Time {
	if f.hist[0] != nil || f.alog.Active() {
		return time.Now()
	}
	return time.Time{}
}

// done records a request begun at t0: on node ino (and name within it,
// for a lookup), at off (-1: not a read), n bytes from source, answered
// st.
func (f *FS) done(t0 time.Time, o op, h *fuse.InHeader, ino uint64, name string, off int64, n int, source string, st fuse.Status) {
	if t0.IsZero() {
		return
	}
	took := time.Since(t0)
	f.hist[o].Observe(took)
	if f.alog.Active() {
		f.alog.Add(accesslog.Record{Start: t0, Pid: h.Caller.Pid, Op: opNames[o], Path: f.pathOf(ino, name),
			Offset: off, Bytes: n, Source: source, Took: took, Status: syscall.Errno(st)})
	}
}

// pathOf names node ino (and name within it) for the access log, relative
// to the mount's root. A node the filesystem no longer has (a refresh
// removed it, or a control node was forgotten) is "?": its request is
// answered ESTALE, and is neither the root's nor a name within the root.
func (f *FS) pathOf(ino uint64, name string) string {
	p := "?"
	switch {
	case isPseudo(ino):
		f.mu.Lock()
		if n := f.pseudo.byIno[ino]; n != nil {
			p = path.Join(f.cfg.ControlName, n.path)
		}
		f.mu.Unlock()
	case ino == catalog.RootIno:
		p = ""
	default:
		if e := f.data.Snapshot().ByIno(ino); e != nil {
			p = e.Path()
		}
	}
	if name != "" {
		p = path.Join(p, name)
	}
	return p
}

func (f *FS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	t0 := f.begin()
	st := f.lookup(cancel, h, name, out)
	f.done(t0, opLookup, h, h.NodeId, name, -1, 0, "", st)
	return st
}

func (f *FS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	t0 := f.begin()
	st := f.getAttr(cancel, in, out)
	f.done(t0, opGetattr, &in.InHeader, in.NodeId, "", -1, 0, "", st)
	return st
}

func (f *FS) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	t0 := f.begin()
	st := f.setAttr(cancel, in, out)
	f.done(t0, opSetattr, &in.InHeader, in.NodeId, "", -1, 0, "", st)
	return st
}

func (f *FS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	t0 := f.begin()
	st := f.open(cancel, in, out)
	source, n := "", 0
	if out.OpenFlags&fuse.FOPEN_PASSTHROUGH != 0 && !t0.IsZero() {
		// Its reads will not come: the log has the open, with its bytes.
		source = "passthrough"
		if e := f.data.Snapshot().ByIno(in.NodeId); e != nil {
			n = int(e.Size)
		}
	}
	f.done(t0, opOpen, &in.InHeader, in.NodeId, "", -1, n, source, st)
	return st
}

func (f *FS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	t0 := f.begin()
	b, source, st := f.read(cancel, in, buf)
	f.done(t0, opRead, &in.InHeader, in.NodeId, "", int64(in.Offset), len(b), source, st)
	if !st.Ok() {
		return nil, st
	}
	return readResult(b), st
}

func (f *FS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	t0 := f.begin()
	n, st := f.write(cancel, in, data)
	f.done(t0, opWrite, &in.InHeader, in.NodeId, "", int64(in.Offset), int(n), "", st)
	return n, st
}

func (f *FS) Readlink(cancel <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	t0 := f.begin()
	b, st := f.readlink(cancel, h)
	f.done(t0, opReadlink, h, h.NodeId, "", -1, len(b), "", st)
	return b, st
}

func (f *FS) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	t0 := f.begin()
	st := f.openDir(cancel, in, out)
	f.done(t0, opOpendir, &in.InHeader, in.NodeId, "", -1, 0, "", st)
	return st
}

func (f *FS) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	t0 := f.begin()
	st := f.readDir(cancel, in, out)
	f.done(t0, opReaddir, &in.InHeader, in.NodeId, "", int64(in.Offset), 0, "", st)
	return st
}

func (f *FS) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	t0 := f.begin()
	st := f.readDirPlus(cancel, in, out)
	f.done(t0, opReaddirplus, &in.InHeader, in.NodeId, "", int64(in.Offset), 0, "", st)
	return st
}

func (f *FS) ReleaseDir(in *fuse.ReleaseIn) {
	t0 := f.begin()
	f.releaseDir(in)
	f.done(t0, opReleasedir, &in.InHeader, in.NodeId, "", -1, 0, "", fuse.OK)
}

func (f *FS) StatFs(cancel <-chan struct{}, in *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	t0 := f.begin()
	st := f.statFs(cancel, out)
	f.done(t0, opStatfs, in, in.NodeId, "", -1, 0, "", st)
	return st
}
