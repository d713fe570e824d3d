package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlfs/dlfs/daemon"
)

// mountSettings runs "dlfs mount" with args (after the config flags) and
// env, and returns the options and config it would have mounted with.
func mountSettings(t *testing.T, env map[string]string, args ...string) (*mountOptions, daemon.Config, error) {
	t.Helper()
	var got *mountOptions
	var cfg daemon.Config
	root := newRoot(func(cmd *cobra.Command, c daemon.Config, o *mountOptions) error {
		got, cfg = o, c
		return nil
	}, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	root.SetArgs(append(append([]string{"mount"}, args...), t.TempDir(), t.TempDir()))
	err := root.Execute()
	return got, cfg, err
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "dlfs.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConfigPrecedence: a flag on the command line wins over its DLFS_
// variable, which wins over the config file, which wins over the
// default; a command's section wins over the top level, and a list sets
// a list flag.
func TestConfigPrecedence(t *testing.T) {
	file := writeConfig(t, `# settings for every command
ram-cache: 2GiB
staging: 64MiB
pfs-timeout: 90s
join: [127.0.0.1:7946, 127.0.0.2:7946]
insecure: true
mount:
  staging: 128MiB
stats:
  interval: 5s
`)
	env := map[string]string{"DLFS_CONFIG": file, "DLFS_PFS_TIMEOUT": "2m", "DLFS_NODE_NAME": "n7", "DLFS_IT_READER": "1"}
	o, cfg, err := mountSettings(t, env, "--ram-cache", "1GiB")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"--ram-cache (flag over file)", cfg.RAMCache, int64(1 << 30)},
		{"--pfs-timeout (env over file)", cfg.PFSTimeout, 2 * time.Minute},
		{"--node-name (env)", cfg.NodeName, "n7"},
		{"--staging (mount section over top level)", cfg.Staging, int64(128 << 20)},
		{"--join (a list)", strings.Join(cfg.Join, ","), "127.0.0.1:7946,127.0.0.2:7946"},
		{"--insecure (file)", cfg.Insecure, true},
		{"--ssd-cache-size (default)", cfg.SSDCapacity, daemon.DefaultConfig("", "").SSDCapacity},
		{"--log-level (default)", o.logLevel, "info"},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
		}
	}
	// --config names the file over DLFS_CONFIG.
	other := writeConfig(t, "ram-cache: 3GiB\n")
	if _, cfg, err := mountSettings(t, env, "--config", other); err != nil || cfg.RAMCache != 3<<30 || cfg.Staging == 128<<20 {
		t.Errorf("--config %s: ram %d, staging %d, %v", other, cfg.RAMCache, cfg.Staging, err)
	}
}

// TestConfigErrors: a key that is no flag, a key outside its command's
// flags, a bad value and a missing file fail before the command runs,
// naming the file and line.
func TestConfigErrors(t *testing.T) {
	for _, c := range []struct {
		name, text string
		env        map[string]string
		want       string
	}{
		{"unknown key", "ram-cache: 1GiB\nram-cach: 2GiB\n", nil, `:2: unknown key "ram-cach": not a flag of any dlfs command`},
		{"not the command's", "stats:\n  ram-cache: 1GiB\n", nil, `:2: unknown key "ram-cache": not a flag of dlfs stats`},
		{"bad value", "\n\nram-cache: lots\n", nil, `:3: ram-cache "lots"`},
		{"no value", "ram-cache:\n", nil, `:1: ram-cache: no value`},
		{"twice", "push: false\npush: true\n", nil, `:2: push is set twice`},
		{"not settable", "config: other.yaml\n", nil, `:1: config cannot be set`},
		{"not a mapping", "- ram-cache\n", nil, `:1: want flag: value lines`},
		{"bad env", "", map[string]string{"DLFS_PUSH": "maybe"}, `DLFS_PUSH="maybe"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := writeConfig(t, c.text)
			env := map[string]string{"DLFS_CONFIG": file}
			for k, v := range c.env {
				env[k] = v
			}
			_, _, err := mountSettings(t, env)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
			if c.env == nil && !strings.Contains(err.Error(), file) {
				t.Errorf("the error does not name the file: %v", err)
			}
		})
	}
	if _, _, err := mountSettings(t, nil, "--config", "/nonexistent/dlfs.yaml"); err == nil || !strings.Contains(err.Error(), "/nonexistent/dlfs.yaml") {
		t.Errorf("a missing config file: %v", err)
	}
}

// TestEnvNames: a flag's variable is DLFS_ and its name in capitals, and
// commands other than mount take theirs too (stats --interval).
func TestEnvNames(t *testing.T) {
	if envName("ram-cache") != "DLFS_RAM_CACHE" || envName("cluster-key-file") != "DLFS_CLUSTER_KEY_FILE" {
		t.Errorf("envName: %s, %s", envName("ram-cache"), envName("cluster-key-file"))
	}
	mnt := fakeMount(t, daemon.Stats{Node: "n1"})
	t.Setenv("DLFS_INTERVAL", "0s")
	root := newRootCmd()
	root.SetArgs([]string{"stats", "--watch", mnt})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "--interval 0s") {
		t.Errorf("DLFS_INTERVAL=0s: %v", err)
	}
}
