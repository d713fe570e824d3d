package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // --pprof-addr
	"os"
	"os/signal"
	"os/user"
	"runtime/pprof"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/allocator"
	"github.com/dlfs/dlfs/catalog"
	"github.com/dlfs/dlfs/daemon"
	"github.com/dlfs/dlfs/fusefs"
	"github.com/dlfs/dlfs/netlimit"
)

// mountOptions are the flags of "dlfs mount".
type mountOptions struct {
	allocation   string
	loaderCPUs   int
	jobIdle      time.Duration
	ramCache     sizeValue
	ssdCache     string
	ssdCacheSize sizeValue
	datasetID    string
	allowOther   bool
	listingAttrs bool
	controlGroup string
	maxFiles     int
	logLevel     string
	logFormat    string
	logFile      string
	daemon       bool
	metricsAddr  string
	controlName  string
	nodeName     string
	ttl          time.Duration
	debugFUSE    bool
	cpuProfile   string
	pprofAddr    string
	pfWorkers    int
	ramEviction  string
	bind         string
	advertise    string
	join         []string
	dataAddr     string
	keyFile      string
	insecure     bool
	staging      sizeValue
	readAhead    sizeValue
	placement    string
	placeEpochs  int
	coalesce     bool
	pfsMargin    float64
	pfsTimeout   time.Duration
	stopTimeout  time.Duration
	infer        bool
	push         bool
	passthrough  string
	ptFromSSD    bool
	latency      bool
	warmup       bool

	allowNonEmpty bool
}

func newMountCmd(run func(cmd *cobra.Command, cfg daemon.Config, o *mountOptions) error) *cobra.Command {
	cmd, _ := mountCommand(run)
	return cmd
}

