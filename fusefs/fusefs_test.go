package fusefs

import (
	"context"
	"encoding/binary"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dlfs/dlfs/catalog"
)

// tree is a Dataset over a catalog of a temporary directory.
type tree struct{ cat *catalog.Catalog }

func (t tree) Snapshot() *catalog.Snapshot { return t.cat.Snapshot() }
func (t tree) Source() string              { return t.cat.Source() }
func (t tree) ReadAt(ctx context.Context, e *catalog.Entry, dest []byte, off int64, pid uint32) ([]byte, string, error) {
	f, err := os.Open(filepath.Join(t.cat.Source(), e.Path()))
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	n, err := f.ReadAt(dest, off)
	if n > 0 || off >= e.Size {
		err = nil
	}
	return dest[:n], "pfs", err
}

// plane is a ControlPlane with a stats file that counts its renderings,
// a writable control file and a jobs directory.
type plane struct {
	renders int
	written []string
}

func (p *plane) List(dir string) ([]PseudoEntry, error) {
	switch dir {
	case "":
		return []PseudoEntry{{Name: "control", Writable: true}, {Name: "jobs", Dir: true}, {Name: "stats"}}, nil
	case "jobs":
		return nil, nil
	}
	return nil, fmt.Errorf("control %q: %w", dir, fs.ErrNotExist)
}

func (p *plane) Read(path string) ([]byte, error) {
	p.renders++
	return fmt.Appendf(nil, "%s %d\n", path, p.renders), nil
}

func (p *plane) Write(ctx context.Context, path string, data []byte) error {
	p.written = append(p.written, string(data))
	return nil
}

