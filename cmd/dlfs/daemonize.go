package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// dlfs mount --daemon
//
// The daemon runs this binary again, with the same arguments less
// --daemon, in a session of its own (no terminal: a closed SSH session
// or tmux pane sends it nothing), its input /dev/null and its output two
// pipes this process reads. What the daemon writes to stderr is copied to
// this process's stderr; the mounted line, the one thing the daemon
// writes to stdout, is copied to stdout, and this process exits 0 at
// once. If the daemon exits first, this process exits with its status
// (its error is on stderr). So `dlfs mount --daemon SRC MNT && train`
// starts training on a usable mount, and no pipe this process was given
// is held by the daemon once it returns (`$(dlfs mount --daemon ...)` and
// `| tee` end). The daemon's later output goes nowhere: give --log-file.

// exitCode is an error that says only the process's exit status: what
// went wrong is already said.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// daemonArgs returns the command line args (this process's, less the
// program) with every --daemon taken out and --daemon=false put in, so
// that neither DLFS_DAEMON nor a config file makes the daemon start
// another.
func daemonArgs(args []string) []string {
	out := make([]string, 0, len(args)+1)
	for i, a := range args {
		if a == "--" {
			return append(append(out, "--daemon=false"), args[i:]...)
		}
		if a == "--daemon" || len(a) > 9 && a[:9] == "--daemon=" {
			continue
		}
		out = append(out, a)
	}
	return append(out, "--daemon=false")
}

// runDaemon starts exe with args as the daemon and waits for its mounted
// line (copied to stdout; nil) or its exit (an exitCode, or the error
// that kept it from starting). SIGINT and SIGTERM, while it waits, go on
// to the daemon, which then stops and exits.
func runDaemon(exe string, args []string, stdout, stderr io.Writer) error {
	outR, outW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("--daemon: %w", err)
	}
	defer outR.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		outW.Close()
		return fmt.Errorf("--daemon: %w", err)
	}
	defer errR.Close()
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = outW, errW // *os.File: handed over, not copied by exec
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		return fmt.Errorf("--daemon: start %s: %w", exe, err)
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	// Both goroutines end: the copier when the daemon exits (its end of
	// the pipe closes) or this process does; the scanner likewise.
	copied := make(chan struct{})
	go func() {
		io.Copy(stderr, errR)
		close(copied)
	}()
	mounted := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(outR)
		if sc.Scan() {
			mounted <- sc.Text()
		}
		close(mounted)
	}()
	for {
		select {
		case s := <-sigs:
			_ = cmd.Process.Signal(s)
		case line, ok := <-mounted:
			if ok {
				fmt.Fprintln(stdout, line)
				return nil
			}
			// stdout closed without the line: the daemon exits.
			err := cmd.Wait()
			<-copied
			var ee *exec.ExitError
			switch {
			case err == nil:
				return fmt.Errorf("--daemon: dlfs mount exited (status 0) before it mounted")
			case errors.As(err, &ee) && ee.ExitCode() > 0:
				return exitCode(ee.ExitCode())
			}
			return fmt.Errorf("--daemon: dlfs mount: %w", err)
		}
	}
}
