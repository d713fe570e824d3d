package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/cmd/dlfs/packer"
	"github.com/dlfs/dlfs/daemon"
	"github.com/dlfs/dlfs/prefetch"
)

// TestPrintable: names that print come out as they are, UTF-8 included;
// control bytes, invalid UTF-8, runes that do not print and backslashes
// make the name Go-quoted.
func TestPrintable(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"train/img 001.jpg", "train/img 001.jpg"},
		{"données/日本語/ß.jpg", "données/日本語/ß.jpg"},
		{"a\ufffdb", "a\ufffdb"}, // a replacement character of its own
		{"", ""},
		{"x\x1b[2Jy", `"x\x1b[2Jy"`},
		{"line\nforged", `"line\nforged"`},
		{"tab\there", `"tab\there"`},
		{"bad\xffutf8", `"bad\xffutf8"`},
		{"rlo\u202etxt.exe", `"rlo\u202etxt.exe"`},
		{"c1\u009bm", `"c1\u009bm"`},
		{`back\slash`, `"back\\slash"`},
		{`"x\x1b"`, `"\"x\\x1b\""`}, // a name that looks escaped is not taken for one
	} {
		if got := printable(tc.in); got != tc.want {
			t.Errorf("printable(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// evil is a name as a hostile SOURCE, peer or job owner would choose it:
// an ESC sequence that sets the terminal's title, and a newline.
const evil = "d\x1b]0;owned\x07\nx"

// TestCommandsEscapeNames: each command that prints a name chosen by
// SOURCE, a peer or a job prints it escaped, never its raw bytes.
func TestCommandsEscapeNames(t *testing.T) {
	// Escaped, within a quoted name or a quoted line.
	want := strings.Trim(printable(evil), `"`) // d\x1b]0;owned\a\nx
	check := func(t *testing.T, what, out string) {
		t.Helper()
		if strings.ContainsAny(out, "\x1b\x07") || strings.Contains(out, "\nx") || !strings.Contains(out, want) {
			t.Errorf("%s printed the name raw, or not at all: %q", what, out)
		}
	}
	t.Run("refresh", func(t *testing.T) {
		var st daemon.Stats
		st.Catalog.UnreadableEntries, st.Catalog.Unreadable = 2, []string{"ok", evil}
		mnt := fakeMount(t, st)
		if err := os.WriteFile(filepath.Join(mnt, ".dlfs", "control"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		if err := refresh(&out, mnt, filepath.Join(mnt, ".dlfs")); err != nil {
			t.Fatal(err)
		}
		check(t, "refresh", out.String())
	})
	t.Run("stats", func(t *testing.T) {
		st := daemon.Stats{Node: evil, Source: evil, Jobs: map[string]map[string]prefetch.Stats{evil: {evil: {}}}}
		st.Cluster.Members = []daemon.MemberStats{{Member: cluster.Member{Name: evil, State: evil}}}
		st.Passthrough.Why = evil
		var out strings.Builder
		if err := renderStats(&out, evil, st, nil, 0); err != nil {
			t.Fatal(err)
		}
		check(t, "stats", out.String())
		if n := strings.Count(out.String(), printable(evil)); n != 8 {
			t.Errorf("stats printed the escaped name %d times, want 8 (mount, SOURCE, node, why, job, rank, member, state):\n%s", n, out.String())
		}
	})
	t.Run("warmup --check", func(t *testing.T) {
		check(t, "warmup --check", checkLine(evil, daemon.CheckResult{}))
	})
	t.Run("doctor", func(t *testing.T) {
		var out strings.Builder
		printChecks(&out, []daemon.Check{{Level: daemon.Fail, What: "SOURCE", Detail: "cannot read " + evil}})
		check(t, "doctor", out.String())
	})
	t.Run("error", func(t *testing.T) {
		var out strings.Builder
		printError(&out, errors.New("refresh /m: scan "+evil+": permission denied"))
		check(t, "an error", out.String())
		if strings.Count(out.String(), "\n") != 1 {
			t.Errorf("an error took more than one line: %q", out.String())
		}
	})
	t.Run("mount helper", func(t *testing.T) {
		var out, errs strings.Builder
		if code := mountHelper("mount.fuse.dlfs", []string{"/src/" + evil, "/mnt", "-f"}, &out, &errs); code != 0 {
			t.Fatalf("exit %d: %s", code, errs.String())
		}
		check(t, "the mount helper", out.String())
		errs.Reset()
		mountHelper("mount.fuse.dlfs", []string{"/src/" + evil, "/mnt", "-o", evil}, &out, &errs)
		check(t, "the mount helper's error", errs.String())
	})
	t.Run("pack --verify", func(t *testing.T) {
		src, out := t.TempDir(), filepath.Join(t.TempDir(), "pack")
		if err := os.WriteFile(filepath.Join(src, "a"), []byte("a"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := packer.Pack(context.Background(), packer.Config{Source: src, Out: out, Shards: 1, Workers: 1}); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, evil), []byte("b"), 0o644); err != nil {
			t.Fatal(err)
		}
		var w strings.Builder
		if err := runVerify(&w, out, src); err == nil {
			t.Fatal("a pack without the file named evil matched")
		}
		check(t, "pack --verify", w.String())
	})
	t.Run("umount", func(t *testing.T) {
		err := umount(filepath.Join(t.TempDir(), evil), false)
		if err == nil {
			t.Fatal("umount of a missing directory succeeded")
		}
		check(t, "umount", err.Error())
	})
}
