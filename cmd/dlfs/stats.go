package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlfs/dlfs/daemon"
	"github.com/dlfs/dlfs/fusefs"
	"github.com/dlfs/dlfs/latency"
)

func newStatsCmd() *cobra.Command {
	var (
		watch    bool
		interval time.Duration
		rawJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "stats [MOUNTPOINT]",
		Short: "Show a mount's figures as a table: tiers, PFS, prefetch, jobs, cluster",
		Long: `stats reads MOUNTPOINT/.dlfs/stats (MOUNTPOINT defaults to the dlfs mount
holding the current directory) and prints it as tables: reads served by
tier with their share and latency, the PFS, the caches, the prefetcher,
each job's ranks and the cluster's members. With --watch it redraws them
every --interval (2s), like top, with rates per second between drawings;
when stdout is not a terminal it prints each drawing after the last, with
no terminal codes.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if interval <= 0 {
				return fmt.Errorf("--interval %v: want a positive duration, such as 2s", interval)
			}
			mnt, err := statsMount(args)
			if err != nil {
				if len(args) == 1 && watch && isDuration(args[0]) {
					return fmt.Errorf("%s is not a dlfs mount: --watch takes no value; give the interval as --interval %s", args[0], args[0])
				}
				return err
			}
			out := cmd.OutOrStdout()
			if rawJSON {
				b, err := os.ReadFile(filepath.Join(mnt, ".dlfs", "stats"))
				if err != nil {
					return fmt.Errorf("read %s: %w", mnt, err)
				}
				_, err = out.Write(b)
				return err
			}
			if !watch {
				st, err := readMountStats(mnt)
				if err != nil {
					return err
				}
				return renderStats(out, mnt, st, nil, 0)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return watchStats(ctx, out, isTerminal(out), mnt, interval)
		},
	}
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "redraw every --interval until interrupted")
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "how often --watch redraws")
	cmd.Flags().BoolVar(&rawJSON, "json", false, "print the raw stats document")
	return cmd
}

func isDuration(s string) bool {
	_, err := time.ParseDuration(s)
	return err == nil
}

// statsMount returns the mount named, or the dlfs mount holding the
// current directory, checking that it is one.
func statsMount(args []string) (string, error) {
	if len(args) == 1 {
		if _, err := os.Stat(filepath.Join(args[0], ".dlfs", "stats")); err != nil {
			if err := fusefs.Diagnose(args[0], err); err != nil {
				return "", err // a dead mount, or one this user may not enter
			}
			return "", fmt.Errorf("%s is not a dlfs mount (no .dlfs/stats there); give the mountpoint of a running dlfs mount", args[0])
		}
		return args[0], nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("stats: %w", err)
	}
	mnt := findMount(wd, ".dlfs")
	if mnt == "" {
		return "", fmt.Errorf("%s is not inside a dlfs mount; give the mountpoint: dlfs stats MOUNTPOINT", wd)
	}
	return mnt, nil
}

func readMountStats(mnt string) (daemon.Stats, error) {
	var st daemon.Stats
	b, err := os.ReadFile(filepath.Join(mnt, ".dlfs", "stats"))
	if err := fusefs.Diagnose(mnt, err); err != nil {
		return st, err
	}
	if errors.Is(err, fs.ErrNotExist) {
		return st, fmt.Errorf("%s is no longer a dlfs mount (the daemon stopped?)", mnt)
	}
	if err != nil {
		return st, fmt.Errorf("read %s stats: %w", mnt, err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s/.dlfs/stats: %w (is this dlfs version older than the command?)", mnt, err)
	}
	return st, nil
}

// watchStats draws the tables every interval, with rates since the
// previous drawing, until ctx ends: in place on a terminal (tty), one
// after the other, stamped with the time, elsewhere.
func watchStats(ctx context.Context, out io.Writer, tty bool, mnt string, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	var prev *daemon.Stats
	var prevAt time.Time
	for {
		st, err := readMountStats(mnt)
		if err != nil {
			return err
		}
		now := time.Now()
		var b strings.Builder
		if tty {
			b.WriteString("\x1b[H\x1b[2J") // home, clear
		} else if prev != nil {
			b.WriteString("\n")
		}
		dt := 0.0
		if prev != nil {
			dt = now.Sub(prevAt).Seconds()
		}
		if err := renderStats(&b, mnt, st, prev, dt); err != nil {
			return err
		}
		if tty {
			fmt.Fprintf(&b, "\nevery %v; Ctrl-C to stop\n", interval)
		} else {
			fmt.Fprintf(&b, "\nat %s\n", now.Format(time.RFC3339))
		}
		if _, err := io.WriteString(out, b.String()); err != nil {
			return err
		}
		prev, prevAt = &st, now
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// tiers in the order reads look in them.
var tiers = []string{"ram", "stage", "ssd", "peer", "moved", "pfs"}

// renderStats writes st as tables; with prev, dt seconds earlier, also
// the rates between them.
func renderStats(w io.Writer, mnt string, st daemon.Stats, prev *daemon.Stats, dt float64) error {
	rate := func(cur, old int64) string {
		if prev == nil || dt <= 0 {
			return "-"
		}
		return fmtCount(float64(cur-old) / dt)
	}
	byteRate := func(cur, old int64) string {
		if prev == nil || dt <= 0 {
			return "-"
		}
		return human(int64(float64(cur-old)/dt)) + "/s"
	}
	var old daemon.Stats
	if prev != nil {
		old = *prev
	}
	fmt.Fprintf(w, "dlfs %s  (SOURCE %s)  node %s  up %s\n\n", printable(mnt), printable(st.Source), printable(st.Node), fmtUptime(st.UptimeSeconds))

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "served\treads\tbytes\tshare\treads/s\tbytes/s\tp50\tp99\t")
	var reads int64
	for _, t := range tiers {
		reads += st.Served[t].Reads
	}
	for _, t := range tiers {
		s := st.Served[t]
		share := "-"
		if reads > 0 {
			share = fmt.Sprintf("%.1f%%", 100*float64(s.Reads)/float64(reads))
		}
		var lat latency.Summary
		if st.Latency != nil {
			lat = st.Latency.Read[t]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", t, fmtCount(float64(s.Reads)), human(s.Bytes), share,
			rate(s.Reads, old.Served[t].Reads), byteRate(s.Bytes, old.Served[t].Bytes), fmtSeconds(lat.P50, lat.Count), fmtSeconds(lat.P99, lat.Count))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(w, "\nPFS       %s opens, %s read calls, %s read", fmtCount(float64(st.PFS.Opens)), fmtCount(float64(st.PFS.ReadOps)),
		human(st.PFS.Bytes))
	if prev != nil && dt > 0 {
		fmt.Fprintf(w, "; now %s opens/s, %s", rate(st.PFS.Opens, old.PFS.Opens), byteRate(st.PFS.Bytes, old.PFS.Bytes))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "cache     RAM %s of %s (%s blocks)", human(st.Cache.RAM.Bytes), human(st.Cache.RAM.Capacity),
		fmtCount(float64(st.Cache.RAM.Entries)))
	if st.Cache.SSD.Capacity > 0 {
		fmt.Fprintf(w, ", SSD %s of %s", human(st.Cache.SSD.Bytes), human(st.Cache.SSD.Capacity))
	}
	pf := st.Prefetch
	fmt.Fprintf(w, "\nprefetch  staged %s of %s, %d in flight, fetched %s, wasted %s, pushed %s\n", human(pf.StagedBytes),
		human(pf.StagingCapacity), pf.InFlight, human(pf.FetchedBytes),
		human(pf.WastedBytes), human(pf.PushedBytes))
	fmt.Fprintf(w, "catalog   %s files, %s dirs, %s\n", fmtCount(float64(st.Catalog.Files)), fmtCount(float64(st.Catalog.Dirs)), human(st.Catalog.Bytes))
	if pt := st.Passthrough; pt.On {
		// Their reads never reach dlfs: not in the served table above.
		fmt.Fprintf(w, "kernel    passthrough on: %s opens of %s read by the kernel from %s backing files (%s; %s held by opens after eviction)\n",
			fmtCount(float64(pt.Opens)), human(pt.Bytes), fmtCount(float64(pt.BackingFiles)), human(pt.BackingBytes), human(pt.EvictedOpenBytes))
	} else {
		fmt.Fprintf(w, "kernel    passthrough off: %s\n", printable(pt.Why))
	}

	if len(st.Jobs) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "job\trank\tepoch\tconsumed\tof\thits\tlate\tmisses\tstall s\tlead s\tsamples/s\tworkers\tstate\t")
		for _, job := range slices.Sorted(maps.Keys(st.Jobs)) {
			for _, rank := range slices.Sorted(maps.Keys(st.Jobs[job])) {
				r := st.Jobs[job][rank]
				workers := "-"
				for _, a := range st.Allocation.Ranks {
					if a.Job == job && fmt.Sprintf("rank-%d", a.Rank) == rank {
						workers = fmt.Sprint(a.Advice.Workers)
					}
				}
				state := "live"
				if r.Ended {
					state = "ended " + fmtUptime(r.EndedSeconds) + " ago"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%.2f\t%.1f\t%s\t%s\t%s\t\n", printable(job), printable(rank), r.Epoch, fmtCount(float64(r.Consumed)),
					fmtCount(float64(r.Predicted)), fmtCount(float64(r.Hits)), fmtCount(float64(r.Late)), fmtCount(float64(r.Misses)),
					r.StallSeconds, r.LeadSeconds, fmtCount(r.Rate), workers, state)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "member\tstate\towned samples\towned bytes\tshare\tdata port\t")
	for _, m := range st.Cluster.Members {
		share := "-"
		if st.Catalog.Bytes > 0 && m.State == "alive" {
			share = fmt.Sprintf("%.1f%%", 100*float64(m.OwnedBytes)/float64(st.Catalog.Bytes))
		}
		data := "-" // this node, or not dialled yet
		if m.Data != nil {
			data = "answers"
			if !m.Data.Reachable {
				data = "UNREACHABLE"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", printable(m.Name), printable(m.State), fmtCount(float64(m.OwnedSamples)), human(m.OwnedBytes), share, data)
	}
	return tw.Flush()
}

// fmtCount prints n with thousands separators, or with one decimal under
// 10.
func fmtCount(n float64) string {
	if n < 10 && n != float64(int64(n)) {
		return fmt.Sprintf("%.1f", n)
	}
	s := fmt.Sprintf("%.0f", n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

// fmtSeconds prints a latency in the unit that suits it; "-" with no
// observations.
func fmtSeconds(s float64, count uint64) string {
	if count == 0 {
		return "-"
	}
	switch {
	case s < 1e-3:
		return fmt.Sprintf("%.0fµs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.1fms", s*1e3)
	}
	return fmt.Sprintf("%.2fs", s)
}

func fmtUptime(s float64) string {
	return (time.Duration(s) * time.Second).Round(time.Second).String()
}