// mountCommand is newMountCmd, and the options its flags set (dlfs
// doctor takes the same flags and builds the same Config).
func mountCommand(run func(cmd *cobra.Command, cfg daemon.Config, o *mountOptions) error) (*cobra.Command, *mountOptions) {
	o := &mountOptions{}
	def := daemon.DefaultConfig("", "")
	o.ramCache = sizeValue(def.RAMCache)
	o.ssdCacheSize = sizeValue(def.SSDCapacity)
	o.staging = sizeValue(def.Staging)
	o.readAhead = sizeValue(def.ReadAhead)
	cmd := &cobra.Command{
		Use:   "mount SOURCE MOUNTPOINT",
		Short: "Mount SOURCE read-only at MOUNTPOINT, with caching (runs in the foreground)",
		Long: `Mount the dataset directory SOURCE read-only at MOUNTPOINT and serve it from
RAM and SSD caches. SOURCE may also be a packed dataset: a dlfs pack (shows
the packed tree), MXNet RecordIO files (LABEL/ID.jpg) or HDF5 files (one .npy
per row). Runs in the foreground (--daemon: in the background once
mounted); prints "dlfs: mounted SOURCE at MOUNTPOINT" once the mount is
usable; SIGINT or SIGTERM unmounts and exits 0. SIGHUP opens --log-file
again; neither SIGHUP nor a closed stdout or stderr stops the mount.

MOUNTPOINT/.dlfs/ (never listed) holds:
  stats       JSON: served bytes per tier, PFS traffic, caches, prefetch, jobs
  stats.prom  the same figures in Prometheus text format
  control     write "refresh", a job line (key=value ...), "end job=NAME" or
              a DataLoader's "report ...";
              read it for the jobs and the last error
  jobs/JOB/rank-R/epoch-E   the predicted read order of a rank
  jobs/JOB/rank-R/advice    JSON: the DataLoader workers and prefetch_factor
                            advised for a rank that reports (dlfs.DataLoader)`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := o.config(args[0], args[1])
			if err != nil {
				return err
			}
			return run(cmd, cfg, o)
		},
	}
	f := cmd.Flags()
	f.Var(&o.ramCache, "ram-cache", "RAM tier size (e.g. 512MiB, 4GiB; 0 disables)")
	f.StringVar(&o.ssdCache, "ssd-cache", "", "directory of the persistent SSD tier (off when empty)")
	f.Var(&o.ssdCacheSize, "ssd-cache-size", "SSD tier size")
	f.StringVar(&o.datasetID, "dataset-id", "", "name the dataset alike on every host (e.g. imagenet-2012); by default its identity is drawn from its 32 oldest files' paths, sizes, mtimes and ctimes. Nodes share samples only within one dataset")
	f.BoolVar(&o.allowOther, "allow-other", false, "let other users access the mount, as SOURCE's modes and owners allow")
	f.BoolVar(&o.allowNonEmpty, "allow-non-empty", false, "mount over a MOUNTPOINT that is not empty, hiding what it holds (refused by default)")
	f.BoolVar(&o.listingAttrs, "listing-attrs", false, "answer every directory listing with attributes (READDIRPLUS): faster ls -l, find and du, slower plain listings such as ImageFolder's")
	f.IntVar(&o.maxFiles, "max-files", defaultMaxFiles(), "the most files and directories (or packed samples) SOURCE may hold; each costs about 120 bytes of RAM in the catalog (default: as many as an eighth of this machine's memory holds)")
	f.StringVar(&o.controlGroup, "control-group", "", "a group (name or id) whose members may write the control file too; by default only the mounting user may")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.logFormat, "log-format", "text", "text (key=value) or json (one object a line, the mounted line and a fatal error too)")
	f.StringVar(&o.logFile, "log-file", "", "append the log to this file instead of stderr, opened again on SIGHUP (for logrotate)")
	f.BoolVar(&o.daemon, "daemon", false, "run in the background once mounted: exit 0 when the mount is usable, or with the mount's error and status (give --log-file: the daemon's later output goes nowhere)")
	f.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus /metrics on HOST:PORT (off when empty)")
	f.StringVar(&o.controlName, "control-name", def.ControlName, "name of the hidden control directory at the root")
	f.StringVar(&o.nodeName, "node-name", "", "name of this node in stats (default: host name)")
	f.DurationVar(&o.ttl, "cache-ttl", def.CacheTTL, "how long the kernel caches names and attributes")
	f.IntVar(&o.pfWorkers, "prefetch-workers", def.PrefetchWorkers, "fetches in flight ahead of announced jobs")
	f.Var(&o.staging, "staging", "memory for fetched samples not yet read: the prefetcher's, and read-ahead's quarter")
	f.Var(&o.readAhead, "read-ahead", "bytes fetched ahead of one reader moving forward through a file (at most a quarter of --staging; 0 turns read-ahead off)")
	f.StringVar(&o.ramEviction, "ram-eviction", "belady", "RAM tier eviction: belady (by next use, when jobs are announced) or lru")
	f.StringVar(&o.bind, "bind", "", "gossip on HOST:PORT (default: none; with --join, 0.0.0.0:7946)")
	f.StringVar(&o.advertise, "advertise", "", "HOST:PORT the other nodes reach this one's gossip on (default --bind)")
	f.StringSliceVar(&o.join, "join", nil, "HOST:PORT of cluster members to join (comma list); none: a cluster of one")
	f.StringVar(&o.dataAddr, "data-addr", "", "HOST:PORT of this node's peer data transport, advertised to the cluster")
	f.StringVar(&o.keyFile, "cluster-key-file", "", "file holding the cluster key (16, 24 or 32 bytes, raw or base64); authenticates and encrypts gossip and the data port; required with --bind, --join or --data-addr")
	f.BoolVar(&o.insecure, "insecure", false, "let --bind, --join and --data-addr run without a cluster key: anyone who reaches the ports can join and read (a network only trusted nodes reach)")
	f.BoolVar(&o.warmup, "warmup", false, "after mounting, fetch the whole dataset into the caches if they can hold it (see dlfs warmup)")
	f.BoolVar(&o.infer, "infer", true, "infer the jobs of readers that announce none (sequential and strided scans) and prefetch for them")
	f.StringVar(&o.placement, "placement", "demand", "cluster placement: demand (each sample on the node whose ranks read it most, from the gossiped jobs) or hash")
	f.IntVar(&o.placeEpochs, "placement-epochs", def.PlacementEpochs, "epochs of each job, from its first, that demand placement counts reads over")
	f.Float64Var(&o.pfsMargin, "pfs-margin", 0, "read the PFS instead of a peer's copy that the model expects to be this many times slower; 0 never")
	f.DurationVar(&o.pfsTimeout, "pfs-timeout", def.PFSTimeout, "how long a read of SOURCE may take before the reader gets ETIMEDOUT (a PFS that stops answering)")
	f.DurationVar(&o.stopTimeout, "stop-timeout", 30*time.Second, "how long unmounting on SIGTERM may take before dlfs detaches the mount lazily and exits 1 (a second SIGTERM does so at once)")
	f.BoolVar(&o.latency, "latency-histograms", true, "keep latency histograms (reads by source, FUSE requests by operation, peer requests by member) in stats and metrics")
	f.BoolVar(&o.push, "push", true, "write prefetched samples into the kernel's page cache ahead of their reads, so a read costs no round trip to dlfs")
	f.StringVar(&o.passthrough, "passthrough", "auto", "let the kernel read files held whole in RAM from sealed backing files (FUSE passthrough: Linux 6.9+, the daemon as root): auto (for a dataset whose files average 1 MiB or more, not with --allow-other), on or off")
	f.BoolVar(&o.ptFromSSD, "passthrough-ssd", false, "with passthrough, copy a file only the SSD tier holds into a backing file at its open (measured 1.1-1.35x as fast as reading it through dlfs for 32 MiB files; off by default)")
	f.BoolVar(&o.coalesce, "coalesce", true, "read neighbouring samples of a packed SOURCE in one request when the PFS model says it is cheaper")
	f.StringVar(&o.allocation, "allocation", string(def.AllocationMode), "how DataLoader workers and prefetching are shared between jobs: need (workers by each reporting job's measured model and loading costs, fetches to the job that needs its next sample soonest) or even (equal workers, every job as many samples ahead)")
	f.IntVar(&o.loaderCPUs, "loader-cpus", def.LoaderCPUs, "CPUs for the DataLoaders on this node: the most workers advised in total")
	f.DurationVar(&o.jobIdle, "job-idle", def.JobIdle, "a reporting job none of whose ranks reported, or read through dlfs, for this long has ended, and its workers go to the others")
	f.BoolVar(&o.debugFUSE, "debug-fuse", false, "log every FUSE request")
	f.StringVar(&o.cpuProfile, "cpu-profile", "", "write a Go CPU profile to this file until unmount")
	_ = f.MarkHidden("cpu-profile")
	f.StringVar(&o.pprofAddr, "pprof-addr", "", "serve Go's net/http/pprof profiles on this loopback HOST:PORT, for finding where memory and CPU go")
	_ = f.MarkHidden("pprof-addr")
	return cmd, o
}

