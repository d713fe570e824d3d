package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
