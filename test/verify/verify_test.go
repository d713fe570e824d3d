package verify

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRead: every file read right counts; a changed file, a missing one
// and a damaged sums file are each told apart.
func TestRead(t *testing.T) {
	dir := t.TempDir()
	files := []string{"a", "b/c", "d"}
	for _, f := range files {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, f), []byte("bytes of "+f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sums := filepath.Join(t.TempDir(), "sums")
	if err := WriteSums(dir, files, sums); err != nil {
		t.Fatal(err)
	}
	r, err := Read(dir, sums, 1, 2)
	if err != nil || r.Files != 3 || r.Errors != 0 || r.Bytes != int64(len("bytes of a")*2+len("bytes of b/c")) {
		t.Fatalf("a right tree: %+v, %v", r, err)
	}
	os.WriteFile(filepath.Join(dir, "a"), []byte("other bytes"), 0o644)
	os.Remove(filepath.Join(dir, "d"))
	r, err = Read(dir, sums, 2, 1)
	if err != nil || r.Files != 1 || r.Errors != 2 || r.First == "" {
		t.Errorf("one changed, one missing: %+v, %v", r, err)
	}
	os.WriteFile(sums, []byte("no-digest-here\n"), 0o644)
	if _, err := Read(dir, sums, 1, 1); err == nil || !strings.Contains(err.Error(), "without a digest") {
		t.Errorf("a damaged sums file: %v", err)
	}
}
