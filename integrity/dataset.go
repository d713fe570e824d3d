package integrity

import (
	"container/heap"
	"fmt"
	"os"
	"slices"
	"strings"
	"unicode"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/source"
)

// IdentityFiles is how many of a dataset's files its identity is drawn
// from: the oldest ones.
const IdentityFiles = 32

// HeadBytes is how much of the start of each of those files the identity
// hashes.
const HeadBytes = 4096

// MaxDatasetID bounds an operator's dataset id, in bytes.
const MaxDatasetID = 256

// File is what Identifier needs of a file of the catalog.
type File interface {
	Path() string
	Version() source.Version
}

// Identifier draws a dataset's identity from its files (see the package
// doc). Add every regular file in the catalog's order, which is the same
// on every host; Dataset then hashes the IdentityFiles oldest, by ctime,
// then mtime, then size, the first added winning a tie. Memory is
// IdentityFiles files, whatever the dataset's size.
type Identifier struct {
	oldest youngestFirst
	added  int
}

type idFile struct {
	f   File
	v   source.Version
	seq int
}

// older reports whether a is older than b: by ctime first, which the
// filesystem sets and no writer can set back (an mtime is whatever
// `touch -d`, `cp -p`, `rsync -a` or `tar x` says, and one file dated
// 2001 would otherwise enter every later mount's identity and split the
// cluster), then mtime, size and the order added.
func older(a, b idFile) bool {
	switch {
	case a.v.Ctime != b.v.Ctime:
		return a.v.Ctime < b.v.Ctime
	case a.v.Mtime != b.v.Mtime:
		return a.v.Mtime < b.v.Mtime
	case a.v.Size != b.v.Size:
		return a.v.Size < b.v.Size
	}
	return a.seq < b.seq
}

// youngestFirst is a heap whose top is the youngest file kept.
type youngestFirst []idFile

func (h youngestFirst) Len() int           { return len(h) }
func (h youngestFirst) Less(i, j int) bool { return older(h[j], h[i]) }
func (h youngestFirst) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *youngestFirst) Push(x any)        { *h = append(*h, x.(idFile)) }
func (h *youngestFirst) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Add offers one regular file.
func (id *Identifier) Add(f File) {
	c := idFile{f: f, v: f.Version(), seq: id.added}
	id.added++
	switch {
	case len(id.oldest) < IdentityFiles:
		heap.Push(&id.oldest, c)
	case older(c, id.oldest[0]):
		id.oldest[0] = c
		heap.Fix(&id.oldest, 0)
	}
}

// Oldest returns the files the identity is drawn from, in no order.
func (id *Identifier) Oldest() []File {
	out := make([]File, len(id.oldest))
	for i, c := range id.oldest {
		out[i] = c.f
	}
	return out
}

// Dataset returns the identity of the dataset shown as format: from
// operatorID if it is not empty (see ValidDatasetID), else from the files
// added and their heads: heads[f] is HeadSum of file f's first HeadBytes
// (fewer for a shorter file); a file missing from heads, which could not
// be read, counts as unread.
func (id *Identifier) Dataset(format, operatorID string, heads map[File]uint64) Dataset {
	h := newHash()
	if operatorID != "" {
		h.str("dlfs dataset id")
		h.str(format)
		h.str(operatorID)
		return Dataset(h.sum)
	}
	type file struct {
		path string
		v    source.Version
		head uint64
		read bool
	}
	files := make([]file, len(id.oldest))
	for i, c := range id.oldest {
		head, read := heads[c.f]
		files[i] = file{c.f.Path(), c.v, head, read}
	}
	slices.SortFunc(files, func(a, b file) int { return strings.Compare(a.path, b.path) })
	h.str("dlfs dataset files")
	h.str(format)
	h.u64(uint64(len(files)))
	for _, f := range files {
		h.str(f.path)
		h.u64(uint64(f.v.Size))
		h.u64(uint64(f.v.Mtime))
		h.u64(uint64(f.v.Ctime))
		read := uint64(0)
		if f.read {
			read = 1
		}
		h.u64(read)
		h.u64(f.head)
	}
	return Dataset(h.sum)
}

// HeadSum is the digest of a file's head that Dataset takes: FNV-1a 64
// of its first HeadBytes.
func HeadSum(head []byte) uint64 {
	h := newHash()
	h.str(string(head[:min(len(head), HeadBytes)]))
	return h.sum
}

// ValidDatasetID checks an operator's dataset id: 1 to MaxDatasetID bytes
// of printable characters without spaces, such as "imagenet-2012-v3".
func ValidDatasetID(s string) error {
	if len(s) == 0 || len(s) > MaxDatasetID {
		return fmt.Errorf("dataset id %q: want 1 to %d bytes", s, MaxDatasetID)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return fmt.Errorf("dataset id %q: want printable characters without spaces", s)
		}
	}
	return nil
}

// MountOf identifies the directory dir shown as format as this host
// mounts it: statfs's f_fsid (st_dev where the filesystem reports none,
// as FUSE and NFS do), the type and source of the mount holding it (as
// /proc/self/mountinfo names them: a FUSE client's device number may come
// back for another filesystem after a remount, its source and type do
// not), the directory's inode number and birth time where the filesystem
// keeps one (a directory made anew at the same path, even with the same
// inode number), the format and the path. Hosts do not agree on it, and a
// remount may change it. It is the first filter of what this host kept:
// entries of a saved catalog are still checked one by one (package
// catalog).
func MountOf(dir, format string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "", fmt.Errorf("integrity: stat %s: %w", dir, err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return "", fmt.Errorf("integrity: statfs %s: %w", dir, err)
	}
	var born int64
	var stx unix.Statx_t
	if unix.Statx(unix.AT_FDCWD, dir, 0, unix.STATX_BTIME, &stx) == nil && stx.Mask&unix.STATX_BTIME != 0 {
		born = stx.Btime.Sec*1e9 + int64(stx.Btime.Nsec)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo") // none: the rest still binds
	fstype, source := mountOfDev(mounts, st.Dev)
	return fmt.Sprintf("%016x:%d %s %s born=%d mount=%q:%q", fsidOf(fs, st.Dev), st.Ino, format, dir, born, fstype, source), nil
}

// fsidOf is statfs's f_fsid, or dev where the filesystem reports none.
func fsidOf(fs unix.Statfs_t, dev uint64) uint64 {
	if fsid := uint64(uint32(fs.Fsid.Val[0]))<<32 | uint64(uint32(fs.Fsid.Val[1])); fsid != 0 {
		return fsid
	}
	return dev
}

// mountOfDev returns the type and source of the mount of device dev in
// mountinfo (b), or "" for both.
func mountOfDev(b []byte, dev uint64) (fstype, source string) {
	want := fmt.Sprintf("%d:%d", unix.Major(dev), unix.Minor(dev))
	for _, line := range strings.Split(string(b), "\n") {
		// ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPEROPTIONS
		pre, post, found := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if found && len(f) >= 3 && len(g) >= 2 && f[2] == want {
			return g[0], g[1]
		}
	}
	return "", ""
}
