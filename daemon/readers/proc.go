package readers

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/dlfs/dlfs/access"
)

// procInfo is what the stream key needs of a process.
type procInfo struct {
	tgid    int // the process a thread belongs to (FUSE reports threads)
	ppid    int
	cmdline string
	cred    access.Cred // what the kernel checks its accesses with
}

// maxCmdline bounds what is read of /proc/PID/cmdline.
const maxCmdline = 4096

// readProc reads what pid (a thread or a process) belongs to under
// procRoot: its process, that process's parent and command line, and its
// user.
func readProc(procRoot string, pid int) (procInfo, error) {
	status, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "status"))
	if err != nil {
		return procInfo{}, err
	}
	tgid, ppid, err := parseStatus(status)
	if err != nil {
		return procInfo{}, fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	cred, err := access.ParseCred(status)
	if err != nil {
		return procInfo{}, fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(tgid), "cmdline"))
	if err != nil {
		return procInfo{}, err
	}
	defer f.Close()
	buf := make([]byte, maxCmdline)
	n, _ := f.Read(buf)
	return procInfo{tgid: tgid, ppid: ppid, cmdline: string(buf[:n]), cred: cred}, nil
}

// parseStatus returns the thread group (the process) and the parent pid
// from the contents of /proc/PID/status ("Tgid:\t123" and "PPid:\t45"
// lines).
func parseStatus(status []byte) (tgid, ppid int, err error) {
	tgid, ppid = -1, -1
	for _, line := range bytes.Split(status, []byte("\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		var dst *int
		switch string(k) {
		case "Tgid":
			dst = &tgid
		case "PPid":
			dst = &ppid
		default:
			continue
		}
		n, err := strconv.Atoi(string(bytes.TrimSpace(v)))
		if err != nil || n < 0 {
			return 0, 0, fmt.Errorf("bad %s %q", k, bytes.TrimSpace(v))
		}
		*dst = n
	}
	if tgid <= 0 || ppid < 0 {
		return 0, 0, fmt.Errorf("no Tgid or PPid")
	}
	return tgid, ppid, nil
}

// isWorkerOf reports whether a process with cmdline child, whose parent
// has cmdline parent, is one of the parent's workers, and so reads for the
// same stream: forked (the same command line, as a DataLoader's workers
// are by default on Linux) or started by multiprocessing's spawn or
// forkserver.
func isWorkerOf(child, parent string) bool {
	if child == "" {
		return false
	}
	if child == parent {
		return true
	}
	for _, m := range []string{"multiprocessing.spawn", "multiprocessing.forkserver", "--multiprocessing-fork"} {
		if bytes.Contains([]byte(child), []byte(m)) {
			return true
		}
	}
	return false
}
