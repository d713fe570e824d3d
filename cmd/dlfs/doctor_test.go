package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlfs/dlfs/daemon"
)

// fakeEnv is a machine with a working FUSE device (/dev/null stands in),
// memory to spare, free ports and members that answer.
func fakeEnv(t *testing.T) doctorEnv {
	dir := t.TempDir()
	meminfo := filepath.Join(dir, "meminfo")
	if err := os.WriteFile(meminfo, []byte("MemTotal: 16777216 kB\nMemAvailable: 8388608 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return doctorEnv{
		host: daemon.Host{
			FUSEDev: "/dev/null", FUSEConf: filepath.Join(dir, "fuse.conf"), Meminfo: meminfo, Release: "6.1.0-28-amd64",
			LookPath:  func(string) (string, error) { return "/usr/bin/fusermount3", nil },
			ListenTCP: func(string) error { return nil }, ListenUDP: func(string) error { return nil },
		},
		dialTCP: func(string) error { return nil },
	}
}

// find returns the check about what, failing the test if there is none.
func find(t *testing.T, checks []daemon.Check, what string) daemon.Check {
	t.Helper()
	for _, c := range checks {
		if c.What == what {
			return c
		}
	}
	t.Fatalf("no check of %s in %v", what, checks)
	return daemon.Check{}
}

// doctorConfig builds the Config dlfs mount would from args (flags,
// SOURCE, MOUNTPOINT), as doctor does.
func doctorConfig(t *testing.T, args ...string) daemon.Config {
	t.Helper()
	mount, o := mountCommand(runMount)
	if err := mount.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	pos := append(mount.Flags().Args(), "", "")
	cfg, err := o.config(pos[0], pos[1])
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestDoctorAgreesWithMount: doctor makes the mount's own checks, on the
// Config the mount's flags make: a cache directory made by mkdir -p
// (0755), which the mount makes 0700, passes; a key others may read fails
// it, as it fails the mount (daemon.Config.Validate).
func TestDoctorAgreesWithMount(t *testing.T) {
	env := fakeEnv(t)
	dir := t.TempDir()
	cache, key := filepath.Join(dir, "cache"), filepath.Join(dir, "key")
	os.Mkdir(cache, 0o755)
	os.Chmod(cache, 0o755)
	if err := os.WriteFile(key, []byte("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	src, mnt := t.TempDir(), t.TempDir()
	args := []string{"--ram-cache", "1GiB", "--ssd-cache", cache, "--ssd-cache-size", "64MiB", "--cluster-key-file", key,
		"--bind", "127.0.0.1:7946", src, mnt}
	checks := runDoctor(env, doctorConfig(t, args...))
	var out bytes.Buffer
	if failed := printChecks(&out, checks); failed != 0 {
		t.Errorf("a sound mount: %d failed\n%s", failed, &out)
	}
	for _, what := range []string{"--ssd-cache", "--cluster-key-file", "--bind", "addresses", "MOUNTPOINT", "SOURCE", "/dev/null", "kernel"} {
		if c := find(t, checks, what); c.Level != daemon.OK {
			t.Errorf("%s: %+v", what, c)
		}
	}
	if !strings.Contains(out.String(), "ok    --ssd-cache: "+cache+": writable, private") {
		t.Errorf("the cache line:\n%s", &out)
	}

	os.Chmod(key, 0o644)
	cfg := doctorConfig(t, args...)
	if c := find(t, runDoctor(env, cfg), "--cluster-key-file"); c.Level != daemon.Fail || !strings.Contains(c.Detail, "chmod 600 "+key) {
		t.Errorf("a key others may read: %+v", c)
	}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "chmod 600 "+key) {
		t.Errorf("the mount's Validate of a key others may read: %v", err)
	}
}

// TestDoctorMountpoint: no MOUNTPOINT gets mkdir -p; one that is not
// empty is refused unless --allow-non-empty.
func TestDoctorMountpoint(t *testing.T) {
	env := fakeEnv(t)
	src, mnt := t.TempDir(), t.TempDir()
	none := filepath.Join(t.TempDir(), "none")
	if c := find(t, runDoctor(env, doctorConfig(t, src, none)), "MOUNTPOINT"); c.Level != daemon.Fail || !strings.Contains(c.Detail, "mkdir -p "+none) {
		t.Errorf("a missing mount point: %+v", c)
	}
	os.WriteFile(filepath.Join(mnt, "x"), nil, 0o644)
	if c := find(t, runDoctor(env, doctorConfig(t, src, mnt)), "MOUNTPOINT"); c.Level != daemon.Fail || !strings.Contains(c.Detail, "--allow-non-empty") {
		t.Errorf("a mount point that is not empty: %+v", c)
	}
	if c := find(t, runDoctor(env, doctorConfig(t, "--allow-non-empty", src, mnt)), "MOUNTPOINT"); c.Level != daemon.OK {
		t.Errorf("not empty, with --allow-non-empty: %+v", c)
	}
	for _, c := range runDoctor(env, doctorConfig(t)) {
		if c.What == "MOUNTPOINT" || c.What == "SOURCE" {
			t.Errorf("checked %s without arguments: %+v", c.What, c)
		}
	}
}
