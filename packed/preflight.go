//go:build cgo && !nohdf5

package packed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"syscall"
	"time"

	"gonum.org/v1/hdf5"
)

// Preflight: libhdf5 (1.10) trusts what a file says in places and can be
// made to crash the process (a SIGSEGV inside the library, which no Go
// code can recover from) or to loop by a crafted or damaged file.
// FuzzHDF5Listing finds such files. Before the daemon opens an HDF5 file
// itself, a child process does what listing and reading it will do: it
// opens the same file (the descriptor is passed, so it is the same bytes),
// walks its groups, describes its datasets and reads the first and the
// last row of each shown. A file whose child dies of a signal, or runs
// past preflightTimeout, is not shown, with one log line; the daemon never
// touches it. The child is this binary run again: init below turns a
// process started with preflightEnv set into the check, before main.
//
// This guards listing completely (the child runs the same walk) and reads
// in part (rows other than the first and last could still reach a crash
// the two did not). Running every libhdf5 call in a helper process would
// guard all of it.

const (
	preflightEnv     = "DLFS_HDF5_PREFLIGHT"
	preflightTimeout = 30 * time.Second
	// preflightFailed is the child's exit code when the library reported
	// an error (not a crash): the daemon's own open then reports it.
	preflightFailed = 3
	// preflightMaxRow: larger rows are not read by the check.
	preflightMaxRow = 16 << 20
)

func init() {
	if p := os.Getenv(preflightEnv); p != "" {
		os.Exit(preflight(p))
	}
}

// preflight opens the HDF5 file at path, walks it and reads the first and
// last row of every dataset it would show. It returns the exit code.
func preflight(path string) int {
	defer quiet()()
	var err error
	func() {
		defer recoverLibrary(&err)
		f, e := hdf5.OpenFile(path, hdf5.F_ACC_RDONLY)
		if e != nil {
			err = e
			return
		}
		hf := &h5File{f: f, sets: map[string]*h5Set{}, log: slog.New(slog.DiscardHandler)}
		defer hf.close()
		if err = hf.walk(&hf.f.CommonFG, ""); err != nil {
			return
		}
		d := &h5Dataset{}
		for _, set := range hf.sets {
			if set.dims[0] == 0 || set.rowLen > preflightMaxRow {
				continue
			}
			for _, r := range []uint{0, set.dims[0] - 1} {
				if _, err = d.readRows(hf, set, r, 1); err != nil {
					return
				}
			}
		}
	}()
	if err != nil {
		return preflightFailed
	}
	return 0
}

// errCrashes says the preflight child died on a file.
var errCrashes = errors.New("libhdf5 crashes or hangs on this file")

// checkH5 runs the preflight for the open file fd (named name, for
// messages) in a child process. It returns errCrashes, wrapped, when the
// child died of a signal or timed out; nil otherwise (the daemon's own
// open reports a plain library error).
func checkH5(fd uintptr, name string) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("packed: preflight of %s: %w", name, err)
	}
	dup, err := syscall.Dup(int(fd))
	if err != nil {
		return fmt.Errorf("packed: preflight of %s: %w", name, err)
	}
	f := os.NewFile(uintptr(dup), name)
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), preflightTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), preflightEnv+"=/proc/self/fd/3")
	cmd.ExtraFiles = []*os.File{f}
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %s: checking it took over %v", errCrashes, name, preflightTimeout)
	case errors.As(err, &ee):
		if ee.ExitCode() == preflightFailed {
			return nil // the library's own error: the daemon's open reports it
		}
		// Go's runtime exits 2 on a fault inside C code; a signal it
		// does not catch kills the child outright.
		return fmt.Errorf("%w: %s: the check ended with %v", errCrashes, name, ee.ProcessState)
	}
	return fmt.Errorf("packed: preflight of %s: %w", name, err)
}