// config turns the flags into the daemon's Config. It checks what the
// flags alone say; daemon.Config.Validate checks the rest, against this
// host.
func (o *mountOptions) config(source, mountpoint string) (daemon.Config, error) {
	cfg := daemon.DefaultConfig(source, mountpoint)
	cfg.AllowNonEmpty = o.allowNonEmpty
	cfg.RAMCache = int64(o.ramCache)
	cfg.SSDDir = o.ssdCache
	cfg.SSDCapacity = int64(o.ssdCacheSize)
	cfg.DatasetID = o.datasetID
	cfg.AllowOther = o.allowOther
	cfg.ListingAttrs = o.listingAttrs
	if o.maxFiles <= 0 {
		return cfg, fmt.Errorf("--max-files %d: want a positive number", o.maxFiles)
	}
	cfg.MaxEntries = o.maxFiles
	if o.controlGroup != "" {
		gid, err := lookupGroup(o.controlGroup)
		if err != nil {
			return cfg, err
		}
		cfg.Owner.Gid, cfg.GroupWrite = gid, true
	}
	cfg.ControlName = o.controlName
	cfg.CacheTTL = o.ttl
	cfg.DebugFUSE = o.debugFUSE
	cfg.MetricsAddr = o.metricsAddr
	cfg.NodeName = o.nodeName
	cfg.PrefetchWorkers = o.pfWorkers
	for flag, addrs := range map[string][]string{"--bind": {o.bind}, "--advertise": {o.advertise},
		"--join": o.join, "--data-addr": {o.dataAddr}, "--metrics-addr": {o.metricsAddr}} {
		for _, a := range addrs {
			if _, _, err := net.SplitHostPort(a); a != "" && err != nil {
				return cfg, fmt.Errorf("%s %q: want HOST:PORT", flag, a)
			}
		}
	}
	cfg.Bind, cfg.Advertise, cfg.Join = o.bind, o.advertise, o.join
	cfg.DataAddr = o.dataAddr
	cfg.KeyFile = o.keyFile   // daemon.Config.Validate checks its mode
	cfg.Insecure = o.insecure // the daemon refuses a cluster port without a key unless set
	switch o.ramEviction {
	case "belady":
	case "lru":
		cfg.RAMEvictLRU = true
	default:
		return cfg, fmt.Errorf("--ram-eviction %q: want belady or lru", o.ramEviction)
	}
	switch o.placement {
	case "demand":
	case "hash":
		cfg.HashPlacement = true
	default:
		return cfg, fmt.Errorf("--placement %q: want demand or hash", o.placement)
	}
	if o.placeEpochs < 1 || o.placeEpochs > 64 {
		return cfg, fmt.Errorf("--placement-epochs %d: want 1 to 64", o.placeEpochs)
	}
	cfg.PlacementEpochs = o.placeEpochs
	cfg.NoInfer = !o.infer
	cfg.NoPush = !o.push
	cfg.Passthrough, cfg.PassthroughFromSSD = o.passthrough, o.ptFromSSD
	cfg.NoLatency = !o.latency
	cfg.Warmup = o.warmup
	cfg.NoCoalesce = !o.coalesce
	mode, err := allocator.ParseMode(o.allocation)
	if err != nil {
		return cfg, fmt.Errorf("--allocation: %w", err)
	}
	if o.loaderCPUs < 1 || o.loaderCPUs > 4096 {
		return cfg, fmt.Errorf("--loader-cpus %d: want 1 to 4096", o.loaderCPUs)
	}
	if o.jobIdle < time.Second {
		return cfg, fmt.Errorf("--job-idle %v: want at least 1s", o.jobIdle)
	}
	cfg.AllocationMode, cfg.LoaderCPUs, cfg.JobIdle = mode, o.loaderCPUs, o.jobIdle
	if o.pfsMargin < 0 {
		return cfg, fmt.Errorf("--pfs-margin %g: want 0 (never) or a factor above 1", o.pfsMargin)
	}
	cfg.PFSMargin = o.pfsMargin
	if o.pfsTimeout <= 0 {
		return cfg, fmt.Errorf("--pfs-timeout %v: want a positive duration, such as 1m", o.pfsTimeout)
	}
	cfg.PFSTimeout = o.pfsTimeout
	if o.stopTimeout <= 0 {
		return cfg, fmt.Errorf("--stop-timeout %v: want a positive duration, such as 30s", o.stopTimeout)
	}
	cfg.Staging = int64(o.staging)
	if o.pfWorkers <= 0 || o.pfWorkers > 4096 {
		return cfg, fmt.Errorf("--prefetch-workers %d: want 1 to 4096", o.pfWorkers)
	}
	if o.staging <= 0 {
		return cfg, fmt.Errorf("--staging must be positive")
	}
	cfg.ReadAhead, cfg.NoReadAhead = int64(o.readAhead), o.readAhead == 0
	if o.readAhead < 0 {
		return cfg, fmt.Errorf("--read-ahead %d: want a size such as 16MiB, or 0 to turn read-ahead off", o.readAhead)
	}
	if o.controlName == "" {
		return cfg, fmt.Errorf("--control-name is empty: give a plain file name, such as .dlfs")
	}
	return cfg, nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// runMount mounts, announces the mount, and serves until a signal or an
// external unmount; with --daemon it starts a daemon that does (see
// daemonize.go).
//
// A mount outlives its terminal and its pipes: SIGHUP (a closed SSH
// session or tmux pane, or logrotate) opens --log-file again, and SIGPIPE
// is taken too, so a write to a stdout or stderr whose reader is gone
// fails with EPIPE instead of killing the process (os/signal: "If the
// program is not calling Notify for SIGPIPE ... a write to a broken pipe
// on file descriptors 1 or 2 will cause the program to exit").
func runMount(cmd *cobra.Command, cfg daemon.Config, o *mountOptions) error {
	if o.daemon {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("--daemon: %w", err)
		}
		return runDaemon(exe, daemonArgs(os.Args[1:]), cmd.OutOrStdout(), cmd.ErrOrStderr())
	}
	// Never stopped: SIGPIPE must stay taken until the process exits,
	// which prints its error last.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGPIPE)
	var logw io.Writer = os.Stderr
	var lf *logFile
	if o.logFile != "" {
		var err error
		if lf, err = openLogFile(o.logFile); err != nil {
			return err
		}
		defer lf.Close()
		logw = lf
	}
	var err error
	if cfg.Logger, err = newLogger(logw, o.logLevel, o.logFormat); err != nil {
		return err
	}
	stopHangups := make(chan struct{})
	defer close(stopHangups)
	go takeHangups(sigs, stopHangups, lf, cfg.Logger)
	err = serveMount(cmd, cfg, o)
	if err != nil && lf != nil {
		cfg.Logger.Error("exiting", "err", err) // stderr gets it too (main)
	}
	return err
}

