package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/mountproc"
)

// TestRemountServesSourceNotSnapshot: a remount with --ssd-cache starts
// from the saved catalog, with the SSD tier holding every file, yet
// serves SOURCE as it is now. While dlfs was down (a) another dataset
// was put behind the same path with the same names, sizes and mtimes,
// the way `rsync -a` puts it (a temporary file renamed over each), and
// (b) a few files were rewritten in place, same size and mtime. Every
// file read right after the remount has the new bytes.
func TestRemountServesSourceNotSnapshot(t *testing.T) {
	src, ssd := t.TempDir(), t.TempDir()
	files := treeFiles(300)
	content := func(gen, name string) []byte { return []byte(fmt.Sprintf("%s:%-40s", gen, name)) }
	write := func(gen string, names []string, inPlace bool) {
		for _, f := range names {
			p := filepath.Join(src, f)
			os.MkdirAll(filepath.Dir(p), 0o755)
			fi, statErr := os.Stat(p)
			if inPlace {
				if err := os.WriteFile(p, content(gen, f), 0o644); err != nil {
					t.Fatal(err)
				}
			} else {
				tmp := filepath.Join(filepath.Dir(p), ".tmp-"+filepath.Base(p))
				if err := os.WriteFile(tmp, content(gen, f), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, p); err != nil {
					t.Fatal(err)
				}
			}
			if statErr == nil { // rsync -a and cp -p keep the mtime
				os.Chtimes(p, fi.ModTime(), fi.ModTime())
			}
		}
	}
	write("A", files, false)
	// The saved scan must trust these directories' times (older than it
	// by a minute, like any dataset not written just now).
	old := time.Now().Add(-time.Hour)
	for _, d := range []string{src, filepath.Join(src, "cls")} {
		os.Chtimes(d, old, old)
	}
	snap := filepath.Join(ssd, "catalog.snap")
	d := startDlfs(t, src, "--ssd-cache", ssd)
	waitFor(t, "the catalog to be saved", 30*time.Second, func() bool { _, err := os.Stat(snap); return err == nil })
	for range 2 {
		readAll(t, d.Mnt, files, 2, 1, func(name string) []byte { return content("A", name) })
	}
	d.stop(t)

	for _, tc := range []struct {
		name    string
		gen     string
		files   []string
		inPlace bool
	}{
		{"another dataset, renamed in", "B", files, false},
		{"a few rewritten in place", "C", files[10:40], true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := map[string][]byte{}
			for _, f := range files {
				b, err := os.ReadFile(filepath.Join(src, f))
				if err != nil {
					t.Fatal(err)
				}
				want[f] = b
			}
			write(tc.gen, tc.files, tc.inPlace)
			for _, f := range tc.files {
				want[f] = content(tc.gen, f)
			}
			d := startDlfs(t, src, "--ssd-cache", ssd)
			defer d.stop(t)
			if !strings.Contains(d.Stderr.String(), "loaded the saved snapshot") && tc.inPlace {
				t.Errorf("the remount did not start from the saved catalog:\n%s", d.Stderr)
			}
			var stale []string
			for _, f := range files {
				got, err := os.ReadFile(filepath.Join(d.Mnt, f))
				if err != nil {
					t.Fatalf("read %s right after the remount: %v", f, err)
				}
				if string(got) != string(want[f]) {
					stale = append(stale, fmt.Sprintf("%s: %q", f, got))
				}
			}
			if len(stale) > 0 {
				t.Errorf("%d of %d files read after the remount are not SOURCE's bytes, e.g. %s", len(stale), len(files), stale[0])
			}
		})
	}
}

// TestHungPFSReadsAtMount: a PFS whose metadata answers while every read
// hangs as dlfs starts. The scan succeeds; the identity's reads of the
// oldest files wait. The daemon says what it waits on, and SIGTERM ends
// it, with a failure, while the reads still hang.
func TestHungPFSReadsAtMount(t *testing.T) {
	dir := t.TempDir()
	for _, f := range treeFiles(10) {
		p := filepath.Join(dir, f)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := startPFS(t, dir, "-hang-reads")
	mnt := t.TempDir()
	var stderr mountproc.SyncBuffer
	d := exec.Command(bin.dlfs, "mount", "--stop-timeout", "2s", p.Mnt, mnt)
	d.Stderr = &stderr
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.Wait() }()
	defer p.Cmd.Process.Signal(syscall.SIGHUP) // lets the reads go, whatever happens
	waitFor(t, "the daemon to say it waits on a read of SOURCE", 30*time.Second, func() bool {
		return strings.Contains(stderr.String(), "waiting for SOURCE to answer a read")
	})
	if !strings.Contains(stderr.String(), "cls/") {
		t.Errorf("the wait does not name the file:\n%s", stderr.String())
	}
	d.Process.Signal(syscall.SIGTERM)
	// A thread of the daemon may be in the kernel, in a read the hung PFS
	// never answers: the process then exits as soon as the read ends.
	for deadline := time.Now().Add(30 * time.Second); !exiting(d.Process.Pid); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("SIGTERM while the identity's reads hang: still running after 30s\n%s", stderr.String())
		}
	}
	p.Cmd.Process.Signal(syscall.SIGHUP)
	if err := <-exited; err == nil {
		t.Errorf("stopped while waiting on SOURCE, dlfs exited 0; want a failure\n%s", stderr.String())
	}
}