func newTree(t testing.TB, files int) (*FS, *plane) {
	t.Helper()
	root := t.TempDir()
	for i := 0; i < files; i++ {
		p := filepath.Join(root, fmt.Sprintf("class_%d", i%3), fmt.Sprintf("img_%04d.jpg", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(strings.Repeat("x", i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("class_0/img_0000.jpg", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	cfg := catalog.DefaultConfig(root)
	cfg.Hide = []string{".dlfs"}
	cat, err := catalog.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &plane{}
	return New(Config{}, tree{cat}, p), p
}

func header(ino uint64) fuse.InHeader { return fuse.InHeader{NodeId: ino} }

func lookup(t *testing.T, f *FS, parent uint64, name string) fuse.EntryOut {
	t.Helper()
	var out fuse.EntryOut
	h := header(parent)
	if st := f.Lookup(nil, &h, name, &out); !st.Ok() {
		t.Fatalf("lookup %q in %d: %v", name, parent, st)
	}
	return out
}

// listing reads a directory through ReadDir or ReadDirPlus with a buffer
// of size bytes, resuming at each answer's last offset, as the kernel does.
func listing(t *testing.T, f *FS, ino uint64, plus bool, size int) (names []string, entries []fuse.EntryOut) {
	t.Helper()
	var open fuse.OpenOut
	if st := f.OpenDir(nil, &fuse.OpenIn{InHeader: header(ino)}, &open); !st.Ok() {
		t.Fatalf("opendir %d: %v", ino, st)
	}
	defer f.ReleaseDir(&fuse.ReleaseIn{Fh: open.Fh})
	off := uint64(0)
	for round := 0; ; round++ {
		if round > 1000 {
			t.Fatal("readdir never ends")
		}
		out := fuse.NewDirEntryList(make([]byte, size), off)
		in := &fuse.ReadIn{InHeader: header(ino), Fh: open.Fh, Offset: off}
		var st fuse.Status
		if plus {
			st = f.ReadDirPlus(nil, in, out)
		} else {
			st = f.ReadDir(nil, in, out)
		}
		if !st.Ok() {
			t.Fatalf("readdir %d: %v", ino, st)
		}
		got := parseDirents(t, out.Bytes(), plus)
		if len(got) == 0 {
			return names, entries
		}
		for _, d := range got {
			names = append(names, d.name)
			entries = append(entries, d.entry)
			off = d.off
		}
	}
}

type dirent struct {
	name  string
	off   uint64
	entry fuse.EntryOut
}

// parseDirents decodes a READDIR(PLUS) answer as the kernel would.
func parseDirents(t *testing.T, b []byte, plus bool) []dirent {
	t.Helper()
	var out []dirent
	for len(b) > 0 {
		var d dirent
		if plus {
			d.entry = *(*fuse.EntryOut)(ptr(b))
			b = b[entryOutSize:]
		}
		// struct fuse_dirent: ino, off, namelen, type, name, padding to 8.
		d.off = le64(b[8:])
		n := int(le32(b[16:]))
		d.name = string(b[24 : 24+n])
		out = append(out, d)
		b = b[(24+n+7)&^7:]
	}
	return out
}

func TestLookupAndAttr(t *testing.T) {
	f, _ := newTree(t, 10)
	dir := lookup(t, f, catalog.RootIno, "class_1")
	if dir.Mode&syscall.S_IFDIR == 0 || dir.NodeId == 0 {
		t.Fatalf("class_1: %+v", dir)
	}
	file := lookup(t, f, dir.NodeId, "img_0004.jpg")
	if file.Size != 4 || file.NodeId == dir.NodeId || file.EntryTimeout() == 0 {
		t.Errorf("img_0004.jpg: %+v", file)
	}
	var attr fuse.AttrOut
	if st := f.GetAttr(nil, &fuse.GetAttrIn{InHeader: header(file.NodeId)}, &attr); !st.Ok() || attr.Size != 4 || attr.Ino != file.NodeId {
		t.Errorf("getattr: %v %+v", st, attr)
	}
	var out fuse.EntryOut
	h := header(dir.NodeId)
	if st := f.Lookup(nil, &h, "missing", &out); st != fuse.ENOENT {
		t.Errorf("missing name: %v, want ENOENT", st)
	}
	h = header(file.NodeId)
	if st := f.Lookup(nil, &h, "x", &out); st != fuse.Status(syscall.ENOTDIR) {
		t.Errorf("lookup under a file: %v, want ENOTDIR", st)
	}
	if st := f.GetAttr(nil, &fuse.GetAttrIn{InHeader: header(1 << 40)}, &attr); st != fuse.Status(syscall.ESTALE) {
		t.Errorf("unknown node: %v, want ESTALE", st)
	}
	link := lookup(t, f, catalog.RootIno, "link")
	h = header(link.NodeId)
	if target, st := f.Readlink(nil, &h); !st.Ok() || string(target) != "class_0/img_0000.jpg" {
		t.Errorf("readlink: %q %v", target, st)
	}
	buf := make([]byte, 64)
	res, st := f.Read(nil, &fuse.ReadIn{InHeader: header(file.NodeId), Offset: 1, Size: 64}, buf)
	if !st.Ok() {
		t.Fatal(st)
	}
	if b, _ := res.Bytes(nil); string(b) != "xxx" {
		t.Errorf("read at 1: %q, want xxx", b)
	}
	var mk fuse.EntryOut
	if st := f.Mkdir(nil, &fuse.MkdirIn{InHeader: header(catalog.RootIno)}, "new", &mk); st != fuse.EROFS {
		t.Errorf("mkdir: %v, want EROFS", st)
	}
	if st := f.Open(nil, &fuse.OpenIn{InHeader: header(file.NodeId), Flags: syscall.O_WRONLY}, &fuse.OpenOut{}); st != fuse.EROFS {
		t.Errorf("open for writing: %v, want EROFS", st)
	}
	if st := f.Open(nil, &fuse.OpenIn{InHeader: header(file.NodeId)}, &fuse.OpenOut{}); st != noOpen {
		t.Errorf("open for reading: %v, want ENOSYS (no opens on this mount)", st)
	}
}

// TestListing: a listing read in small pieces, plain or plus, has every
// child once, in order, without the control directory; READDIRPLUS
// carries the attributes a lookup would.
func TestListing(t *testing.T) {
	f, _ := newTree(t, 300)
	dir := lookup(t, f, catalog.RootIno, "class_2")
	for _, plus := range []bool{false, true} {
		for _, size := range []int{200, 4096} {
			names, entries := listing(t, f, dir.NodeId, plus, size)
			if len(names) != 102 || names[0] != "." || names[1] != ".." || names[2] != "img_0002.jpg" || names[101] != "img_0299.jpg" {
				t.Fatalf("plus=%v size=%d: %d names %v…", plus, size, len(names), names[:min(4, len(names))])
			}
			if plus {
				e := lookup(t, f, dir.NodeId, "img_0299.jpg")
				if got := entries[101]; got.NodeId != e.NodeId || got.Size != 299 || got.EntryTimeout() == 0 {
					t.Errorf("size=%d: READDIRPLUS entry %+v, want the lookup's %+v", size, got, e)
				}
				if entries[0].NodeId != 0 || entries[1].NodeId != 0 {
					t.Errorf("dot entries carry node IDs: %d %d", entries[0].NodeId, entries[1].NodeId)
				}
			}
		}
	}
	names, _ := listing(t, f, catalog.RootIno, true, 4096)
	if got := strings.Join(names, ","); got != ".,..,class_0,class_1,class_2,link" {
		t.Errorf("root: %s", got)
	}
}

// TestControlRenderings: each lookup of a control file renders it anew
// under a new node ID; forgetting it frees it; directories keep their ID.
func TestControlRenderings(t *testing.T) {
	f, p := newTree(t, 3)
	ctl := lookup(t, f, catalog.RootIno, ".dlfs")
	if again := lookup(t, f, catalog.RootIno, ".dlfs"); again.NodeId != ctl.NodeId {
		t.Errorf("the control directory changed ID: %d then %d", ctl.NodeId, again.NodeId)
	}
	a := lookup(t, f, ctl.NodeId, "stats")
	b := lookup(t, f, ctl.NodeId, "stats")
	if a.NodeId == b.NodeId || p.renders != 2 {
		t.Errorf("two lookups of stats: IDs %d %d, %d renderings", a.NodeId, b.NodeId, p.renders)
	}
	buf := make([]byte, 100)
	res, st := f.Read(nil, &fuse.ReadIn{InHeader: header(a.NodeId), Size: 100}, buf)
	if got, _ := res.Bytes(buf); !st.Ok() || string(got) != "stats 1\n" {
		t.Errorf("first rendering: %q %v", got, st)
	}
	f.Forget(a.NodeId, 1)
	var attr fuse.AttrOut
	if st := f.GetAttr(nil, &fuse.GetAttrIn{InHeader: header(a.NodeId)}, &attr); st.Ok() {
		t.Errorf("a forgotten rendering still answers")
	}
	if len(f.pseudo.byIno) != 2 {
		t.Errorf("%d control nodes held, want 2 (the directory and one rendering)", len(f.pseudo.byIno))
	}
	c := lookup(t, f, ctl.NodeId, "control")
	if st := f.SetAttr(nil, &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{InHeader: header(c.NodeId), Valid: fuse.FATTR_SIZE}}, &attr); !st.Ok() {
		t.Errorf("truncating the control file: %v", st)
	}
	if n, st := f.Write(nil, &fuse.WriteIn{InHeader: header(c.NodeId)}, []byte("refresh\n")); !st.Ok() || n != 8 || len(p.written) != 1 {
		t.Errorf("write: %d %v %v", n, st, p.written)
	}
	if _, st := f.Write(nil, &fuse.WriteIn{InHeader: header(b.NodeId)}, []byte("x")); st != fuse.EACCES {
		t.Errorf("write to stats: %v, want EACCES", st)
	}
	names, _ := listing(t, f, ctl.NodeId, true, 4096)
	if got := strings.Join(names, ","); got != ".,..,control,jobs,stats" {
		t.Errorf("control listing: %s", got)
	}
}

const entryOutSize = int(unsafe.Sizeof(fuse.EntryOut{}))

func ptr(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
func le64(b []byte) uint64        { return binary.LittleEndian.Uint64(b) }
func le32(b []byte) uint32        { return binary.LittleEndian.Uint32(b) }

// FuzzRequests sends sequences of requests with arbitrary node IDs,
// handles, offsets, sizes and names: the filesystem answers each with a
// status, never a panic, and never reads more than was asked.
func FuzzRequests(f *testing.F) {
	f.Add([]byte{0, 1, 0, 5, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Add([]byte("\x00\x01\x00\x05.dlfs\x06\x02\x00\x00\x07\x03\x00\x00\x00"))
	fsys, _ := newTree(f, 20)
	f.Fuzz(func(t *testing.T, ops []byte) {
		known := []uint64{catalog.RootIno, 2, 3, pseudoBase, pseudoBase + 1, 1 << 40, 0}
		var fhs []uint64
		buf := make([]byte, 4096)
		for len(ops) >= 4 {
			op, ino, arg, n := ops[0]%10, known[int(ops[1])%len(known)], uint64(ops[2]), int(ops[3])
			ops = ops[4:]
			name := string(ops[:min(n%16, len(ops))])
			ops = ops[len(name):]
			switch op {
			case 0:
				var out fuse.EntryOut
				h := header(ino)
				if fsys.Lookup(nil, &h, name, &out).Ok() {
					known = append(known, out.NodeId)
				}
			case 1:
				fsys.GetAttr(nil, &fuse.GetAttrIn{InHeader: header(ino)}, &fuse.AttrOut{})
			case 2:
				size := uint32(arg * 37)
				res, st := fsys.Read(nil, &fuse.ReadIn{InHeader: header(ino), Offset: arg * 1000, Size: size}, buf)
				if st.Ok() {
					if b, _ := res.Bytes(buf); len(b) > int(size) {
						t.Fatalf("read of %d bytes returned %d", size, len(b))
					}
				}
			case 3:
				var out fuse.OpenOut
				if fsys.OpenDir(nil, &fuse.OpenIn{InHeader: header(ino)}, &out).Ok() {
					fhs = append(fhs, out.Fh)
				}
			case 4, 5:
				fh := arg
				if len(fhs) > 0 {
					fh = fhs[int(arg)%len(fhs)]
				}
				list := fuse.NewDirEntryList(make([]byte, 64+int(arg)*8), arg%7)
				in := &fuse.ReadIn{InHeader: header(ino), Fh: fh, Offset: arg % 7}
				if op == 4 {
					fsys.ReadDir(nil, in, list)
				} else {
					fsys.ReadDirPlus(nil, in, list)
				}
			case 6:
				fsys.Forget(ino, arg)
			case 7:
				fsys.Write(nil, &fuse.WriteIn{InHeader: header(ino)}, []byte(name))
			case 8:
				fsys.SetAttr(nil, &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{InHeader: header(ino), Valid: uint32(arg), Size: arg}}, &fuse.AttrOut{})
			case 9:
				h := header(ino)
				fsys.Readlink(nil, &h)
				fsys.Open(nil, &fuse.OpenIn{InHeader: header(ino), Flags: uint32(arg)}, &fuse.OpenOut{})
			}
		}
		for _, fh := range fhs {
			fsys.ReleaseDir(&fuse.ReleaseIn{Fh: fh})
		}
	})
}

// TestFirstPlusChunk: without ListingAttrs, a directory's first
// READDIRPLUS answer is the dot entries alone (the kernel then lists on
// with plain READDIR and makes no inode per entry); with it, the answer
// is as full as the buffer allows.
func TestFirstPlusChunk(t *testing.T) {
	for _, attrs := range []bool{false, true} {
		f, _ := newTree(t, 30)
		f.cfg.ListingAttrs = attrs
		dir := lookup(t, f, catalog.RootIno, "class_0")
		var open fuse.OpenOut
		if st := f.OpenDir(nil, &fuse.OpenIn{InHeader: header(dir.NodeId)}, &open); !st.Ok() {
			t.Fatal(st)
		}
		out := fuse.NewDirEntryList(make([]byte, 1<<16), 0)
		f.ReadDirPlus(nil, &fuse.ReadIn{InHeader: header(dir.NodeId), Fh: open.Fh}, out)
		got := parseDirents(t, out.Bytes(), true)
		if want := map[bool]int{false: 2, true: 12}[attrs]; len(got) != want {
			t.Errorf("ListingAttrs=%v: first answer has %d entries, want %d", attrs, len(got), want)
		}
	}
}

// pipePlane is plane with a named pipe in the control directory.
type pipePlane struct{ plane }

func (p *pipePlane) List(dir string) ([]PseudoEntry, error) {
	list, err := p.plane.List(dir)
	if dir == "" {
		list = append(list, PseudoEntry{Name: "accesslog", Pipe: true})
	}
	return list, err
}

// TestControlPipeKeepsItsID: every lookup of a named pipe answers one node
// ID while the kernel holds it (its reader and writer must meet at one
// inode), as directories do; forgotten, the next lookup gets a new one.
func TestControlPipeKeepsItsID(t *testing.T) {
	f, _ := newTree(t, 3)
	f.ctl = &pipePlane{}
	ctl := lookup(t, f, catalog.RootIno, ".dlfs")
	a := lookup(t, f, ctl.NodeId, "accesslog")
	b := lookup(t, f, ctl.NodeId, "accesslog")
	if a.NodeId != b.NodeId {
		t.Fatalf("two lookups of the pipe: IDs %d and %d, want one", a.NodeId, b.NodeId)
	}
	if a.Attr.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		t.Errorf("the pipe's mode is %o", a.Attr.Mode)
	}
	held := len(f.pseudo.byIno)
	f.Forget(a.NodeId, 1)
	if len(f.pseudo.byIno) != held {
		t.Errorf("one of two lookups forgotten dropped the pipe")
	}
	f.Forget(a.NodeId, 1)
	if len(f.pseudo.byIno) != held-1 || len(f.pseudo.dirs) != 1 {
		t.Errorf("the forgotten pipe is still held: %d nodes, %d by path", len(f.pseudo.byIno), len(f.pseudo.dirs))
	}
	if c := lookup(t, f, ctl.NodeId, "accesslog"); c.NodeId == a.NodeId {
		t.Errorf("a forgotten pipe's ID was reused")
	}
}

// TestControlPathCached: the kernel may cache the entries of the control
// directory and of the pipe (the daemon's access-log writer walks to the
// pipe by its path on every poll, and must send its mount no request);
// other control directories' entries it asks for each time.
func TestControlPathCached(t *testing.T) {
	f, _ := newTree(t, 3)
	f.ctl = &pipePlane{}
	ctl := lookup(t, f, catalog.RootIno, ".dlfs")
	pipe := lookup(t, f, ctl.NodeId, "accesslog")
	ttl := uint64(f.cfg.TTL / time.Second)
	for name, e := range map[string]fuse.EntryOut{".dlfs": ctl, "accesslog": pipe} {
		if e.EntryValid != ttl || e.AttrValid != ttl {
			t.Errorf("%s: entry valid %ds, attributes %ds; want %ds", name, e.EntryValid, e.AttrValid, ttl)
		}
	}
}

// fixedPlane is a ControlPlane whose files render what contents holds,
// counting renderings; viewPlane makes stats per uid and jobs/x uid
// 1001's, mode 0500 (its file 0400).
type fixedPlane struct {
	plane
	contents map[string]string
}

func (p *fixedPlane) List(dir string) ([]PseudoEntry, error) {
	switch dir {
	case "jobs":
		return []PseudoEntry{{Name: "x", Dir: true}}, nil
	case "jobs/x":
		return []PseudoEntry{{Name: "epoch-0"}}, nil
	}
	return p.plane.List(dir)
}

func (p *fixedPlane) Read(path string) ([]byte, error) {
	p.renders++
	return []byte(p.contents[path]), nil
}

// viewPlane is fixedPlane as a ViewControl.
type viewPlane struct{ fixedPlane }

func (p *viewPlane) ReadFor(c *fuse.Caller, path string) ([]byte, error) {
	p.renders++
	if path == "stats" && c.Uid != 0 {
		return fmt.Appendf(nil, "%s for %d", p.contents[path], c.Uid), nil
	}
	return []byte(p.contents[path]), nil
}

func (p *viewPlane) Perm(path string) (PseudoPerm, bool) {
	switch path {
	case "jobs/x":
		return PseudoPerm{Uid: 1001, Gid: 1001, Mode: 0o500}, true
	case "jobs/x/epoch-0":
		return PseudoPerm{Uid: 1001, Gid: 1001, Mode: 0o400}, true
	}
	return PseudoPerm{}, false
}

func lookupAs(t *testing.T, f *FS, parent uint64, name string, uid uint32) fuse.EntryOut {
	t.Helper()
	var out fuse.EntryOut
	h := header(parent)
	h.Caller.Uid, h.Caller.Gid = uid, uid
	if st := f.Lookup(nil, &h, name, &out); !st.Ok() {
		t.Fatalf("lookup %q in %d as %d: %v", name, parent, uid, st)
	}
	return out
}

func readAll(t *testing.T, f *FS, ino uint64) (string, fuse.Status) {
	t.Helper()
	buf := make([]byte, 1<<16)
	res, st := f.Read(nil, &fuse.ReadIn{InHeader: header(ino), Size: uint32(len(buf))}, buf)
	if !st.Ok() {
		return "", st
	}
	got, _ := res.Bytes(buf)
	return string(got), st
}

// TestControlRenderingsShared: 600 lookups of an unchanged plan file hold
// one rendering under one node ID, not 600 copies; new contents get a new
// ID while the old one's holders keep reading theirs; forgetting them all
// frees every byte. Every lookup made a copy of its own before.
func TestControlRenderingsShared(t *testing.T) {
	f, _ := newTree(t, 3)
	plan := strings.Repeat("train/n01440764/img.JPEG\n", 1000)
	p := &fixedPlane{contents: map[string]string{"stats": plan}}
	f.ctl = p
	ctl := lookup(t, f, catalog.RootIno, ".dlfs")
	first := lookup(t, f, ctl.NodeId, "stats")
	for i := 1; i < 600; i++ {
		if again := lookup(t, f, ctl.NodeId, "stats"); again.NodeId != first.NodeId {
			t.Fatalf("lookup %d of unchanged contents: node %d, want %d", i, again.NodeId, first.NodeId)
		}
	}
	if f.pseudo.bytes != int64(len(plan)) || p.renders != 600 {
		t.Errorf("600 lookups hold %d bytes (want %d), %d renderings", f.pseudo.bytes, len(plan), p.renders)
	}
	p.contents["stats"] = "changed\n"
	changed := lookup(t, f, ctl.NodeId, "stats")
	if changed.NodeId == first.NodeId {
		t.Fatal("new contents under the old node ID")
	}
	if got, _ := readAll(t, f, first.NodeId); got[:30] != plan[:30] {
		t.Errorf("the old rendering reads %q", got[:30])
	}
	// The control file is written through the node its writer looks up,
	// which the writer truncates first: never one a reader holds.
	p.contents["control"] = "{}\n"
	w, r := lookup(t, f, ctl.NodeId, "control"), lookup(t, f, ctl.NodeId, "control")
	if w.NodeId == r.NodeId {
		t.Error("two lookups of the writable control file share a node")
	}
	f.Forget(w.NodeId, 1)
	f.Forget(r.NodeId, 1)
	f.Forget(first.NodeId, 600)
	f.Forget(changed.NodeId, 1)
	if f.pseudo.bytes != 0 || len(f.pseudo.renders) != 0 || len(f.pseudo.byIno) != 1 {
		t.Errorf("after every forget: %d bytes, %d renderings, %d nodes", f.pseudo.bytes, len(f.pseudo.renders), len(f.pseudo.byIno))
	}
}

// boundedControl returns a filesystem whose control files render p's
// contents, holding at most limit bytes of renderings, and its control
// directory.
func boundedControl(t *testing.T, limit int64) (*FS, *fixedPlane, fuse.EntryOut) {
	f, _ := newTree(t, 3)
	p := &fixedPlane{contents: map[string]string{}}
	f.ctl = p
	f.pseudo.limit = limit
	return f, p, lookup(t, f, catalog.RootIno, ".dlfs")
}

// TestControlRenderingsBounded: whatever the lookups, reads and forgets,
// the renderings held stay within the limit (or the newest alone), their
// count matches the table, and a rendering whose contents were dropped
// answers ESTALE while the newest reads whole.
func TestControlRenderingsBounded(t *testing.T) {
	f, p, ctl := boundedControl(t, 4096)
	rng := rand.New(rand.NewPCG(3, 4))
	var held []uint64
	stale := 0
	for i := 0; i < 3000; i++ {
		switch op := rng.IntN(10); {
		case op < 5:
			p.contents["stats"] = strings.Repeat("x", rng.IntN(3)*1000+rng.IntN(4)) // some equal, some new, one over the limit
			if rng.IntN(50) == 0 {
				p.contents["stats"] = strings.Repeat("y", 5000)
			}
			e := lookup(t, f, ctl.NodeId, "stats")
			held = append(held, e.NodeId)
			if got, st := readAll(t, f, e.NodeId); !st.Ok() || got != p.contents["stats"] {
				t.Fatalf("the newest rendering reads %d bytes, %v; want %d", len(got), st, len(p.contents["stats"]))
			}
		case op < 8 && len(held) > 0:
			k := rng.IntN(len(held))
			f.Forget(held[k], 1)
			held = append(held[:k], held[k+1:]...)
		case len(held) > 0:
			switch _, st := readAll(t, f, held[rng.IntN(len(held))]); st {
			case fuse.OK:
			case fuse.Status(syscall.ESTALE):
				stale++
			default:
				t.Fatalf("a held rendering reads %v", st)
			}
		}
		var sum, largest int64
		for _, n := range f.pseudo.byIno {
			sum += int64(len(n.data))
			largest = max(largest, int64(len(n.data)))
		}
		if sum != f.pseudo.bytes || f.pseudo.bytes > max(f.pseudo.limit, largest) {
			t.Fatalf("op %d: %d bytes held, table says %d, limit %d", i, sum, f.pseudo.bytes, f.pseudo.limit)
		}
	}
	if stale == 0 {
		t.Error("no rendering was ever dropped: the limit did not bite")
	}
}

// TestControlRenderingsLRU: renderings exactly at the limit are all kept;
// past it, the least recently used go first, where a use is a lookup or a
// read that returns bytes (a read at the end means its reader is done).
func TestControlRenderingsLRU(t *testing.T) {
	f, p, ctl := boundedControl(t, 3000)
	render := func(c byte) uint64 {
		p.contents["stats"] = strings.Repeat(string(c), 1000)
		return lookup(t, f, ctl.NodeId, "stats").NodeId
	}
	held := func() string { // the renderings whose contents are held, by their first byte
		f.mu.Lock()
		defer f.mu.Unlock()
		var s []string
		for _, n := range f.pseudo.byIno {
			if len(n.data) > 0 {
				s = append(s, string(n.data[0]))
			}
		}
		sort.Strings(s)
		return strings.Join(s, "")
	}
	read := func(ino uint64, off uint64) int {
		t.Helper()
		buf := make([]byte, 100)
		res, st := f.Read(nil, &fuse.ReadIn{InHeader: header(ino), Offset: off, Size: 100}, buf)
		if !st.Ok() {
			t.Fatalf("read of node %d at %d: %v", ino, off, st)
		}
		got, _ := res.Bytes(buf)
		return len(got)
	}
	a := render('a')
	b := render('b')
	render('c')
	if got := held(); got != "abc" || f.pseudo.bytes != 3000 {
		t.Fatalf("renderings of exactly the limit: %q held (%d bytes), want all three", got, f.pseudo.bytes)
	}
	if n := read(a, 1000); n != 0 {
		t.Fatalf("a read at the end returned %d bytes", n)
	}
	if n := read(b, 0); n != 100 {
		t.Fatalf("a read of b returned %d bytes, want 100", n)
	}
	render('d')
	if got := held(); got != "bcd" {
		t.Fatalf("past the limit, %q held; want a dropped (its read at the end was no use)", got)
	}
	render('e')
	if got := held(); got != "bde" {
		t.Fatalf("past the limit again, %q held; want c dropped (b was read after its lookup)", got)
	}
	if _, st := readAll(t, f, a); st != fuse.Status(syscall.ESTALE) {
		t.Errorf("a dropped rendering reads %v, want ESTALE", st)
	}
}

// permPlane is viewPlane with owners and modes that change.
type permPlane struct {
	viewPlane
	perms map[string]PseudoPerm
}

func (p *permPlane) Perm(path string) (PseudoPerm, bool) {
	pp, ok := p.perms[path]
	return pp, ok
}

// TestControlRenderingsSharedPerm: a rendering is shared only with
// lookups that give it the same owner and mode; equal contents with
// another owner or mode, or none, get a node of their own.
func TestControlRenderingsSharedPerm(t *testing.T) {
	f, _ := newTree(t, 3)
	p := &permPlane{viewPlane: viewPlane{fixedPlane{contents: map[string]string{"stats": "figures"}}}, perms: map[string]PseudoPerm{}}
	f.ctl = p
	ctl := lookup(t, f, catalog.RootIno, ".dlfs")
	var last fuse.EntryOut
	for i, c := range []struct {
		perm   *PseudoPerm
		shared bool // with the lookup before
	}{
		{nil, false},
		{nil, true},
		{&PseudoPerm{Uid: 1001, Gid: 1001, Mode: 0o440}, false},
		{&PseudoPerm{Uid: 1001, Gid: 1001, Mode: 0o440}, true},
		{&PseudoPerm{Uid: 1001, Gid: 1001, Mode: 0o400}, false},
		{&PseudoPerm{Uid: 1002, Gid: 1001, Mode: 0o400}, false},
		{nil, false},
	} {
		want := PseudoPerm{Uid: f.cfg.Owner.Uid, Gid: f.cfg.Owner.Gid, Mode: 0o444}
		delete(p.perms, "stats")
		if c.perm != nil {
			p.perms["stats"], want = *c.perm, *c.perm
		}
		e := lookupAs(t, f, ctl.NodeId, "stats", 0)
		if i > 0 && (e.NodeId == last.NodeId) != c.shared {
			t.Errorf("lookup %d (owner and mode %+v): node %d, the one before %d; shared %v, want %v", i, c.perm, e.NodeId, last.NodeId, !c.shared, c.shared)
		}
		if got := (PseudoPerm{Uid: e.Attr.Uid, Gid: e.Attr.Gid, Mode: e.Attr.Mode &^ syscall.S_IFMT}); got != want {
			t.Errorf("lookup %d: owner and mode %+v, want %+v", i, got, want)
		}
		last = e
	}
}

// TestControlAttrTimeouts: a control entry's attributes are cached by the
// kernel unless they can change: those of a directory whose owner and
// mode the control plane gives (a job's), which it asks for every time.
func TestControlAttrTimeouts(t *testing.T) {
	f, _ := newTree(t, 3)
	f.ctl = &viewPlane{fixedPlane{contents: map[string]string{"stats": "figures", "jobs/x/epoch-0": "a.jpg\n"}}}
	ttl := uint64(f.cfg.TTL / time.Second)
	ctl := lookup(t, f, catalog.RootIno, ".dlfs")
	jobs := lookup(t, f, ctl.NodeId, "jobs")
	x := lookup(t, f, jobs.NodeId, "x")
	for _, c := range []struct {
		name  string
		entry fuse.EntryOut
		ttl   uint64
	}{
		{".dlfs", ctl, ttl},
		{"jobs", jobs, ttl},
		{"jobs/x (a job's)", x, 0},
		{"jobs/x/epoch-0 (a job's file)", lookup(t, f, x.NodeId, "epoch-0"), ttl},
		{"stats", lookup(t, f, ctl.NodeId, "stats"), ttl},
	} {
		if c.entry.AttrValid != c.ttl || c.entry.AttrValidNsec != 0 {
			t.Errorf("lookup of %s: attributes valid %ds, want %ds", c.name, c.entry.AttrValid, c.ttl)
		}
		var attr fuse.AttrOut
		if st := f.GetAttr(nil, &fuse.GetAttrIn{InHeader: header(c.entry.NodeId)}, &attr); !st.Ok() || attr.AttrValid != c.ttl || attr.AttrValidNsec != 0 {
			t.Errorf("getattr of %s: %v, attributes valid %ds, want %ds", c.name, st, attr.AttrValid, c.ttl)
		}
	}
}

// TestControlViews: a ViewControl's files are rendered for the user who
// looks them up, and users whose views differ get different node IDs;
// entries take the owner and mode it gives.
func TestControlViews(t *testing.T) {
	f, _ := newTree(t, 3)
	p := &viewPlane{fixedPlane{contents: map[string]string{"stats": "figures", "jobs/x/epoch-0": "a.jpg\n"}}}
	f.ctl = p
	ctl := lookup(t, f, catalog.RootIno, ".dlfs")
	a := lookupAs(t, f, ctl.NodeId, "stats", 1001)
	b := lookupAs(t, f, ctl.NodeId, "stats", 1002)
	r := lookupAs(t, f, ctl.NodeId, "stats", 0)
	if a.NodeId == b.NodeId || a.NodeId == r.NodeId {
		t.Fatalf("different views share a node: %d %d %d", a.NodeId, b.NodeId, r.NodeId)
	}
	for _, c := range []struct {
		ino  uint64
		want string
	}{{a.NodeId, "figures for 1001"}, {b.NodeId, "figures for 1002"}, {r.NodeId, "figures"}} {
		if got, _ := readAll(t, f, c.ino); got != c.want {
			t.Errorf("node %d reads %q, want %q", c.ino, got, c.want)
		}
	}
	jobs := lookupAs(t, f, ctl.NodeId, "jobs", 1002)
	x := lookupAs(t, f, jobs.NodeId, "x", 1001)
	if x.Attr.Uid != 1001 || x.Attr.Mode != syscall.S_IFDIR|0o500 {
		t.Errorf("jobs/x: uid %d mode %o", x.Attr.Uid, x.Attr.Mode)
	}
	e := lookupAs(t, f, x.NodeId, "epoch-0", 1001)
	if e.Attr.Uid != 1001 || e.Attr.Mode != syscall.S_IFREG|0o400 {
		t.Errorf("jobs/x/epoch-0: uid %d mode %o", e.Attr.Uid, e.Attr.Mode)
	}
	var attr fuse.AttrOut
	if st := f.GetAttr(nil, &fuse.GetAttrIn{InHeader: header(x.NodeId)}, &attr); !st.Ok() || attr.Attr.Uid != 1001 || attr.Attr.Mode&0o777 != 0o500 {
		t.Errorf("getattr of jobs/x: %v uid %d mode %o", st, attr.Attr.Uid, attr.Attr.Mode)
	}
}

// A listing under way when a refresh changes a file answers the file's new
// attributes, not the ones of the snapshot the directory was opened on: a
// file that grew must not read back cut short.
func TestReadDirPlusAfterRefresh(t *testing.T) {
	f, _ := newTree(t, 6)
	f.cfg.ListingAttrs = true
	cat := f.data.(tree).cat
	dir := lookup(t, f, catalog.RootIno, "class_1")
	var open fuse.OpenOut
	if st := f.OpenDir(nil, &fuse.OpenIn{InHeader: header(dir.NodeId)}, &open); !st.Ok() {
		t.Fatal(st)
	}
	defer f.ReleaseDir(&fuse.ReleaseIn{Fh: open.Fh})
	grown := filepath.Join(cat.Source(), "class_1", "img_0004.jpg")
	if err := os.WriteFile(grown, []byte(strings.Repeat("y", 1000)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(cat.Source(), "class_1", "img_0001.jpg")); err != nil {
		t.Fatal(err)
	}
	if _, err := cat.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	out := fuse.NewDirEntryList(make([]byte, 1<<16), 0)
	if st := f.ReadDirPlus(nil, &fuse.ReadIn{InHeader: header(dir.NodeId), Fh: open.Fh}, out); !st.Ok() {
		t.Fatal(st)
	}
	seen := 0
	for _, d := range parseDirents(t, out.Bytes(), true) {
		switch d.name {
		case "img_0004.jpg":
			seen++
			if d.entry.Size != 1000 {
				t.Errorf("%s: size %d in a listing after a refresh, want 1000", d.name, d.entry.Size)
			}
		case "img_0001.jpg":
			seen++
			if d.entry.NodeId != 0 {
				t.Errorf("%s, removed by the refresh, listed with attributes: %+v", d.name, d.entry)
			}
		}
	}
	if seen != 2 {
		t.Fatalf("the listing opened before the refresh has %d of the two entries", seen)
	}
}

// TestInvalidateMounted: after a refresh's Invalidate, the kernel shows
// the new tree although it had cached the old one: listings (the root's
// too, which a refresh never reports changed) and names, of files added
// and removed. A diff naming the root itself is taken too.
func TestInvalidateMounted(t *testing.T) {
	f, data, mnt := mountTree(t, 100, 200)
	names := func(dir string) string {
		t.Helper()
		ents, err := os.ReadDir(filepath.Join(mnt, dir))
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, e := range ents {
			s = append(s, e.Name())
		}
		return strings.Join(s, ",")
	}
	if root, c := names(""), names("c"); root != "c" || c != "a.jpg,b.jpg" {
		t.Fatalf("before the refresh: root %q, c %q", root, c)
	}
	if _, err := os.Stat(filepath.Join(mnt, "c", "b.jpg")); err != nil {
		t.Fatal(err)
	}
	src := data.Source()
	for _, p := range []string{"top.jpg", "c/new.jpg"} {
		if err := os.WriteFile(filepath.Join(src, p), []byte("new"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(src, "c", "b.jpg")); err != nil {
		t.Fatal(err)
	}
	d, err := data.cat.Refresh(context.Background())
	if err != nil || len(d.Added) != 2 || len(d.Removed) != 1 {
		t.Fatalf("refresh: %+v, %v", d, err)
	}
	f.Invalidate(d)
	if root, c := names(""), names("c"); root != "c,top.jpg" || c != "a.jpg,new.jpg" {
		t.Errorf("after the refresh: root %q, c %q; want c,top.jpg and a.jpg,new.jpg", root, c)
	}
	if _, err := os.Stat(filepath.Join(mnt, "c", "b.jpg")); !os.IsNotExist(err) {
		t.Errorf("stat of a file the refresh removed: %v, want ENOENT", err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "c", "new.jpg")); err != nil {
		t.Errorf("stat of a file the refresh added: %v", err)
	}
	f.Invalidate(catalog.Diff{Changed: []*catalog.Entry{data.Snapshot().Root}})
	if root := names(""); root != "c,top.jpg" {
		t.Errorf("after invalidating the root: %q", root)
	}
}

// TestAccessLogPaths: the access log names a request's node by its path
// in the current snapshot, and a lookup's name within it; a node a refresh
// removed (or a forgotten control node) is "?", not the root, and a lookup
// within it is not a name at the root.
func TestAccessLogPaths(t *testing.T) {
	f, _ := newTree(t, 3)
	cat := f.data.(tree).cat
	snap := cat.Snapshot()
	dir, file, gone := snap.Lookup("class_0"), snap.Lookup("class_0/img_0000.jpg"), snap.Lookup("class_1")
	ctl := lookup(t, f, catalog.RootIno, ".dlfs")
	stats := lookup(t, f, ctl.NodeId, "stats")
	if err := os.RemoveAll(filepath.Join(cat.Source(), "class_1")); err != nil {
		t.Fatal(err)
	}
	if d, err := cat.Refresh(context.Background()); err != nil || len(d.Removed) != 1 {
		t.Fatalf("refresh: %+v, %v", d, err)
	}
	f.Forget(stats.NodeId, 1)
	for _, c := range []struct {
		ino  uint64
		name string
		want string
	}{
		{catalog.RootIno, "", ""},
		{catalog.RootIno, "class_0", "class_0"},
		{dir.Ino, "", "class_0"},
		{dir.Ino, "img_0000.jpg", "class_0/img_0000.jpg"},
		{file.Ino, "", "class_0/img_0000.jpg"},
		{ctl.NodeId, "", ".dlfs"},
		{ctl.NodeId, "stats", ".dlfs/stats"},
		{gone.Ino, "", "?"},
		{gone.Ino, "img_0001.jpg", "?/img_0001.jpg"},
		{stats.NodeId, "", "?"},
	} {
		if got := f.pathOf(c.ino, c.name); got != c.want {
			t.Errorf("path of node %d, name %q: %q, want %q", c.ino, c.name, got, c.want)
		}
	}
}

// TestControlStableIno: every rendering of a control file has its path's
// inode number, so stat twice agrees and cp, which compares the inode it
// stat'ed with the one it opened, copies stats.
func TestControlStableIno(t *testing.T) {
	_, _, mnt := mountTree(t, 10)
	ino := func(p string) uint64 {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(mnt, p), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	for _, p := range []string{".dlfs", ".dlfs/stats", ".dlfs/control"} {
		if a, b := ino(p), ino(p); a != b {
			t.Errorf("stat %s twice: inode %d, then %d", p, a, b)
		}
	}
	if ino(".dlfs/stats") == ino(".dlfs/control") {
		t.Errorf("stats and control share inode %d", ino(".dlfs/stats"))
	}
	dst := filepath.Join(t.TempDir(), "stats")
	if out, err := exec.Command("cp", filepath.Join(mnt, ".dlfs/stats"), dst).CombinedOutput(); err != nil {
		t.Fatalf("cp .dlfs/stats: %v: %s", err, out)
	}
	if b, err := os.ReadFile(dst); err != nil || !strings.HasPrefix(string(b), "stats ") {
		t.Errorf("the copy holds %q (%v)", b, err)
	}
}