// takeHangups handles SIGHUP and SIGPIPE from sigs until stop closes:
// SIGHUP opens lf (if any) again, SIGPIPE is dropped (the write that
// raised it fails with EPIPE).
func takeHangups(sigs <-chan os.Signal, stop <-chan struct{}, lf *logFile, log *slog.Logger) {
	for {
		select {
		case <-stop:
			return
		case s := <-sigs:
			if s != syscall.SIGHUP {
				continue
			}
			if lf == nil {
				log.Info("SIGHUP received: no --log-file to open again; the mount goes on")
				continue
			}
			if err := lf.Reopen(); err != nil {
				log.Error("SIGHUP received: could not open the log file again; writing to the old one", "err", err)
				continue
			}
			log.Info("SIGHUP received: opened the log file again", "path", lf.path)
		}
	}
}

// announceMounted writes the mounted line to w, as a JSON record with
// --log-format json, and to the log file, if there is one.
func announceMounted(w io.Writer, cfg daemon.Config, o *mountOptions) {
	if o.logFormat == "json" {
		slog.New(slog.NewJSONHandler(w, nil)).Info("mounted", "source", printable(cfg.Source), "mountpoint", printable(cfg.Mountpoint))
	} else {
		fmt.Fprintf(w, "dlfs: mounted %s at %s\n", printable(cfg.Source), printable(cfg.Mountpoint))
	}
	if o.logFile != "" {
		cfg.Logger.Info("mounted", "source", cfg.Source, "mountpoint", cfg.Mountpoint)
	}
}

