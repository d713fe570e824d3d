// Package mountproc runs mount daemons (dlfs, pfssim) as child processes
// for tests and benchmarks: it starts one, waits for its "mounted" line,
// and stops it with SIGTERM, checking it exits cleanly and leaves no mount.
package mountproc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dlfs/dlfs/test/pfssim"
)

// Proc is a running mount daemon.
type Proc struct {
	Cmd    *exec.Cmd
	Mnt    string
	Stderr *SyncBuffer
	Exited chan struct{} // closed when the process has exited
	Err    error         // the exit status; valid once Exited is closed
	// MountInfo is the mountinfo file of the mount namespace the
	// daemon mounts in ("": this process's).
	MountInfo string
}

// SyncBuffer is a bytes.Buffer safe for concurrent writes and reads.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Start runs binary with args and waits up to timeout for a stdout line
// containing "mounted".
func Start(binary, mnt string, timeout time.Duration, args ...string) (*Proc, error) {
	return StartCmd(exec.Command(binary, args...), mnt, "", timeout)
}

// StartCmd is Start for a command made by the caller, such as one that
// runs in another mount namespace, whose mountinfo file is mountInfo.
func StartCmd(cmd *exec.Cmd, mnt, mountInfo string, timeout time.Duration) (*Proc, error) {
	binary, args := cmd.Path, cmd.Args[1:]
	p := &Proc{Cmd: cmd, Mnt: mnt, Stderr: &SyncBuffer{}, Exited: make(chan struct{}), MountInfo: mountInfo}
	p.Cmd.Stderr = p.Stderr
	stdout, err := p.Cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.Cmd.Start(); err != nil {
		return nil, err
	}
	mounted := make(chan struct{}, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "mounted") {
				mounted <- struct{}{}
			}
		}
	}()
	go func() {
		p.Err = p.Cmd.Wait()
		close(p.Exited)
	}()
	select {
	case <-mounted:
		return p, nil
	case <-p.Exited:
		return nil, fmt.Errorf("%s %v exited before mounting: %v\n%s", filepath.Base(binary), args, p.Err, p.Stderr)
	case <-time.After(timeout):
		p.Cmd.Process.Kill()
		return nil, fmt.Errorf("%s did not mount within %v\n%s", filepath.Base(binary), timeout, p.Stderr)
	}
}

// Stop sends SIGTERM and waits for a clean exit and the mount to be gone.
// It is a no-op once the process has exited.
func (p *Proc) Stop(timeout time.Duration) error {
	select {
	case <-p.Exited:
		return nil
	default:
	}
	p.Cmd.Process.Signal(syscall.SIGTERM)
	var err error
	select {
	case <-p.Exited:
		if p.Err != nil {
			err = fmt.Errorf("%s exited with %v\n%s", p.Cmd.Path, p.Err, p.Stderr)
		}
	case <-time.After(timeout):
		p.Cmd.Process.Kill()
		err = fmt.Errorf("%s did not exit within %v of SIGTERM\n%s", p.Cmd.Path, timeout, p.Stderr)
	}
	if MountedIn(p.MountInfo, p.Mnt) {
		if p.MountInfo == "" {
			syscall.Unmount(p.Mnt, syscall.MNT_DETACH)
		}
		err = errors.Join(err, fmt.Errorf("%s was still mounted after %s exited", p.Mnt, filepath.Base(p.Cmd.Path)))
	}
	return err
}

// Mounted reports whether something is mounted at mnt.
func Mounted(mnt string) bool { return MountedIn("", mnt) }

// MountedIn reports whether something is mounted at mnt in the mount
// namespace whose mountinfo file is mountInfo ("": this process's).
func MountedIn(mountInfo, mnt string) bool {
	if mountInfo == "" {
		mountInfo = "/proc/self/mountinfo"
	}
	b, err := os.ReadFile(mountInfo)
	if err != nil {
		return false
	}
	abs, _ := filepath.Abs(mnt)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == abs {
			return true
		}
	}
	return false
}

// PFSCounters asks a pfssim process for a fresh dump of its counters and
// polls statsFile until it lands.
func (p *Proc) PFSCounters(statsFile string, timeout time.Duration) (pfssim.Counters, error) {
	before, _ := pfssim.ReadCounters(statsFile)
	if err := p.Cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		return pfssim.Counters{}, err
	}
	deadline := time.Now().Add(timeout)
	for wait := time.Millisecond; ; wait = min(wait*2, 50*time.Millisecond) {
		c, err := pfssim.ReadCounters(statsFile)
		if err == nil && c.Dumps > before.Dumps {
			return c, nil
		}
		if time.Now().After(deadline) {
			return c, fmt.Errorf("pfssim did not dump its counters within %v", timeout)
		}
		time.Sleep(wait)
	}
}
