// Command pfssim mounts a directory as a simulated contended parallel
// filesystem, for tests and benchmarks. See package test/pfssim.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/dlfs/dlfs/test/pfssim"
)

func main() {
	var cfg pfssim.Config
	flag.DurationVar(&cfg.OpenLatency, "open-latency", 0, "latency added to every open")
	flag.DurationVar(&cfg.ReadLatency, "read-latency", 0, "latency added to every read call")
	bw := flag.Float64("bandwidth-mbps", 0, "aggregate read bandwidth in MB/s (0: unlimited)")
	flag.IntVar(&cfg.MaxInFlight, "max-inflight", 64, "opens and reads served at once")
	flag.BoolVar(&cfg.NoAttrCache, "no-attr-cache", false, "let the kernel cache no attributes, so a change to DIR shows at once")
	flag.BoolVar(&cfg.PerMountInodes, "per-mount-inodes", false, "number inodes afresh on each mount, as FUSE clients without use_ino do")
	flag.StringVar(&cfg.StatsFile, "stats", "", "file the counters are written to (JSON); SIGUSR1 writes it at once")
	flag.StringVar(&cfg.TraceFile, "trace", "", "file that gets a line per read served (path, offset, bytes), written at unmount")
	flag.BoolVar(&cfg.HangReads, "hang-reads", false, "opens of files wait from the start until SIGHUP, while metadata answers (data servers that hang)")
	// SIGUSR2 hangs the simulator (every request waits, deaf to
	// interrupts) and SIGHUP resumes it: a PFS that stops answering.
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: pfssim [flags] DIR MOUNTPOINT")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 2 {
		flag.Usage()
		os.Exit(2)
	}
	cfg.Dir = flag.Arg(0)
	cfg.Bandwidth = int64(*bw * 1e6)
	// Before the mount appears: a SIGUSR1 sent as soon as it does must
	// wait in the channel, not be dropped by the runtime.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGHUP)
	sim, err := pfssim.Mount(flag.Arg(1), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pfssim:", err)
		os.Exit(1)
	}
	fmt.Printf("pfssim: mounted %s at %s\n", cfg.Dir, flag.Arg(1))
	unmounted := make(chan struct{})
	go func() { sim.Wait(); close(unmounted) }()
	for {
		select {
		case <-unmounted:
			_ = sim.Unmount()
			return
		case s := <-sigs:
			switch s {
			case syscall.SIGUSR1:
				if err := sim.Dump(); err != nil {
					fmt.Fprintln(os.Stderr, "pfssim:", err)
				}
				continue
			case syscall.SIGUSR2:
				sim.Hang()
				fmt.Fprintln(os.Stderr, "pfssim: hung")
				continue
			case syscall.SIGHUP:
				sim.Resume()
				fmt.Fprintln(os.Stderr, "pfssim: resumed")
				continue
			}
			if err := sim.Unmount(); err != nil {
				fmt.Fprintln(os.Stderr, "pfssim:", err)
				os.Exit(1)
			}
			return
		}
	}
}
