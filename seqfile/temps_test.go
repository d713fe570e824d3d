package seqfile

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestWriteIndexRemovesLeftovers: the temporary index files of a pack
// killed before its rename are removed by the next WriteIndex in that
// directory, and nothing else is (finding of issue 27).
func TestWriteIndexRemovesLeftovers(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{".index-123", ".index-98765", ".index-x", "shard-00000.seq.tmp"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("cut short"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ix, err := NewIndex(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteIndex(dir, ix); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{".index-x", IndexName, "shard-00000.seq.tmp"}; !slices.Equal(names, want) {
		t.Fatalf("the directory holds %v, want %v", names, want)
	}
	if _, err := ReadIndex(dir); err != nil {
		t.Fatal(err)
	}
}
