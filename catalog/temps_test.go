package catalog

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestRemoveTemps: the temporary files of saves a killed daemon left in
// the directory are removed, and nothing else is (finding of issue 27:
// they stayed for ever, outside --ssd-cache-size).
func TestRemoveTemps(t *testing.T) {
	path, _, cfg := saved(t)
	dir := filepath.Dir(path)
	var left []string
	for _, name := range []string{".catalog-1234567", ".catalog-42"} { // as os.CreateTemp names them
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("a save cut short"), 0o600); err != nil {
			t.Fatal(err)
		}
		left = append(left, p)
	}
	others := []string{filepath.Base(path), ".catalog-x", ".index-123", "000001.vlog"}
	for _, name := range others[1:] {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := RemoveTemps(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if !slices.Equal(removed, left) {
		t.Fatalf("removed %v, want the leftovers %v", removed, left)
	}
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	slices.Sort(others)
	if !slices.Equal(names, others) {
		t.Fatalf("the directory holds %v, want %v", names, others)
	}
	c, err := Open(context.Background(), cfg)
	if err != nil || !c.Loaded() {
		t.Fatalf("the saved snapshot no longer loads: %v", err)
	}
}
