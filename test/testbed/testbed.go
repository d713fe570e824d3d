// Package testbed runs emulated hosts on one machine, for the cluster's
// integration tests and benchmarks.
//
// Each host has a network namespace of its own, joined to the bed's
// bridge by a veth pair, with an address on the bed's network and,
// optionally, a bandwidth cap each way (tc tbf on both ends of the pair).
// It has a mount namespace of its own too, held by a process that sleeps
// until the host is stopped: what a host mounts (its PFS client, its dlfs)
// only it sees, at paths of its own, and its /etc/hosts is the bed's, so
// that a DNS name can resolve to several hosts. Commands run inside both
// namespaces (Host.Command, through nsenter); the test reads a host's
// files from outside through /proc/PID/root (Host.Path).
//
// Names are prefixed with the bed's id, so beds run side by side. An id
// is claimed by creating its state file (stateDir/ID, holding the owner's
// pid) with O_EXCL, under an exclusive lock on stateDir/.lock that Sweep
// takes too: two beds never share an id, an id whose names a bed left
// behind is not claimed again, and a sweep never removes a bed that is
// being built. A bed removes only what it created itself, so a New that
// fails half-way leaves every other bed alone. Close removes everything
// it created; a bed whose test process died without closing it (a test
// binary killed at its timeout) is removed by the next New, which finds
// its owner's pid gone. Set-up needs root and iproute2's ip and tc,
// util-linux's unshare and nsenter, and nftables' nft for DropPort
// (scripts/install-deps.sh).
package testbed

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Config says what bed to build.
type Config struct {
	Hosts int    // at the start; AddHost adds more; 1 to MaxHosts
	Dir   string // each host's files go under Dir/NAME; required
	// Bandwidth caps each host's link, each way, in bits per second
	// (0: unlimited). Host.SetBandwidth changes one.
	Bandwidth int64
}

// MaxHosts bounds a bed: its hosts' addresses are one /24.
const MaxHosts = 200

// Network is the hosts' network; host i (from 0) has address .(i+10).
const Network = "10.77.0.0/24"

// stateDir records each bed's owner, so that a later New removes the
// beds of dead processes.
const stateDir = "/run/dlfs-testbed"

// Bed is a set of emulated hosts on one bridge.
type Bed struct {
	cfg    Config
	id     string // 4 hex digits: names are "dt" + id + ...
	bridge string
	hosts  string // the bed's /etc/hosts

	// What New created, and so what Close removes (set before New
	// returns, read-only after).
	ownState  bool // stateDir/id
	ownBridge bool

	mu    sync.Mutex
	all   []*Host // every host ever added, stopped ones too
	alias map[string][]int
}

// Host is one emulated host.
type Host struct {
	Name string // h00, h01, ...
	Addr string // its address on the bed's network
	Dir  string // Config.Dir/Name: its files

	bed    *Bed
	index  int
	netns  string
	veth   string // the root namespace's end of its link
	holder *exec.Cmd
	gone   chan struct{} // closed once the holder has exited

	mu      sync.Mutex
	procs   []*exec.Cmd // started with Command, killed by Stop
	stopped bool
	// What AddHost created, and so what Stop removes.
	ownNetns, ownVeth bool
}

