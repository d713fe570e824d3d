package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlfs/dlfs/daemon"
	"github.com/dlfs/dlfs/warmup"
)

func newWarmupCmd() *cobra.Command {
	var check, evict bool
	var controlName string
	cmd := &cobra.Command{
		Use:   "warmup PATH...",
		Short: "Fetch what lies under PATHs (in a dlfs mount) into the caches, or check or evict it",
		Long: `warmup fetches the files under each PATH, which must lie in one dlfs mount,
into the caches, in the order cheapest for the PFS (packed samples by
container, in runs of neighbours), with 64 fetches at a time so that a
training job beside it is not starved. In a cluster each sample lands on the
node that owns it. It shows the progress and exits 0 when done. If the
caches hold less than the paths, it says how much fits and warms that much.
Interrupting it (Ctrl-C) stops the warm-up; what was cached stays cached.

--check prints, per PATH, the share of its bytes in this node's RAM, on its
SSD, owned by another node, and cached nowhere. --evict drops the files from
this node's caches.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if check && evict {
				return errors.New("--check and --evict: choose one")
			}
			mnt, rels, err := mountPaths(args, controlName)
			if err != nil {
				return err
			}
			ctl := filepath.Join(mnt, controlName)
			switch {
			case check:
				return checkPaths(cmd.OutOrStdout(), ctl, args, rels)
			case evict:
				return writeControl(ctl, "evict "+strings.Join(quoteRoot(rels), " "))
			}
			return warm(cmd.ErrOrStderr(), ctl, rels)
		},
	}
	cmd.Flags().BoolVar(&check, "check", false, "print how much of each PATH the caches hold")
	cmd.Flags().BoolVar(&evict, "evict", false, "drop the files under each PATH from this node's caches")
	cmd.Flags().StringVar(&controlName, "control-name", ".dlfs", "name of the mount's control directory")
	return cmd
}

// mountPaths finds the dlfs mount the paths lie in and their paths
// relative to it ("" for the mount itself).
func mountPaths(paths []string, controlName string) (string, []string, error) {
	var mnt string
	var rels []string
	for _, p := range paths {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", nil, err
		}
		if _, err := os.Lstat(abs); err != nil {
			return "", nil, fmt.Errorf("%s: %w", p, unwrapPathErr(err))
		}
		m := findMount(abs, controlName)
		if m == "" {
			return "", nil, fmt.Errorf("%s is not in a dlfs mount (no %s/control above it)", p, controlName)
		}
		if mnt != "" && m != mnt {
			return "", nil, fmt.Errorf("%s is in the mount %s, the other paths in %s: warm one mount at a time", p, m, mnt)
		}
		mnt = m
		rel, err := filepath.Rel(m, abs)
		if err != nil {
			return "", nil, err
		}
		if rel == "." {
			rel = ""
		}
		if strings.ContainsAny(rel, " \t\n") {
			return "", nil, fmt.Errorf("%s: a path with white space cannot be named to dlfs; name a directory above it", p)
		}
		rels = append(rels, filepath.ToSlash(rel))
	}
	return mnt, rels, nil
}

func unwrapPathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// findMount returns the directory at or above path that holds the control
// directory, or "".
func findMount(path, controlName string) string {
	for d := path; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, controlName, "control")); err == nil {
			return d
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}

// quoteRoot names the mount itself "." in a control line.
func quoteRoot(rels []string) []string {
	out := make([]string, len(rels))
	for i, r := range rels {
		out[i] = r
		if r == "" {
			out[i] = "."
		}
	}
	return out
}

// writeControl writes one command; a rejected one fails with dlfs's reason.
func writeControl(ctl, line string) error {
	err := os.WriteFile(filepath.Join(ctl, "control"), []byte(line+"\n"), 0)
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.EINVAL) {
		var st daemon.ControlStatus
		if b, rerr := os.ReadFile(filepath.Join(ctl, "control")); rerr == nil && json.Unmarshal(b, &st) == nil && st.LastError != "" {
			return errors.New(st.LastError)
		}
	}
	return err
}

func checkPaths(w io.Writer, ctl string, args, rels []string) error {
	if err := writeControl(ctl, "check "+strings.Join(quoteRoot(rels), " ")); err != nil {
		return err
	}
	var st daemon.ControlStatus
	b, err := os.ReadFile(filepath.Join(ctl, "control"))
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil {
		return fmt.Errorf("reading the check: %w", err)
	}
	for i, rel := range rels {
		r, ok := st.Checks[rel]
		if !ok {
			return fmt.Errorf("%s: no result (another check ran at the same time?)", printable(args[i]))
		}
		fmt.Fprintln(w, checkLine(args[i], r))
	}
	return nil
}

// checkLine is what warmup --check prints of the path named.
func checkLine(name string, r daemon.CheckResult) string {
	return fmt.Sprintf("%s: %d files, %s: RAM %.1f%%, SSD %.1f%%, peers %.1f%%, not cached %.1f%%",
		printable(name), r.Files, human(r.Bytes), 100*r.RAM, 100*r.SSD, 100*r.Peer, 100*r.None)
}

// warm starts the warm-up and shows its progress until it ends; SIGINT
// or SIGTERM stops it.
func warm(w io.Writer, ctl string, rels []string) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	if err := writeControl(ctl, "warmup "+strings.Join(quoteRoot(rels), " ")); err != nil {
		return err
	}
	tty := isTerminal(w)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	lastLine := time.Time{}
	told := false
	for {
		st, err := warmupStatus(ctl)
		if err != nil {
			return err
		}
		if !told {
			switch {
			case st.Bytes == 0:
				fmt.Fprintln(w, "nothing to warm: the paths hold no file bytes")
				return nil
			case st.FitBytes == 0:
				return fmt.Errorf("the caches hold none of the %s under these paths: mount with --ram-cache SIZE or --ssd-cache DIR to warm them", human(st.Bytes))
			case st.FitBytes < st.Bytes:
				fmt.Fprintf(w, "the caches hold %s of the %s under these paths: warming %s (%d of %d files)\n",
					human(st.FitBytes), human(st.Bytes), human(st.FitBytes), st.FitFiles, st.Files)
			}
		}
		told = true
		over := st.State != "running"
		if tty {
			fmt.Fprintf(w, "\r%s", progress(st))
		} else if over || time.Since(lastLine) >= 5*time.Second {
			fmt.Fprintln(w, progress(st))
			lastLine = time.Now()
		}
		if over {
			if tty {
				fmt.Fprintln(w)
			}
			if st.Errors > 0 {
				return fmt.Errorf("%d files could not be fetched (see the daemon's log); the rest are cached", st.Errors)
			}
			if st.State == "stopped" {
				return errors.New("the warm-up was stopped")
			}
			return nil
		}
		select {
		case <-tick.C:
		case <-sig:
			if tty {
				fmt.Fprintln(w)
			}
			if err := writeControl(ctl, "warmup stop"); err != nil {
				return fmt.Errorf("stopping the warm-up: %w", err)
			}
			st, _ := warmupStatus(ctl)
			return fmt.Errorf("interrupted: %s warmed and cached; the rest is not", human(st.DoneBytes))
		}
	}
}

func warmupStatus(ctl string) (warmup.Status, error) {
	var st struct {
		Warmup warmup.Status `json:"warmup"`
	}
	b, err := os.ReadFile(filepath.Join(ctl, "stats"))
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil {
		return warmup.Status{}, fmt.Errorf("reading the warm-up's progress: %w", err)
	}
	return st.Warmup, nil
}

// progress is one line: share, a bar, bytes, rate and the time left
// (once over, the time taken).
func progress(st warmup.Status) string {
	share := 1.0
	if st.FitBytes > 0 {
		share = float64(st.DoneBytes) / float64(st.FitBytes)
	}
	const width = 30
	n := min(int(share*width), width)
	eta := ", ETA -"
	switch {
	case st.State != "running":
		eta = ", took " + fmtUptime(st.Seconds)
	case st.BytesPerSec > 0:
		eta = ", ETA " + fmtUptime(float64(max(st.FitBytes-st.DoneBytes, 0))/st.BytesPerSec)
	}
	return fmt.Sprintf("warming %5.1f%% [%s%s] %s / %s, %s/s, %d files%s", 100*share, strings.Repeat("#", n), strings.Repeat(".", width-n),
		human(st.DoneBytes), human(st.FitBytes), human(int64(st.BytesPerSec)), st.DoneFiles, eta)
}

// isTerminal reports whether w is a terminal (the bar is redrawn in
// place there, and printed every 5 s elsewhere).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
