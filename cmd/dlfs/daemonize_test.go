package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDaemonArgs: the daemon gets the command line less every --daemon,
// and --daemon=false before any "--", so that neither DLFS_DAEMON nor a
// config file makes it start another.
func TestDaemonArgs(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{[]string{"mount", "--daemon", "/src", "/mnt"}, []string{"mount", "/src", "/mnt", "--daemon=false"}},
		{[]string{"--config", "c.yaml", "mount", "--daemon=true", "--ram-cache", "1GiB", "/src", "/mnt"},
			[]string{"--config", "c.yaml", "mount", "--ram-cache", "1GiB", "/src", "/mnt", "--daemon=false"}},
		{[]string{"mount", "--daemon", "--", "--daemon", "/mnt"}, []string{"mount", "--daemon=false", "--", "--daemon", "/mnt"}},
		{[]string{"mount", "/src", "/mnt"}, []string{"mount", "/src", "/mnt", "--daemon=false"}},
	} {
		if got := daemonArgs(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("daemonArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestRunDaemon: runDaemon returns once the daemon writes its mounted
// line (copied to stdout), though the daemon goes on; a daemon that exits
// first gives its exit status, its stderr copied.
func TestRunDaemon(t *testing.T) {
	var out, errs bytes.Buffer
	// The "daemon" says mounted, then goes on writing to its stdout until
	// that breaks: runDaemon must neither wait for it nor hold the pipe.
	err := runDaemon("/bin/sh", []string{"-c", "echo 'dlfs: mounted a at b'; while echo .; do sleep 0.1; done"}, &out, &errs)
	if err != nil || out.String() != "dlfs: mounted a at b\n" {
		t.Errorf("a daemon that mounted: %v, stdout %q", err, out.String())
	}
	var out2, errs2 bytes.Buffer // the first call's copier may still run
	err = runDaemon("/bin/sh", []string{"-c", "echo 'dlfs: MOUNTPOINT: no such file' >&2; exit 3"}, &out2, &errs2)
	var ec exitCode
	if !errors.As(err, &ec) || ec != 3 || out2.Len() != 0 || !strings.Contains(errs2.String(), "MOUNTPOINT: no such file") {
		t.Errorf("a daemon that failed: %v, stdout %q, stderr %q", err, out2.String(), errs2.String())
	}
	var out3, errs3 bytes.Buffer
	if err := runDaemon("/bin/sh", []string{"-c", "exit 0"}, &out3, &errs3); err == nil || errors.As(err, &ec) {
		t.Errorf("a daemon that exited 0 before mounting: %v", err)
	}
}

// TestLogFileReopen: after the file is moved away (logrotate), Reopen
// makes a new one at the path, and records go there.
func TestLogFileReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dlfs.log")
	lf, err := openLogFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	lf.Write([]byte("one\n"))
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	lf.Write([]byte("two\n"))
	if err := lf.Reopen(); err != nil {
		t.Fatal(err)
	}
	lf.Write([]byte("three\n"))
	old, _ := os.ReadFile(path + ".1")
	cur, _ := os.ReadFile(path)
	if string(old) != "one\ntwo\n" || string(cur) != "three\n" {
		t.Errorf("rotated %q, current %q", old, cur)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the new log file: %v, %v; want mode 0600", fi.Mode(), err)
	}
	if _, err := openLogFile(filepath.Join(path, "x")); err == nil || !strings.Contains(err.Error(), "--log-file") {
		t.Errorf("a log file that cannot be made: %v", err)
	}
}

// TestErrorFormat: with --log-format json the error a command ends with
// is a JSON record; otherwise, and before the flag is known, a plain line.
func TestErrorFormat(t *testing.T) {
	root := newRoot(nil, func(string) (string, bool) { return "", false })
	args := []string{"mount", "--log-format", "json", "/a"}
	root.SetArgs(args)
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	err := root.Execute() // one argument: refused after the flags are parsed
	if err == nil {
		t.Fatal("mount with one argument was accepted")
	}
	var b bytes.Buffer
	printErrorAs(&b, err, errorFormat(root, args))
	var rec map[string]any
	if json.Unmarshal(b.Bytes(), &rec) != nil || rec["level"] != "ERROR" || !strings.Contains(rec["err"].(string), "arg") {
		t.Errorf("json: %q", b.String())
	}
	if f := errorFormat(newRoot(nil, func(string) (string, bool) { return "", false }), []string{"stats"}); f != "text" {
		t.Errorf("a command without --log-format: %s", f)
	}
}
