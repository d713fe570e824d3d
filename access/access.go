// Package access says what a user may do with the entries of a catalog,
// as the kernel decides it for a mount with default_permissions, and who
// a reading process is.
//
// # Users
//
// A Cred is a user and its groups: the uid and gid a FUSE request carries,
// and the supplementary groups of its process (the "Groups:" line of
// /proc/PID/status). Root may read and list everything; anyone else gets
// what the kernel's generic_permission gives: the owner the owner's bits
// of the entry's mode; others, where the entry has a POSIX ACL (SOURCE's,
// which the mount shows and the kernel enforces) and its group bits are
// not all clear, what the ACL grants them (posix_acl_permission: a named
// user's entry, else the owning and named groups', each under the mask,
// else the others' entry); without one, the group's or the others' bits.
//
// # Processes
//
// A pid alone does not name a process: pids are reused. A Proc is a pid
// and its start time (field 22 of /proc/PID/stat, in clock ticks since
// boot), which no two processes that held one pid share.
package access

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"

	"github.com/dlfs/dlfs/catalog"
)

// Cred is a user with its groups. The zero value is root.
type Cred struct {
	Uid, Gid uint32
	Groups   []uint32 // supplementary groups

	every bool // Everyone: allowed only what every user is
}

// Root is uid 0, who may read everything.
var Root = Cred{}

// IsRoot reports whether c is uid 0.
func (c Cred) IsRoot() bool { return c.Uid == 0 }

// inGroup reports whether c belongs to gid.
func (c Cred) inGroup(gid uint32) bool {
	return c.Gid == gid || slices.Contains(c.Groups, gid)
}

// Permission bits, as in a mode's "other" triplet.
const (
	Read  = 4
	Exec  = 1
	Write = 2
)

// Allows reports whether c may access e with want (Read, Exec or both),
// as the kernel's acl_permission_check decides it.
func (c Cred) Allows(e *catalog.Entry, want uint32) bool {
	mode := e.Mode & 0o777
	switch {
	case c.every:
		return everyone(e, want)
	case c.IsRoot():
		// Root reads and searches everything; executes a file only if
		// someone may.
		return want&Exec == 0 || e.IsDir() || mode&0o111 != 0
	case c.Uid == e.Uid():
		return mode>>6&want == want // the owner's bits, whatever an ACL says
	}
	if a := e.ACL(); a != nil && mode&0o070 != 0 {
		return c.aclAllows(e, a.Entries(), want)
	}
	bits := mode
	if c.inGroup(e.Gid()) {
		bits = mode >> 3
	}
	return bits&want == want
}

// aclAllows reports whether the ACL es of e grants c, who does not own e,
// want: the kernel's posix_acl_permission. A named user's entry decides
// for that user; else each group entry (the owning group's, then named
// ones) that c is in and that grants want does; if c is in a group but
// none grants want, c is denied; else the others' entry decides. A named
// user's or a group's entry grants only what the mask does too.
func (c Cred) aclAllows(e *catalog.Entry, es []catalog.ACLEntry, want uint32) bool {
	inGroup := false
	for i, x := range es {
		switch x.Tag {
		case catalog.ACLUser:
			if x.ID == c.Uid {
				return masked(es, i, want)
			}
		case catalog.ACLGroupObj, catalog.ACLGroup:
			gid := x.ID
			if x.Tag == catalog.ACLGroupObj {
				gid = e.Gid()
			}
			if c.inGroup(gid) {
				inGroup = true
				if uint32(x.Perm)&want == want {
					return masked(es, i, want)
				}
			}
		case catalog.ACLOther:
			return !inGroup && uint32(x.Perm)&want == want
		}
	}
	return false // no others' entry: a valid ACL has one
}

// masked reports whether entry i of es, which matched, grants want under
// the mask that follows it, if any.
func masked(es []catalog.ACLEntry, i int, want uint32) bool {
	perm := uint32(es[i].Perm)
	for _, x := range es[i+1:] {
		if x.Tag == catalog.ACLMask {
			perm &= uint32(x.Perm)
			break
		}
	}
	return perm&want == want
}

// everyone reports whether every user but root may access e with want:
// the owner's, the group's and the others' bits of its mode allow it,
// and so does every entry of its ACL, if any (under the mask).
func everyone(e *catalog.Entry, want uint32) bool {
	mode := e.Mode & 0o777
	if mode>>6&want != want || mode>>3&want != want || mode&want != want {
		return false
	}
	a := e.ACL()
	if a == nil {
		return true
	}
	es := a.Entries()
	for i, x := range es {
		switch x.Tag {
		case catalog.ACLUser, catalog.ACLGroupObj, catalog.ACLGroup:
			if !masked(es, i, want) {
				return false
			}
		case catalog.ACLOther:
			if uint32(x.Perm)&want != want {
				return false
			}
		}
	}
	return true
}

