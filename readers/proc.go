package readers

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// procInfo is what the stream key needs of a process.
type procInfo struct {
	ppid    int
	cmdline string
}

// maxCmdline bounds what is read of /proc/PID/cmdline.
const maxCmdline = 4096

// readProc reads pid's parent and command line under procRoot.
func readProc(procRoot string, pid int) (procInfo, error) {
	stat, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return procInfo{}, err
	}
	ppid, err := parseStatPPID(stat)
	if err != nil {
		return procInfo{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return procInfo{}, err
	}
	defer f.Close()
	buf := make([]byte, maxCmdline)
	n, _ := f.Read(buf)
	return procInfo{ppid: ppid, cmdline: string(buf[:n])}, nil
}

// parseStatPPID returns the parent pid from the contents of /proc/PID/stat:
// "pid (comm) state ppid ...". comm may hold spaces and parentheses, so the
// fields after it are found from the last ')'.
func parseStatPPID(stat []byte) (int, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name")
	}
	fields := bytes.Fields(stat[i+1:])
	if len(fields) < 2 {
		return 0, fmt.Errorf("too few fields")
	}
	ppid, err := strconv.Atoi(string(fields[1]))
	if err != nil || ppid < 0 {
		return 0, fmt.Errorf("bad parent pid %q", fields[1])
	}
	return ppid, nil
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
