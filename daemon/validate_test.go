package daemon

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/dlfs/dlfs/ssdstore"
)

// fakeHost is a machine with a working FUSE device (/dev/null stands in),
// 8 GiB of memory, 4 GiB available, and nothing else to object to.
func fakeHost(t *testing.T) Host {
	dir := t.TempDir()
	meminfo := filepath.Join(dir, "meminfo")
	if err := os.WriteFile(meminfo, []byte("MemTotal: 8388608 kB\nMemFree: 1 kB\nMemAvailable: 4194304 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return Host{
		FUSEDev: "/dev/null", FUSEConf: filepath.Join(dir, "fuse.conf"), Meminfo: meminfo, Release: "6.1.0-28-amd64",
		LookPath:  func(string) (string, error) { return "/usr/bin/fusermount3", nil },
		ListenTCP: func(string) error { return nil }, ListenUDP: func(string) error { return nil },
	}
}

// fineConfig serves an empty directory at another, with a RAM tier and
// staging that fit fakeHost.
func fineConfig(t *testing.T) Config {
	c := DefaultConfig(t.TempDir(), t.TempDir())
	c.RAMCache, c.Staging = 1<<30, 256<<20
	return c
}

// findCheck returns the check of what, failing the test if there is none.
func findCheck(t *testing.T, checks []Check, what string) Check {
	t.Helper()
	for _, c := range checks {
		if c.What == what {
			return c
		}
	}
	t.Fatalf("no check of %s in %v", what, checks)
	return Check{}
}

// TestCheck: a sound configuration on a sound host passes every check;
// each fault fails (or warns about) its own check, saying what to do.
func TestCheck(t *testing.T) {
	c := fineConfig(t)
	for _, ch := range c.Check(fakeHost(t)) {
		if ch.Level != OK {
			t.Errorf("a sound configuration: %+v", ch)
		}
	}
	taken := func(string) error {
		return &net.OpError{Op: "listen", Err: os.NewSyscallError("bind", syscall.EADDRINUSE)}
	}
	for _, tc := range []struct {
		name  string
		host  func(*Host)
		cfg   func(*Config)
		what  string
		level Level
		says  string
	}{
		{"no device", func(h *Host) { h.FUSEDev = "/nonexistent/fuse" }, nil, "/nonexistent/fuse", Fail, "modprobe fuse"},
		{"device a regular file", func(h *Host) { h.FUSEDev = h.Meminfo }, nil, "", Fail, "mknod"},
		{"no helper", func(h *Host) { h.LookPath = func(string) (string, error) { return "", errors.New("not found") } }, nil, "mount", Fail, "apt install fuse3"},
		{"allow-other without user_allow_other", nil, func(c *Config) { c.AllowOther = true }, "--allow-other", Fail, "user_allow_other"},
		{"old kernel", func(h *Host) { h.Release = "4.15.0-200-generic" }, nil, "kernel", Fail, "4.19 or newer"},
		{"odd kernel", func(h *Host) { h.Release = "weird" }, nil, "kernel", Warn, "4.19"},
		{"RAM tier beyond the host", nil, func(c *Config) { c.RAMCache = 64 << 30 }, "--ram-cache", Fail, "this host has 8.0 GiB in all"},
		{"RAM tier beyond the cgroup", func(h *Host) {
			f := filepath.Join(t.TempDir(), "memory.max")
			os.WriteFile(f, []byte("536870912\n"), 0o644)
			h.MemoryMax = []string{f}
		}, nil, "--ram-cache", Fail, "cgroup allows 512.0 MiB"},
		{"RAM tier beyond what is available", nil, func(c *Config) { c.RAMCache = 4 << 30 }, "--ram-cache", Warn, "lower --ram-cache"},
		{"metrics port taken", func(h *Host) { h.ListenTCP = taken }, func(c *Config) { c.MetricsAddr = "127.0.0.1:9100" }, "--metrics-addr", Fail, "address already in use"},
		{"gossip port taken", func(h *Host) { h.ListenUDP = taken }, func(c *Config) { c.Bind, c.Insecure = "127.0.0.1:7946", true }, "--bind", Fail, "address already in use"},
		{"data port taken", func(h *Host) { h.ListenTCP = taken }, func(c *Config) {
			c.Bind, c.DataAddr, c.Insecure = "127.0.0.1:7946", "127.0.0.1:7947", true
		}, "--data-addr", Fail, "address already in use"},
		{"gossip without a key", nil, func(c *Config) { c.Join = []string{"10.0.0.1:7946"} }, "--cluster-key-file", Fail, "no cluster key"},
		{"bad dataset id", nil, func(c *Config) { c.DatasetID = "two words" }, "--dataset-id", Fail, "imagenet-2012"},
		{"negative read-ahead", nil, func(c *Config) { c.ReadAhead = -1 }, "loader", Fail, "read-ahead bounds -1"},
		{"control name with a slash", nil, func(c *Config) { c.ControlName = "a/b" }, "--control-name", Fail, "plain file name"},
		{"SSD tier too small", nil, func(c *Config) { c.SSDDir, c.SSDCapacity = t.TempDir(), 1<<20 }, "--ssd-cache-size", Fail, "16 MiB"},
		{"SSD tier beyond the disk", nil, func(c *Config) { c.SSDDir, c.SSDCapacity = t.TempDir(), 1<<60 }, "--ssd-cache", Warn, "free"},
		{"no MOUNTPOINT", nil, func(c *Config) { c.Mountpoint = filepath.Join(t.TempDir(), "none") }, "MOUNTPOINT", Fail, "mkdir -p"},
		{"MOUNTPOINT a file", nil, func(c *Config) { c.Mountpoint = filepath.Join(c.Source, "f"); os.WriteFile(c.Mountpoint, nil, 0o644) }, "MOUNTPOINT", Fail, "not a directory"},
		{"no SOURCE", nil, func(c *Config) { c.Source = filepath.Join(t.TempDir(), "none") }, "SOURCE", Fail, "no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, c := fakeHost(t), fineConfig(t)
			if tc.host != nil {
				tc.host(&h)
			}
			if tc.cfg != nil {
				tc.cfg(&c)
			}
			what := tc.what
			if what == "" {
				what = h.FUSEDev
			}
			got := findCheck(t, c.Check(h), what)
			if got.Level != tc.level || !strings.Contains(got.Detail, tc.says) || strings.Contains(got.Detail, "\n") {
				t.Errorf("%+v: want %s saying %q", got, tc.level, tc.says)
			}
		})
	}

	// user_allow_other set; root needs none.
	h, c := fakeHost(t), fineConfig(t)
	c.AllowOther = true
	if err := os.WriteFile(h.FUSEConf, []byte("# comment\nuser_allow_other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ch := findCheck(t, c.Check(h), "--allow-other"); ch.Level != OK {
		t.Errorf("with user_allow_other: %+v", ch)
	}
}

// TestCheckKeyFile: a key file others may read fails, as a missing or
// malformed one does; a private one is read.
func TestCheckKeyFile(t *testing.T) {
	h, c := fakeHost(t), fineConfig(t)
	c.KeyFile = filepath.Join(t.TempDir(), "key")
	c.Bind = "127.0.0.1:7946"
	for _, tc := range []struct {
		data  string
		mode  os.FileMode
		level Level
		says  string
	}{
		{"", 0, Fail, "head -c 32 /dev/urandom"},
		{"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n", 0o644, Fail, "chmod 600"},
		{"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n", 0o640, Fail, "chmod 600"},
		{"short", 0o600, Fail, "16, 24 or 32 bytes"},
		{"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n", 0o400, OK, "a valid key"},
	} {
		os.Remove(c.KeyFile)
		if tc.mode != 0 {
			os.WriteFile(c.KeyFile, []byte(tc.data), tc.mode)
			os.Chmod(c.KeyFile, tc.mode)
		}
		if got := findCheck(t, c.Check(h), "--cluster-key-file"); got.Level != tc.level || !strings.Contains(got.Detail, tc.says) {
			t.Errorf("%q mode %04o: %+v, want %s saying %q", tc.data, tc.mode, got, tc.level, tc.says)
		}
	}
	if k, err := ReadKey(c.KeyFile); err != nil || string(k) != "0123456789abcdef0123456789abcdef" {
		t.Errorf("ReadKey: %q, %v", k, err)
	}
}

// TestCheckCacheDir: the mount makes the SSD cache directory 0700, so a
// directory made by mkdir -p (0755) passes; one any user may write, or
// another mount's (its lock held), fails.
func TestCheckCacheDir(t *testing.T) {
	h, c := fakeHost(t), fineConfig(t)
	c.SSDDir, c.SSDCapacity = filepath.Join(t.TempDir(), "cache"), 64<<20
	if ch := findCheck(t, c.Check(h), "--ssd-cache"); ch.Level != OK {
		t.Errorf("a directory the mount will make: %+v", ch)
	}
	os.Mkdir(c.SSDDir, 0o755)
	os.Chmod(c.SSDDir, 0o755)
	if ch := findCheck(t, c.Check(h), "--ssd-cache"); ch.Level != OK || !strings.Contains(ch.Detail, "makes it 0700") {
		t.Errorf("a directory made by mkdir -p: %+v", ch)
	}
	os.Chmod(c.SSDDir, 0o777)
	if ch := findCheck(t, c.Check(h), "--ssd-cache"); ch.Level != Fail || !strings.Contains(ch.Detail, "chmod 700") {
		t.Errorf("a directory any user may write: %+v", ch)
	}
	os.Chmod(c.SSDDir, 0o700)
	s, err := ssdstore.Open(ssdstore.Config{Dir: c.SSDDir, Capacity: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ch := findCheck(t, c.Check(h), "--ssd-cache"); ch.Level != Fail || !strings.Contains(ch.Detail, "another dlfs is using this cache") {
		t.Errorf("a cache another store holds: %+v", ch)
	}
}

// TestCheckMountpoint: a mount point that is not empty is refused unless
// AllowNonEmpty; a relative one is made absolute.
func TestCheckMountpoint(t *testing.T) {
	h, c := fakeHost(t), fineConfig(t)
	os.WriteFile(filepath.Join(c.Mountpoint, "left-over"), nil, 0o644)
	if ch := findCheck(t, c.Check(h), "MOUNTPOINT"); ch.Level != Fail || !strings.Contains(ch.Detail, "left-over") || !strings.Contains(ch.Detail, "--allow-non-empty") {
		t.Errorf("a mount point that is not empty: %+v", ch)
	}
	c.AllowNonEmpty = true
	if ch := findCheck(t, c.Check(h), "MOUNTPOINT"); ch.Level != OK {
		t.Errorf("not empty, with AllowNonEmpty: %+v", ch)
	}
	t.Chdir(filepath.Dir(c.Mountpoint))
	want := c.Mountpoint
	c.Mountpoint = filepath.Base(want)
	c.Check(h)
	if c.Mountpoint != want {
		t.Errorf("a relative mount point became %s, want %s", c.Mountpoint, want)
	}
}

// TestCheckSourceCanonical: SOURCE given relative, or through a link,
// becomes the one absolute path the saved catalog is bound to.
func TestCheckSourceCanonical(t *testing.T) {
	h, c := fakeHost(t), fineConfig(t)
	real, err := filepath.EvalSymlinks(c.Source)
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	t.Chdir(filepath.Dir(real))
	for _, given := range []string{filepath.Base(real), link, real + "/"} {
		c.Source = given
		if ch := findCheck(t, c.Check(h), "SOURCE"); ch.Level != OK || c.Source != real {
			t.Errorf("SOURCE %q: %+v, made %q, want %q", given, ch, c.Source, real)
		}
	}
}

// TestCheckSourceNesting: a SOURCE that holds MOUNTPOINT, lies inside it
// or is it, links resolved, is refused in one line; neighbours that only
// share a prefix are not.
func TestCheckSourceNesting(t *testing.T) {
	top, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"a/b", "a/x", "a/xy", "c"} {
		if err := os.MkdirAll(filepath.Join(top, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(top, "a"), filepath.Join(top, "link")); err != nil {
		t.Fatal(err)
	}
	p := func(s string) string { return filepath.Join(top, s) }
	for _, tc := range []struct {
		name, source, mountpoint, want string
	}{
		{"source holds mountpoint", p("a"), p("a/b"), "holds MOUNTPOINT"},
		{"mountpoint holds source", p("a/b"), p("a"), "lies inside MOUNTPOINT"},
		{"the same directory", p("a"), p("a"), "is MOUNTPOINT too"},
		{"through a link to source", p("link"), p("a/b"), "holds MOUNTPOINT"},
		{"through a link to mountpoint", p("a/b"), p("link"), "lies inside MOUNTPOINT"},
		{"a shared prefix", p("a/x"), p("a/xy"), ""},
		{"apart", p("a"), p("c"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fineConfig(t)
			c.Source, c.Mountpoint, c.AllowNonEmpty = tc.source, tc.mountpoint, true
			_, err := c.validate(fakeHost(t))
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n")):
				t.Errorf("got %v, want one line saying %q", err, tc.want)
			}
			ch := findCheck(t, c.Check(fakeHost(t)), "SOURCE") // dlfs doctor's view
			if (ch.Level == Fail) != (tc.want != "") {
				t.Errorf("doctor's SOURCE check: %+v", ch)
			}
		})
	}
}

// TestValidateBeforeSource: Validate refuses a configuration that cannot
// work without looking at SOURCE (which would be scanned next), and says
// every failure.
func TestValidateBeforeSource(t *testing.T) {
	c := fineConfig(t)
	c.Source = filepath.Join(t.TempDir(), "none")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c.MetricsAddr = l.Addr().String()
	c.SSDDir, c.SSDCapacity = t.TempDir(), 1<<20
	err = c.Validate()
	var ch Check
	if !errors.As(err, &ch) || !strings.Contains(err.Error(), "--metrics-addr") || !strings.Contains(err.Error(), "--ssd-cache-size") {
		t.Fatalf("Validate: %v", err)
	}
	if strings.Contains(err.Error(), "SOURCE") {
		t.Errorf("Validate looked at SOURCE after another check failed: %v", err)
	}
	c = fineConfig(t)
	c.Source = filepath.Join(t.TempDir(), "none")
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "SOURCE") {
		t.Errorf("a missing SOURCE: %v", err)
	}
	if err := (&Config{}).Validate(); err == nil {
		t.Error("no SOURCE and no MOUNTPOINT: valid")
	}
}

func TestKernelVersion(t *testing.T) {
	for _, c := range []struct {
		in           string
		major, minor int
		ok           bool
	}{{"6.18.0", 6, 18, true}, {"4.19.0-26-amd64", 4, 19, true}, {"5.4", 5, 4, true}, {"5.15rc1", 5, 15, true}, {"x", 0, 0, false}} {
		ma, mi, ok := kernelVersion(c.in)
		if ma != c.major || mi != c.minor || ok != c.ok {
			t.Errorf("%q: %d.%d %v", c.in, ma, mi, ok)
		}
	}
}

// TestCheckAddresses: Check says what the other hosts would be given, and
// fails, with what to set, an address that cannot work between hosts.
func TestCheckAddresses(t *testing.T) {
	type addrs struct {
		bind, advertise, data string
		join                  []string
	}
	for _, tc := range []struct {
		a     addrs
		level Level
		want  string
	}{
		{addrs{bind: "0.0.0.0:7946", advertise: "0.0.0.0:7946"}, Fail, "--advertise"},
		{addrs{bind: "0.0.0.0:7946", advertise: "10.0.0.5:7946", data: "127.0.0.1:7947"}, Fail, "--data-addr 10.0.0.5:7947 or 0.0.0.0:7947"},
		{addrs{bind: "127.0.0.1:7946", join: []string{"10.20.30.40:7946"}}, Fail, "--advertise"},
		{addrs{bind: "0.0.0.0:7946", advertise: "10.0.0.5:7946", data: "0.0.0.0:7947"}, OK, "10.0.0.5:7947"},
	} {
		c := fineConfig(t)
		c.Bind, c.Advertise, c.DataAddr, c.Join, c.Insecure = tc.a.bind, tc.a.advertise, tc.a.data, tc.a.join, true
		got := findCheck(t, c.Check(fakeHost(t)), "addresses")
		if got.Level != tc.level || !strings.Contains(got.Detail, tc.want) || strings.Contains(got.Detail, "\n") {
			t.Errorf("%+v: %s %s, want %s naming %q", tc.a, got.Level, got.Detail, tc.level, tc.want)
		}
	}
	alone := fineConfig(t)
	for _, ch := range alone.Check(fakeHost(t)) {
		if ch.What == "addresses" {
			t.Errorf("an address check without a cluster: %+v", ch)
		}
	}
}
