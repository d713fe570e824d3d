package main

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// fakeEnv is a machine with a working FUSE device (/dev/null stands in)
// and nothing else to object to.
func fakeEnv(t *testing.T) doctorEnv {
	dir := t.TempDir()
	conf := filepath.Join(dir, "fuse.conf")
	meminfo := filepath.Join(dir, "meminfo")
	if err := os.WriteFile(meminfo, []byte("MemTotal: 8000000 kB\nMemAvailable: 4194304 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return doctorEnv{
		fuseDev: "/dev/null", fuseConf: conf, meminfo: meminfo, root: false, release: "6.1.0-28-amd64",
		lookPath:  func(string) (string, error) { return "/usr/bin/fusermount3", nil },
		listenTCP: func(string) error { return nil }, listenUDP: func(string) error { return nil },
		dialTCP: func(string) error { return nil },
	}
}

// find returns the check about what, failing the test if there is none.
func find(t *testing.T, checks []check, what string) check {
	t.Helper()
	for _, c := range checks {
		if c.what == what {
			return c
		}
	}
	t.Fatalf("no check of %s in %v", what, checks)
	return check{}
}

func TestDoctor(t *testing.T) {
	env := fakeEnv(t)
	o := doctorOptions{ramCache: 1 << 30}
	for _, c := range runDoctor(env, o, nil) {
		if c.level != "ok" {
			t.Errorf("a fine machine: %+v", c)
		}
	}

	for _, c := range []struct {
		name  string
		env   func(*doctorEnv)
		opts  func(*doctorOptions)
		what  string
		level string
		says  string
	}{
		{"no device", func(e *doctorEnv) { e.fuseDev = "/nonexistent/fuse" }, nil, "/nonexistent/fuse", "FAIL", "modprobe fuse"},
		{"device a regular file", func(e *doctorEnv) { e.fuseDev = e.meminfo }, nil, "", "FAIL", "mknod"},
		{"no helper", func(e *doctorEnv) {
			e.lookPath = func(string) (string, error) { return "", errors.New("not found") }
		}, nil, "mount", "FAIL", "apt install fuse3"},
		{"allow-other without user_allow_other", nil, func(o *doctorOptions) { o.allowOther = true }, "--allow-other", "FAIL", "user_allow_other"},
		{"old kernel", func(e *doctorEnv) { e.release = "4.15.0-200-generic" }, nil, "kernel", "FAIL", "4.19 or newer"},
		{"odd kernel", func(e *doctorEnv) { e.release = "weird" }, nil, "kernel", "warn", "4.19"},
		{"RAM tier beyond memory", nil, func(o *doctorOptions) { o.ramCache = 8 << 30 }, "--ram-cache", "warn", "lower --ram-cache"},
		{"port taken", func(e *doctorEnv) {
			e.listenTCP = func(string) error {
				return &net.OpError{Op: "listen", Err: os.NewSyscallError("bind", syscall.EADDRINUSE)}
			}
		}, func(o *doctorOptions) { o.metricsAddr = "127.0.0.1:9100" }, "--metrics-addr", "FAIL", "address already in use"},
		{"gossip without a key", nil, func(o *doctorOptions) { o.bind = "127.0.0.1:7946" }, "--cluster-key-file", "FAIL", "need a cluster key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, o := fakeEnv(t), doctorOptions{ramCache: 1 << 30}
			if c.env != nil {
				c.env(&e)
			}
			if c.opts != nil {
				c.opts(&o)
			}
			what := c.what
			if what == "" {
				what = e.fuseDev
			}
			got := find(t, runDoctor(e, o, nil), what)
			if got.level != c.level || !strings.Contains(got.detail, c.says) {
				t.Errorf("%+v: want %s saying %q", got, c.level, c.says)
			}
		})
	}

	// user_allow_other set; root needs none.
	if err := os.WriteFile(env.fuseConf, []byte("# comment\nuser_allow_other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c := find(t, runDoctor(env, doctorOptions{allowOther: true}, nil), "--allow-other"); c.level != "ok" {
		t.Errorf("with user_allow_other: %+v", c)
	}
}

func TestDoctorFiles(t *testing.T) {
	env := fakeEnv(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c := find(t, runDoctor(env, doctorOptions{keyFile: key}, nil), "--cluster-key-file"); c.level != "FAIL" || !strings.Contains(c.detail, "chmod 600") {
		t.Errorf("a key others may read: %+v", c)
	}
	os.Chmod(key, 0o600)
	if c := find(t, runDoctor(env, doctorOptions{keyFile: key}, nil), "--cluster-key-file"); c.level != "ok" {
		t.Errorf("a private key: %+v", c)
	}
	os.WriteFile(key, []byte("short"), 0o600)
	if c := find(t, runDoctor(env, doctorOptions{keyFile: key}, nil), "--cluster-key-file"); c.level != "FAIL" || !strings.Contains(c.detail, "16, 24 or 32 bytes") {
		t.Errorf("a bad key: %+v", c)
	}

	cache := filepath.Join(dir, "cache")
	if c := find(t, runDoctor(env, doctorOptions{ssdCache: cache, ssdCacheSize: 1 << 20}, nil), "--ssd-cache"); c.level != "ok" {
		t.Errorf("a cache dir the mount will make: %+v", c)
	}
	os.Mkdir(cache, 0o777)
	os.Chmod(cache, 0o777)
	if c := find(t, runDoctor(env, doctorOptions{ssdCache: cache, ssdCacheSize: 1 << 20}, nil), "--ssd-cache"); c.level != "FAIL" || !strings.Contains(c.detail, "chmod 700") {
		t.Errorf("a cache dir open to all: %+v", c)
	}
	os.Chmod(cache, 0o700)
	if c := find(t, runDoctor(env, doctorOptions{ssdCache: cache, ssdCacheSize: 1 << 60}, nil), "--ssd-cache"); c.level != "warn" || !strings.Contains(c.detail, "free") {
		t.Errorf("a cache bigger than the disk: %+v", c)
	}

	src, mnt := t.TempDir(), t.TempDir()
	checks := runDoctor(env, doctorOptions{}, []string{src, mnt})
	if find(t, checks, "SOURCE").level != "ok" || find(t, checks, "MOUNTPOINT").level != "ok" {
		t.Errorf("a source and an empty mountpoint: %v", checks)
	}
	checks = runDoctor(env, doctorOptions{}, []string{filepath.Join(dir, "none"), filepath.Join(dir, "nomnt")})
	if find(t, checks, "SOURCE").level != "FAIL" || !strings.Contains(find(t, checks, "MOUNTPOINT").detail, "mkdir -p") {
		t.Errorf("a missing source and mountpoint: %v", checks)
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
