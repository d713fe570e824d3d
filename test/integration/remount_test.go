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
	"github.com/dlfs/dlfs/test/pfssim"
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
	stopStartWhileHung(t, p, d, exited, &stderr)
}

// TestRemountUnreadableAndRacy (found by helper G): SOURCE has one directory dlfs
// cannot read (lost+found at an ext4 root, for a daemon not run as root;
// here pfssim answers EACCES), and the saved scan was made within a
// minute of the dataset's last change (mounted right after it was
// written). Every remount comes up and reads SOURCE's bytes: what a
// rescan read counts as checked (it failed: the unreadable entry kept the
// loaded snapshot unchecked after a full refresh, and a racy directory
// stayed behind by the trust of the load whatever rescans came since).
func TestRemountUnreadableAndRacy(t *testing.T) {
	dir := t.TempDir()
	files := treeFiles(100)
	os.MkdirAll(filepath.Join(dir, "cls"), 0o755)
	os.MkdirAll(filepath.Join(dir, "locked"), 0o755)
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pmnt := t.TempDir()
	sim, err := pfssim.Mount(pmnt, pfssim.Config{Dir: dir, NoAttrCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Unmount() })
	sim.FailDir("locked", syscall.EACCES)
	ssd := t.TempDir()
	d := startDlfs(t, pmnt, "--ssd-cache", ssd)
	waitFor(t, "the catalog to be saved", 30*time.Second, func() bool { _, err := os.Stat(filepath.Join(ssd, "catalog.snap")); return err == nil })
	d.stop(t)

	// Every remount, however much later: the saved catalog is never
	// rewritten, since no remount comes up.
	for try := 1; try <= 2; try++ {
		mnt := t.TempDir()
		p, err := mountproc.Start(bin.dlfs, mnt, 60*time.Second, "mount", "--ssd-cache", ssd, pmnt, mnt)
		if err != nil {
			t.Errorf("remount %d of an unchanged SOURCE with one unreadable directory: %v", try, err)
			continue
		}
		d := &proc{p}
		var bad []string
		for _, f := range files[:10] {
			if _, err := os.ReadFile(filepath.Join(d.Mnt, f)); err != nil {
				bad = append(bad, err.Error())
			}
		}
		if len(bad) > 0 {
			t.Errorf("%d of 10 reads of an unchanged SOURCE failed after the remount, e.g. %s", len(bad), bad[0])
		}
		d.stop(t)
	}
}

// TestRemountIdentityMovedTree (found by helper G): a tree moved into
// SOURCE while dlfs was down keeps its files' old ctimes, so it may enter
// the identity. A remount from the saved catalog revalidates the
// directories before it draws the identity, and so agrees with a fresh
// scan of the same SOURCE at the same time.
func TestRemountIdentityMovedTree(t *testing.T) {
	base := t.TempDir()
	staging := filepath.Join(base, "staging", "extra")
	os.MkdirAll(staging, 0o755)
	for i := range 40 {
		os.WriteFile(filepath.Join(staging, fmt.Sprintf("old%02d.jpg", i)), []byte(fmt.Sprintf("old %d", i)), 0o644)
	}
	src := filepath.Join(base, "src")
	for _, f := range treeFiles(40) {
		p := filepath.Join(src, f)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ssd := t.TempDir()
	d := startDlfs(t, src, "--ssd-cache", ssd)
	waitFor(t, "the catalog to be saved", 30*time.Second, func() bool { _, err := os.Stat(filepath.Join(ssd, "catalog.snap")); return err == nil })
	before := datasetOfLog(t, d)
	d.stop(t)

	if err := os.Rename(staging, filepath.Join(src, "extra")); err != nil { // mv staging/extra src/
		t.Fatal(err)
	}
	fresh := startDlfs(t, src)
	remount := startDlfs(t, src, "--ssd-cache", ssd)
	a, b := datasetOfLog(t, fresh), datasetOfLog(t, remount)
	t.Logf("identity: before the mv %s; after it, a fresh scan %s, a remount from the saved catalog %s", before, a, b)
	if a != b {
		t.Errorf("same SOURCE, same moment: a fresh scan says dataset %s, a remount from the saved catalog %s", a, b)
	}
}

// datasetOfLog is the dataset identity a daemon logged at start.
func datasetOfLog(t *testing.T, d *proc) string {
	t.Helper()
	for _, l := range strings.Split(d.Stderr.String(), "\n") {
		if i := strings.Index(l, " dataset="); i >= 0 && strings.Contains(l, "scanned SOURCE") {
			return strings.Fields(l[i+1:])[0]
		}
	}
	t.Fatalf("no dataset identity logged:\n%s", d.Stderr)
	return ""
}
