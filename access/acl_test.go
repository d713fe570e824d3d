package access

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/catalog"
)

// TestACLsAsTheKernel: on files and directories of random modes and random
// POSIX ACLs (named users and groups, masks), owned by uid 1000 and group
// 3000, each of several users — the owner, named users, members of the
// owning group and of named groups, by primary or supplementary gid, and
// strangers — is allowed read, search or both by Allows exactly when the
// kernel allows it on SOURCE (faccessat as that user); what Everyone is
// allowed, every one of them is.
func TestACLsAsTheKernel(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to act as other users and give files other owners")
	}
	src := t.TempDir()
	if err := os.Chmod(src, 0o755); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(39, 9))
	var names []string
	withACL := 0
	for i := range 400 {
		name := fmt.Sprintf("f%03d", i)
		p := filepath.Join(src, name)
		var err error
		if i%4 == 0 {
			name = fmt.Sprintf("d%03d", i)
			p = filepath.Join(src, name)
			err = os.Mkdir(p, 0o700)
		} else {
			err = os.WriteFile(p, nil, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, 1000, 3000); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, os.FileMode(rng.IntN(0o1000))); err != nil {
			t.Fatal(err)
		}
		if rng.IntN(4) != 0 {
			if err := unix.Setxattr(p, catalog.XattrACL, randomACL(rng), 0); err != nil {
				if err == unix.EOPNOTSUPP {
					t.Skipf("the filesystem of %s keeps no ACLs", src)
				}
				t.Fatalf("set an ACL on %s: %v", p, err)
			}
		}
		names = append(names, name)
	}
	cat, err := catalog.Open(context.Background(), catalog.DefaultConfig(src))
	if err != nil {
		t.Fatal(err)
	}
	snap := cat.Snapshot()
	for _, n := range names {
		if snap.Lookup(n).ACL() != nil {
			withACL++
		}
	}
	if withACL < 200 {
		t.Fatalf("%d of %d entries kept an ACL, want most", withACL, len(names))
	}
	creds := []Cred{
		{Uid: 1000, Gid: 1000},                         // the owner
		{Uid: 2000, Gid: 2000},                         // a named user, maybe
		{Uid: 2001, Gid: 3000},                         // a named user, maybe, in the owning group
		{Uid: 2002, Gid: 2002, Groups: []uint32{3000}}, // the owning group's, supplementary
		{Uid: 2003, Gid: 3001},                         // a named group's, maybe
		{Uid: 2004, Gid: 2004, Groups: []uint32{3001, 3002}},
		{Uid: 2005, Gid: 3000, Groups: []uint32{3002}},
		{Uid: 2006, Gid: 2006}, // a stranger
	}
	wants := []uint32{Read, Exec, Read | Exec}
	dir, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	for _, c := range creds {
		kernel := kernelVerdicts(t, int(dir.Fd()), c, names, wants)
		for i, n := range names {
			e := snap.Lookup(n)
			for j, w := range wants {
				if got := c.Allows(e, w); got != kernel[i][j] {
					t.Errorf("uid %d gid %d groups %v, want %o of %s (mode %o, ACL %v): Allows says %v, the kernel %v",
						c.Uid, c.Gid, c.Groups, w, n, e.Mode&0o777, aclOf(e), got, kernel[i][j])
				}
				if Everyone.Allows(e, w) && !kernel[i][j] {
					t.Errorf("Everyone may %o %s (mode %o, ACL %v), uid %d may not", w, n, e.Mode&0o777, aclOf(e), c.Uid)
				}
			}
		}
	}
}

func aclOf(e *catalog.Entry) []catalog.ACLEntry {
	if a := e.ACL(); a != nil {
		return a.Entries()
	}
	return nil
}

// randomACL is a valid access ACL: random permissions, maybe named users
// 2000 and 2001, named groups 3001 and 3002, a mask.
func randomACL(rng *rand.Rand) []byte {
	perm := func() uint16 { return uint16(rng.IntN(8)) }
	es := [][3]uint32{{catalog.ACLUserObj, uint32(perm()), 1<<32 - 1}}
	named := false
	for _, u := range []uint32{2000, 2001} {
		if rng.IntN(2) == 0 {
			es, named = append(es, [3]uint32{catalog.ACLUser, uint32(perm()), u}), true
		}
	}
	es = append(es, [3]uint32{catalog.ACLGroupObj, uint32(perm()), 1<<32 - 1})
	for _, g := range []uint32{3001, 3002} {
		if rng.IntN(2) == 0 {
			es, named = append(es, [3]uint32{catalog.ACLGroup, uint32(perm()), g}), true
		}
	}
	if named || rng.IntN(2) == 0 {
		es = append(es, [3]uint32{catalog.ACLMask, uint32(perm()), 1<<32 - 1})
	}
	es = append(es, [3]uint32{catalog.ACLOther, uint32(perm()), 1<<32 - 1})
	b := binary.LittleEndian.AppendUint32(nil, 2)
	for _, x := range es {
		b = binary.LittleEndian.AppendUint16(b, uint16(x[0]))
		b = binary.LittleEndian.AppendUint16(b, uint16(x[1]))
		b = binary.LittleEndian.AppendUint32(b, x[2])
	}
	return b
}

// kernelVerdicts asks the kernel whether c may access each of names in
// the directory open as dirfd with each of wants: faccessat with
// AT_EACCESS on a thread whose filesystem ids and groups are c's (which
// drops root's override of permissions). The thread ends with the
// goroutine: it is never given back to the runtime.
func kernelVerdicts(t *testing.T, dirfd int, c Cred, names []string, wants []uint32) [][]bool {
	t.Helper()
	out := make([][]bool, len(names))
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with its changed ids
		groups := append([]uint32{c.Gid}, c.Groups...)
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(unsafe.Pointer(&groups[0])), 0); e != 0 {
			errc <- fmt.Errorf("setgroups: %v", e)
			return
		}
		unix.Setfsgid(int(c.Gid))
		unix.Setfsuid(int(c.Uid))
		if fsuid, _ := unix.SetfsuidRetUid(-1); fsuid != int(c.Uid) {
			errc <- fmt.Errorf("setfsuid %d: still %d", c.Uid, fsuid)
			return
		}
		for i, n := range names {
			out[i] = make([]bool, len(wants))
			for j, w := range wants {
				var mode uint32
				if w&Read != 0 {
					mode |= unix.R_OK
				}
				if w&Exec != 0 {
					mode |= unix.X_OK
				}
				err := unix.Faccessat2(dirfd, n, mode, unix.AT_EACCESS|unix.AT_SYMLINK_NOFOLLOW)
				if err != nil && err != unix.EACCES {
					errc <- fmt.Errorf("faccessat %s: %v", n, err)
					return
				}
				out[i][j] = err == nil
			}
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Fatalf("as uid %d: %v", c.Uid, err)
	}
	return out
}
