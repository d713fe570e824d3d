package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dlfs/dlfs/daemon"
	"github.com/dlfs/dlfs/fusefs"
)

// doctorEnv is what the checks read from the machine; tests replace it.
type doctorEnv struct {
	host    daemon.Host // what daemon.Config.Check reads
	dialTCP func(addr string) error
}

func hostEnv() doctorEnv {
	return doctorEnv{
		host: daemon.ThisHost(),
		dialTCP: func(addr string) error {
			c, err := net.DialTimeout("tcp", addr, dialTimeout)
			if err == nil {
				c.Close()
			}
			return err
		},
	}
}

func newDoctorCmd() *cobra.Command {
	// doctor takes every mount flag, so that it can be given the same
	// command line, and builds the same Config from them.
	mount, o := mountCommand(runMount)
	cmd := &cobra.Command{
		Use:   "doctor [MOUNT FLAGS] [SOURCE [MOUNTPOINT]]",
		Short: "Check that this machine can run a mount with these flags, one line per check",
		Long: `doctor makes the checks dlfs mount makes before it scans SOURCE, and prints
each: /dev/fuse, the mount helper, user_allow_other for --allow-other, the
kernel's version, memory for --ram-cache, the --ssd-cache directory (its
mode, its lock, its free space) and --ssd-cache-size, the
--cluster-key-file's mode and contents, that --bind, --data-addr and
--metrics-addr are free, the addresses the other hosts would be given,
MOUNTPOINT (a dead mount, a live one, one that is not empty) and SOURCE,
when given. It adds what mount does not check: that --join answers and,
for a MOUNTPOINT that is a live dlfs mount, that every member's data
address answers. It takes every flag dlfs mount takes: give it the
mount's command line. Each line says ok, warn or FAIL, and what to do; it
exits 1 if any check fails, when dlfs mount would refuse to start.`,
		Args: cobra.MaximumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			args = append(args, "", "")
			cfg, err := o.config(args[0], args[1])
			if err != nil {
				return err
			}
			failed := printChecks(cmd.OutOrStdout(), runDoctor(hostEnv(), cfg))
			switch {
			case failed == 1:
				return errors.New("1 check failed")
			case failed > 1:
				return fmt.Errorf("%d checks failed", failed)
			}
			return nil
		},
	}
	cmd.Flags().AddFlagSet(mount.Flags())
	return cmd
}

// printChecks writes one line per check and returns how many failed.
func printChecks(w io.Writer, checks []daemon.Check) int {
	failed := 0
	for _, c := range checks {
		fmt.Fprintf(w, "%-4s  %s: %s\n", c.Level, printable(c.What), printable(c.Detail))
		if c.Level == daemon.Fail {
			failed++
		}
	}
	return failed
}

// runDoctor makes the mount's own checks (daemon.Config.Check), then
// those only doctor makes: whether --join answers, and whether a live
// mount's members do.
func runDoctor(env doctorEnv, cfg daemon.Config) []daemon.Check {
	out := cfg.Check(env.host)
	out = append(out, checkJoin(env, cfg.Join)...)
	if cfg.Mountpoint != "" {
		if m, ok := fusefs.MountAt(cfg.Mountpoint); ok && strings.HasPrefix(m.Source, "dlfs:") {
			out = append(out, checkLiveMembers(env, cfg.Mountpoint, cfg.ControlName)...) // can it reach its peers?
			out = append(out, checkLivePassthrough(cfg.Mountpoint, cfg.ControlName)...)
		}
	}
	return out
}

func unwrapNet(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		var se *os.SyscallError
		if errors.As(oe.Err, &se) {
			return se.Err
		}
		return oe.Err
	}
	return err
}

// checkLivePassthrough says whether the live dlfs mount at mnt uses FUSE
// passthrough, and why not.
func checkLivePassthrough(mnt, control string) []daemon.Check {
	b, err := os.ReadFile(filepath.Join(mnt, control, "stats"))
	if err != nil {
		return nil
	}
	var st daemon.Stats
	if json.Unmarshal(b, &st) != nil {
		return nil // checkLiveMembers says so
	}
	pt := st.Passthrough
	if !pt.On {
		return []daemon.Check{{Level: daemon.OK, What: "passthrough", Detail: fmt.Sprintf("off at %s: %s", mnt, pt.Why)}}
	}
	return []daemon.Check{{Level: daemon.OK, What: "passthrough", Detail: fmt.Sprintf("on at %s: %d opens served from %d backing files (%s of --ram-cache)",
		mnt, pt.Opens, pt.BackingFiles, human(pt.BackingBytes))}}
}
