package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/cmd/dlfs/packer"
	"github.com/dlfs/dlfs/daemon"
)

func newPackCmd() *cobra.Command {
	var (
		shards, workers int
		verify          bool
	)
	cmd := &cobra.Command{
		Use:   "pack SOURCE OUTDIR | pack --verify OUTDIR SOURCE",
		Short: "Pack a directory tree into seqfile shards that dlfs mounts as the original tree",
		Long: `Pack the tree at SOURCE into OUTDIR: --shards files of about equal size
(shard-NNNNN.seq) and an index (index.seqidx), keeping every path, size, mode
and mtime. "dlfs mount OUTDIR MOUNTPOINT" then shows the original tree.
Running it again over a finished OUTDIR does nothing.

With --verify, check every record of the pack at OUTDIR against SOURCE
instead, and exit 1 on any difference.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if verify {
				return runVerify(cmd.OutOrStdout(), args[0], args[1])
			}
			if shards < 1 || shards > 100_000 {
				return fmt.Errorf("--shards %d: want 1 to 100000", shards)
			}
			if workers < 1 || workers > 1024 {
				return fmt.Errorf("--workers %d: want 1 to 1024", workers)
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			bar := newProgressBar(cmd.ErrOrStderr())
			res, err := packer.Pack(ctx, packer.Config{Source: args[0], Out: args[1], Shards: shards, Workers: workers,
				Progress: bar.show})
			bar.done()
			if err != nil {
				return err
			}
			if res.AlreadyPacked {
				fmt.Fprintf(cmd.OutOrStdout(), "dlfs: %s is already a pack of %s (%d files, %s); nothing to do\n",
					printable(args[1]), printable(args[0]), res.Files, human(res.Bytes))
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "dlfs: packed %d files (%s) into %d shards in %.1f s (%.0f MB/s)\n",
				res.Files, human(res.Bytes), shards, res.Elapsed.Seconds(), float64(res.Bytes)/1e6/max(res.Elapsed.Seconds(), 1e-3))
			if res.Skipped > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "dlfs: skipped %d entries that are not files, directories or symlinks\n", res.Skipped)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&shards, "shards", 16, "number of shard files")
	f.IntVar(&workers, "workers", 8, "files read at once")
	f.BoolVar(&verify, "verify", false, "check the pack at the first argument against the tree at the second")
	return cmd
}

func runVerify(out io.Writer, dir, src string) error {
	n, bad, err := packer.Verify(dir, src, 20)
	if err != nil {
		return err
	}
	if len(bad) == 0 {
		fmt.Fprintf(out, "dlfs: %s matches %s: %d entries checked\n", printable(dir), printable(src), n)
		return nil
	}
	for _, m := range bad {
		fmt.Fprintf(out, "%s: %s\n", printable(m.Name), printable(m.Reason))
	}
	return fmt.Errorf("%s does not match %s (first %d differences above)", printable(dir), printable(src), len(bad))
}

// progressBar draws packing progress on a terminal, redrawing one line;
// elsewhere (a log file) it prints a line every 10 seconds.
type progressBar struct {
	w    io.Writer
	tty  bool
	last time.Time
	drew bool
}

func newProgressBar(w io.Writer) *progressBar {
	b := &progressBar{w: w}
	if f, ok := w.(*os.File); ok {
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		b.tty = err == nil
	}
	return b
}

func (b *progressBar) show(p packer.Progress) {
	if !b.tty && time.Since(b.last) < 10*time.Second {
		return
	}
	b.last = time.Now()
	frac := 1.0
	if p.TotalBytes > 0 {
		frac = float64(p.Bytes) / float64(p.TotalBytes)
	}
	const width = 30
	fill := int(frac * width)
	line := fmt.Sprintf("packing [%s%s] %3.0f%% %d/%d files, %s of %s, %.0f MB/s",
		strings.Repeat("#", fill), strings.Repeat(".", width-fill), 100*frac, p.Files, p.TotalFiles,
		human(p.Bytes), human(p.TotalBytes), float64(p.Bytes)/1e6/max(p.Elapsed.Seconds(), 1e-3))
	if b.tty {
		fmt.Fprintf(b.w, "\r%s\x1b[K", line)
		b.drew = true
	} else {
		fmt.Fprintln(b.w, line)
	}
}

func (b *progressBar) done() {
	if b.drew {
		fmt.Fprintln(b.w)
	}
}

// human formats a byte count in binary units.
func human(n int64) string { return daemon.FormatBytes(n) }