// serveMount is runMount's mount, once its logger is set.
func serveMount(cmd *cobra.Command, cfg daemon.Config, o *mountOptions) error {
	cfg.Registry = prometheus.NewRegistry()
	cfg.Registry.MustRegister(buildInfo())
	// The only files the daemon makes are the SSD cache's, copies of
	// SOURCE's files, some readable by their owners only: make them
	// private (Badger asks for 0666).
	syscall.Umask(0o077)
	if o.pprofAddr != "" {
		ln, err := net.Listen("tcp", o.pprofAddr)
		if err != nil {
			return fmt.Errorf("--pprof-addr: %w", err)
		}
		if a, ok := ln.Addr().(*net.TCPAddr); !ok || !a.IP.IsLoopback() {
			ln.Close()
			return fmt.Errorf("--pprof-addr %s: profiles are served on loopback only (127.0.0.1:PORT)", o.pprofAddr)
		}
		// Bounded like the metrics server, but a CPU profile may take
		// minutes to write (docs/operating.md: Bounds).
		srv, lim, err := netlimit.HTTPServer(ln, http.DefaultServeMux,
			netlimit.HTTPConfig{WriteTimeout: 5 * time.Minute, MaxConns: 8, MaxPerHost: 8}, "pprof", cfg.Logger)
		if err != nil {
			ln.Close()
			return fmt.Errorf("--pprof-addr: %w", err)
		}
		go srv.Serve(lim) // ends when the process does
		defer srv.Close()
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpu-profile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpu-profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A signal during the start cancels it; a start stuck in a call to a
	// PFS that stopped answering (which no context reaches) is given
	// --stop-timeout, then the process leaves it.
	started := make(chan struct{})
	go func() {
		select {
		case <-started:
		case <-ctx.Done():
			select {
			case <-started:
			case <-time.After(o.stopTimeout):
				err := fmt.Errorf("mount %s: stopped while SOURCE did not answer (--stop-timeout %s)", cfg.Source, o.stopTimeout)
				if o.logFile != "" {
					cfg.Logger.Error("exiting", "err", err)
				}
				printErrorAs(os.Stderr, err, o.logFormat)
				os.Exit(1)
			}
		}
	}()
	node, err := daemon.Start(ctx, cfg)
	close(started)
	if err != nil {
		return err
	}
	announceMounted(cmd.OutOrStdout(), cfg, o)
	notifyReady(ctx, cfg.Logger, cfg.Source, cfg.Mountpoint) // READY=1 to systemd (Type=notify) or the mount helper

	done := make(chan struct{})
	go func() {
		node.Wait()
		close(done)
	}()
	select {
	case <-ctx.Done():
		cfg.Logger.Info("signal received; unmounting", "mountpoint", cfg.Mountpoint)
	case <-done:
		cfg.Logger.Info("unmounted from outside", "mountpoint", cfg.Mountpoint)
	}
	return closeBounded(node, cfg, o.stopTimeout)
}

// closeBounded closes node, unless that takes longer than limit or a
// second signal comes: then it detaches the mount lazily, so the kernel
// lets go of it once its last user does, and gives up on the rest (the
// process is about to exit).
func closeBounded(node interface{ Close() error }, cfg daemon.Config, limit time.Duration) error {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	closed := make(chan error, 1)
	go func() { closed <- node.Close() }() // abandoned at exit if it cannot end
	timer := time.NewTimer(limit)
	defer timer.Stop()
	var why string
	select {
	case err := <-closed:
		return err
	case <-sigs:
		why = "a second signal came"
	case <-timer.C:
		why = fmt.Sprintf("it took longer than --stop-timeout %s", limit)
	}
	cfg.Logger.Error("could not unmount cleanly; detaching the mount and exiting", "mountpoint", cfg.Mountpoint, "why", why)
	if err := fusefs.Unmount(cfg.Mountpoint, true); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount %s: %s, and detaching it failed: %w", cfg.Mountpoint, why, err)
	}
	return fmt.Errorf("unmount %s: %s; detached it lazily", cfg.Mountpoint, why)
}

// unwrapPath turns *PathError into its bare cause, since the path is
// already in the message.
func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// lookupGroup resolves a group name or numeric id.
// catalogEntryBytes is what the catalog keeps per file (measured at
// 1 M files: 120 bytes; see catalog's TestMemoryPerEntry).
const catalogEntryBytes = 128

// defaultMaxFiles sizes --max-files from the machine's memory: an eighth
// of it for the catalog, at least a million files.
func defaultMaxFiles() int {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return catalog.DefaultMaxEntries
	}
	total := uint64(si.Totalram) * uint64(si.Unit)
	return int(min(max(total/8/catalogEntryBytes, 1<<20), 1<<31-1))
}

func lookupGroup(name string) (uint32, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		if g, err = user.LookupGroupId(name); err != nil {
			return 0, fmt.Errorf("--control-group %s: no such group", name)
		}
	}
	gid, err := strconv.ParseUint(g.Gid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("--control-group %s: group id %q is not a number", name, g.Gid)
	}
	return uint32(gid), nil
}