// New builds a bed of cfg.Hosts hosts.
func New(cfg Config) (_ *Bed, err error) {
	if cfg.Hosts < 1 || cfg.Hosts > MaxHosts {
		return nil, fmt.Errorf("testbed: %d hosts: want 1 to %d", cfg.Hosts, MaxHosts)
	}
	if cfg.Dir == "" {
		return nil, errors.New("testbed: no Dir")
	}
	for _, tool := range []string{"ip", "tc", "unshare", "nsenter", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("testbed: %s not found: run scripts/install-deps.sh: %w", tool, err)
		}
	}
	b := &Bed{cfg: cfg, alias: map[string][]int{}}
	b.hosts = filepath.Join(cfg.Dir, "hosts")
	if err := b.claim(); err != nil {
		return nil, err
	}
	b.bridge = "dt" + b.id + "br"
	defer func() {
		if err != nil {
			b.Close()
		}
	}()
	if err := run("ip", "link", "add", b.bridge, "type", "bridge"); err != nil {
		return nil, err
	}
	b.ownBridge = true
	if err := run("ip", "link", "set", b.bridge, "up"); err != nil {
		return nil, err
	}
	for range cfg.Hosts {
		if _, err := b.AddHost(); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// newID draws a candidate bed id (a variable so that a test can make
// ids collide).
var newID = func() string { return fmt.Sprintf("%04x", rand.IntN(1<<16)) }

// claim sweeps dead beds and claims an id no other bed holds or left
// names behind under, all under the state directory's lock.
func (b *Bed) claim() error {
	unlock, err := lockState()
	if err != nil {
		return err
	}
	defer unlock()
	sweepLocked()
	for range 1000 {
		id := newID()
		if leftovers(id) {
			continue
		}
		f, err := os.OpenFile(filepath.Join(stateDir, id), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, os.ErrExist) {
			continue // another bed's
		}
		if err != nil {
			return fmt.Errorf("testbed: claim a bed id: %w", err)
		}
		b.id, b.ownState = id, true
		_, err = f.WriteString(strconv.Itoa(os.Getpid()))
		if err = errors.Join(err, f.Close()); err != nil {
			os.Remove(f.Name())
			return fmt.Errorf("testbed: claim a bed id: %w", err)
		}
		return nil
	}
	return fmt.Errorf("testbed: no free bed id in 1000 draws: remove the stale beds' files in %s", stateDir)
}

// lockState takes the state directory's exclusive lock; the kernel drops
// it if the process dies.
func lockState() (unlock func(), err error) {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, fmt.Errorf("testbed: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(stateDir, lockName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testbed: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("testbed: lock %s: %w", f.Name(), err)
	}
	return func() { f.Close() }, nil
}

// lockName is the state directory's lock file, never a bed id.
const lockName = ".lock"

// leftovers reports whether a bridge, link or network namespace named
// for id exists (left by a bed whose state file is gone).
func leftovers(id string) bool {
	if linkExists("dt" + id + "br") {
		return true
	}
	links, _ := os.ReadDir("/sys/class/net")
	for _, l := range links {
		if strings.HasPrefix(l.Name(), "dt"+id) {
			return true
		}
	}
	return len(netnsOf(id)) > 0
}

// netnsOf lists the network namespaces named for bed id.
func netnsOf(id string) []string {
	out, _ := exec.Command("ip", "netns", "list").Output()
	var ns []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "dt"+id+"-") {
			ns = append(ns, f[0])
		}
	}
	return ns
}

// Hosts returns the hosts not stopped, in the order added.
func (b *Bed) Hosts() []*Host {
	b.mu.Lock()
	defer b.mu.Unlock()
	var hs []*Host
	for _, h := range b.all {
		if !h.isStopped() {
			hs = append(hs, h)
		}
	}
	return hs
}