// CanReach reports whether c may reach e by its path: search (x) on every
// directory above it.
func (c Cred) CanReach(e *catalog.Entry) bool {
	for d := e.Parent(); d != nil; d = d.Parent() {
		if !c.Allows(d, Exec) {
			return false
		}
	}
	return true
}

// CanRead reports whether c may open e for reading by its path.
func (c Cred) CanRead(e *catalog.Entry) bool {
	return c.Allows(e, Read) && c.CanReach(e)
}

// CanList reports whether c may list directory e by its path.
func (c Cred) CanList(e *catalog.Entry) bool {
	return e.IsDir() && c.Allows(e, Read|Exec) && c.CanReach(e)
}

// Everyone stands for every user but root: it may do only what the owner,
// the group, the others and every entry of an ACL may (for a file of mode
// 0604, the group may not read: nor may Everyone).
var Everyone = Cred{Uid: 1<<32 - 2, Gid: 1<<32 - 2, every: true}

// Proc is one process: its pid and its start time.
type Proc struct {
	Pid   int
	Start uint64 // clock ticks after boot (/proc/PID/stat field 22)
}

// ErrGone means a process no longer exists (or never did).
var ErrGone = errors.New("access: no such process")

// StartTime reads pid's start time under procRoot (normally "/proc").
func StartTime(procRoot string, pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return 0, fmt.Errorf("%w: pid %d", ErrGone, pid)
		}
		return 0, err
	}
	return ParseStartTime(b)
}

// ParseStartTime returns field 22 of a /proc/PID/stat line. The command
// name (field 2) is in parentheses and may hold spaces and parentheses:
// fields are counted after its last ")".
func ParseStartTime(stat []byte) (uint64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("access: /proc stat without a command name: %q", head(stat))
	}
	fields := bytes.Fields(stat[i+1:])
	// After the name come field 3 (state) on: field 22 is the 20th.
	if len(fields) < 20 {
		return 0, fmt.Errorf("access: /proc stat with %d fields after the name, want 20 or more", len(fields))
	}
	start, err := strconv.ParseUint(string(fields[19]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("access: /proc stat start time %q: %w", fields[19], err)
	}
	return start, nil
}

// Alive reports whether p still runs: its pid exists and started when p
// did.
func Alive(procRoot string, p Proc) bool {
	start, err := StartTime(procRoot, p.Pid)
	return err == nil && start == p.Start
}

// ParseCred reads the filesystem uid and gid (the fourth of the "Uid:"
// and "Gid:" lines: what the kernel checks accesses with, and what FUSE
// sends) and the supplementary groups of a /proc/PID/status.
func ParseCred(status []byte) (Cred, error) {
	var c Cred
	var haveUid, haveGid bool
	for _, line := range bytes.Split(status, []byte("\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		switch string(k) {
		case "Uid", "Gid":
			f := bytes.Fields(v)
			if len(f) != 4 {
				return Cred{}, fmt.Errorf("access: /proc status %s line %q: want 4 ids", k, head(v))
			}
			id, err := strconv.ParseUint(string(f[3]), 10, 32)
			if err != nil {
				return Cred{}, fmt.Errorf("access: /proc status %s %q: %w", k, f[3], err)
			}
			if k[0] == 'U' {
				c.Uid, haveUid = uint32(id), true
			} else {
				c.Gid, haveGid = uint32(id), true
			}
		case "Groups":
			for _, g := range bytes.Fields(v) {
				id, err := strconv.ParseUint(string(g), 10, 32)
				if err != nil {
					return Cred{}, fmt.Errorf("access: /proc status group %q: %w", g, err)
				}
				if len(c.Groups) < maxGroups {
					c.Groups = append(c.Groups, uint32(id))
				}
			}
		}
	}
	if !haveUid || !haveGid {
		return Cred{}, fmt.Errorf("access: /proc status without Uid or Gid")
	}
	return c, nil
}

// maxGroups bounds the supplementary groups kept (Linux allows 65,536).
const maxGroups = 1024

// CredOf reads pid's credentials under procRoot.
func CredOf(procRoot string, pid int) (Cred, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "status"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return Cred{}, fmt.Errorf("%w: pid %d", ErrGone, pid)
		}
		return Cred{}, err
	}
	return ParseCred(b)
}

func head(b []byte) []byte { return b[:min(len(b), 64)] }
