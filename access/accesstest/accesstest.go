// Package accesstest makes source trees whose entries have other owners
// and modes, for tests of what each user may see. It needs root.
package accesstest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Tree makes a directory of entries with the given modes and owners, and
// returns it: spec maps a path to "MODE UID GID" (octal mode); a path
// ending in / is a directory, any other a file holding its own path.
// Directories named by no path are 0755 and root's. It skips the test when
// not run as root.
func Tree(t testing.TB, spec map[string]string) string {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to give files other owners")
	}
	src := t.TempDir()
	os.Chmod(src, 0o755)
	type fix struct {
		p        string
		mode     os.FileMode
		uid, gid int
	}
	var fixes []fix
	for p, s := range spec {
		var f fix
		if _, err := fmt.Sscanf(s, "%o %d %d", &f.mode, &f.uid, &f.gid); err != nil {
			t.Fatalf("accesstest: %s: %q: want \"MODE UID GID\": %v", p, s, err)
		}
		f.p = filepath.Join(src, strings.TrimSuffix(p, "/"))
		if err := os.MkdirAll(filepath.Dir(f.p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if strings.HasSuffix(p, "/") {
			err = os.MkdirAll(f.p, 0o755)
		} else {
			err = os.WriteFile(f.p, []byte(p), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
		fixes = append(fixes, f)
	}
	// Modes last: a 0700 directory made first would not take its files.
	for _, f := range fixes {
		if err := os.Chown(f.p, f.uid, f.gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f.p, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	return src
}