// AddHost starts one more host.
func (b *Bed) AddHost() (_ *Host, err error) {
	b.mu.Lock()
	i := len(b.all)
	if i >= MaxHosts {
		b.mu.Unlock()
		return nil, fmt.Errorf("testbed: already %d hosts", i)
	}
	h := &Host{bed: b, index: i, Name: fmt.Sprintf("h%02d", i), Addr: fmt.Sprintf("10.77.0.%d", i+10)}
	h.Dir = filepath.Join(b.cfg.Dir, h.Name)
	h.netns = fmt.Sprintf("dt%s-%s", b.id, h.Name)
	h.veth = fmt.Sprintf("dt%sv%d", b.id, i)
	b.all = append(b.all, h)
	b.mu.Unlock()
	defer func() {
		if err != nil {
			h.Stop()
		}
	}()
	if err := os.MkdirAll(h.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("testbed: %w", err)
	}
	if err := b.writeHosts(); err != nil {
		return nil, err
	}
	steps := [][]string{
		{"ip", "netns", "add", h.netns},
		{"ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.netns},
		{"ip", "link", "set", h.veth, "master", b.bridge, "up"},
		{"ip", "-n", h.netns, "addr", "add", h.Addr + "/24", "dev", "eth0"},
		{"ip", "-n", h.netns, "link", "set", "eth0", "up"},
		{"ip", "-n", h.netns, "link", "set", "lo", "up"},
	}
	for i, s := range steps {
		if err := run(s[0], s[1:]...); err != nil {
			return nil, err
		}
		switch i {
		case 0:
			h.ownNetns = true
		case 1:
			h.ownVeth = true
		}
	}
	if err := h.SetBandwidth(b.cfg.Bandwidth); err != nil {
		return nil, err
	}
	// The holder: a process in the host's network namespace and in a
	// mount namespace of its own, with the bed's /etc/hosts.
	h.holder = exec.Command("ip", "netns", "exec", h.netns, "unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", `mount --bind "$1" /etc/hosts && exec sleep infinity`, "holder", b.hosts)
	h.holder.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr strings.Builder
	h.holder.Stderr = &stderr
	if err := h.holder.Start(); err != nil {
		return nil, fmt.Errorf("testbed: %s: start its namespace holder: %w", h.Name, err)
	}
	h.gone = make(chan struct{})
	go func() { h.holder.Wait(); close(h.gone) }()
	// Ready once its /etc/hosts is the bed's.
	want, _ := os.Stat(b.hosts)
	if err := poll(func() (bool, error) {
		select {
		case <-h.gone:
			return false, fmt.Errorf("testbed: %s: namespace holder exited: %s", h.Name, stderr.String())
		default:
		}
		got, err := os.Stat(h.Path("/etc/hosts"))
		return err == nil && os.SameFile(got, want), nil
	}); err != nil {
		return nil, err
	}
	return h, nil
}

// Alias makes name resolve, in every host's /etc/hosts, to the addresses
// of the hosts given (a DNS name with several addresses, such as a
// Kubernetes headless Service).
func (b *Bed) Alias(name string, hosts ...*Host) error {
	b.mu.Lock()
	b.alias[name] = nil
	for _, h := range hosts {
		b.alias[name] = append(b.alias[name], h.index)
	}
	b.mu.Unlock()
	return b.writeHosts()
}

// writeHosts rewrites the bed's hosts file in place (the hosts bind-mount
// its inode).
func (b *Bed) writeHosts() error {
	b.mu.Lock()
	var s strings.Builder
	s.WriteString("127.0.0.1 localhost\n")
	for _, h := range b.all {
		fmt.Fprintf(&s, "%s %s\n", h.Addr, h.Name)
	}
	for name, is := range b.alias {
		for _, i := range is {
			fmt.Fprintf(&s, "%s %s\n", b.all[i].Addr, name)
		}
	}
	b.mu.Unlock()
	f, err := os.OpenFile(b.hosts, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err == nil {
		_, err = f.WriteString(s.String())
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		return fmt.Errorf("testbed: hosts file: %w", err)
	}
	return nil
}

// Close stops every host and removes the bridge.
func (b *Bed) Close() error {
	b.mu.Lock()
	all := append([]*Host(nil), b.all...)
	b.mu.Unlock()
	var errs []error
	for _, h := range all {
		errs = append(errs, h.Stop())
	}
	if b.ownBridge && linkExists(b.bridge) {
		errs = append(errs, run("ip", "link", "del", b.bridge))
	}
	if b.ownState {
		os.Remove(filepath.Join(stateDir, b.id))
	}
	return errors.Join(errs...)
}

// Command returns a command that runs inside the host's namespaces. Stop
// kills it if it is still running.
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	pid := "0"
	if h.holder != nil && h.holder.Process != nil {
		pid = strconv.Itoa(h.holder.Process.Pid)
	}
	cmd := exec.Command("nsenter", append([]string{"-t", pid, "-m", "-n", "--", name}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	h.mu.Lock()
	h.procs = append(h.procs, cmd)
	h.mu.Unlock()
	return cmd
}

// Path is where the host's path p is seen from outside its mount
// namespace.
func (h *Host) Path(p string) string {
	return fmt.Sprintf("/proc/%d/root%s", h.holder.Process.Pid, p)
}

// MountInfo is the mountinfo file of the host's mount namespace.
func (h *Host) MountInfo() string { return fmt.Sprintf("/proc/%d/mountinfo", h.holder.Process.Pid) }

// SetBandwidth caps the host's link at bits per second each way (0
// removes the cap).
func (h *Host) SetBandwidth(bits int64) error {
	for _, dev := range [][]string{{h.veth}, {"-n", h.netns, "eth0"}} {
		args := append(append([]string{}, dev[:len(dev)-1]...), "qdisc", "del", "dev", dev[len(dev)-1], "root")
		_ = exec.Command("tc", args...).Run() // none there yet is fine
		if bits <= 0 {
			continue
		}
		// A burst of at least a GSO packet (64 KiB) and 20 ms of the
		// rate: tbf drops a packet larger than its burst.
		burst := max(bits/8/50, 128<<10)
		args = append(append([]string{}, dev[:len(dev)-1]...), "qdisc", "add", "dev", dev[len(dev)-1], "root", "tbf",
			"rate", strconv.FormatInt(bits, 10)+"bit", "burst", strconv.FormatInt(burst, 10), "latency", "200ms")
		if err := run("tc", args...); err != nil {
			return err
		}
	}
	return nil
}

// DropPort makes the host drop every TCP packet that arrives for port, as
// a firewall would: the host's other ports still answer. (tc has no drop
// action in this kernel; nftables does.)
func (h *Host) DropPort(port int) error {
	ruleset := fmt.Sprintf("table inet dlfs_testbed {\n chain input {\n  type filter hook input priority 0; policy accept;\n  tcp dport %d drop\n }\n}\n", port)
	cmd := exec.Command("ip", "netns", "exec", h.netns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("testbed: %s: drop port %d: %v: %s", h.Name, port, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// LinkDown cuts the host off the bed's network; LinkUp restores it.
func (h *Host) LinkDown() error { return run("ip", "link", "set", h.veth, "down") }

// LinkUp restores a link LinkDown cut.
func (h *Host) LinkUp() error { return run("ip", "link", "set", h.veth, "up") }

// Stop kills the host's processes (SIGKILL: a host that dies) and removes
// its namespaces. Its files stay.
func (h *Host) Stop() error {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return nil
	}
	h.stopped = true
	procs := h.procs
	h.mu.Unlock()
	for _, c := range procs {
		if c.Process != nil && c.ProcessState == nil {
			c.Process.Kill()
		}
	}
	if h.gone != nil {
		h.holder.Process.Kill()
		<-h.gone
	}
	var errs []error
	if h.ownVeth && linkExists(h.veth) {
		errs = append(errs, run("ip", "link", "del", h.veth)) // its peer goes with it
	}
	if h.ownNetns && nsExists(h.netns) {
		errs = append(errs, run("ip", "netns", "del", h.netns))
	}
	return errors.Join(errs...)
}

func (h *Host) isStopped() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stopped
}

// Sweep removes the beds whose owning process is gone.
func Sweep() {
	unlock, err := lockState()
	if err != nil {
		return
	}
	defer unlock()
	sweepLocked()
}

// sweepLocked is Sweep, under the state directory's lock.
func sweepLocked() {
	ents, _ := os.ReadDir(stateDir)
	for _, e := range ents {
		id := e.Name()
		if id == lockName {
			continue
		}
		b, err := os.ReadFile(filepath.Join(stateDir, id))
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && syscall.Kill(pid, 0) == nil {
			continue // its owner runs
		}
		for _, ns := range netnsOf(id) {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
		_ = exec.Command("ip", "link", "del", "dt"+id+"br").Run()
		os.Remove(filepath.Join(stateDir, id))
	}
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("testbed: %s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func linkExists(name string) bool {
	_, err := os.Stat("/sys/class/net/" + name)
	return err == nil
}

func nsExists(name string) bool {
	_, err := os.Stat("/run/netns/" + name)
	return err == nil
}

// poll calls f until it reports done or an error, for up to a minute.
func poll(f func() (bool, error)) error {
	deadline := time.Now().Add(time.Minute)
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		done, err := f()
		if done || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return errors.New("testbed: a host did not come up within a minute")
		}
		time.Sleep(wait)
	}
}
