package ssdstore

import (
	"testing"
)

// TestChecks: CheckCapacity agrees with Open, and Locked sees an open
// store's lock and no lock once it is closed, creating nothing.
func TestChecks(t *testing.T) {
	for _, c := range []int64{1 << 20, MinCapacity - 1} {
		if CheckCapacity(c) == nil {
			t.Errorf("capacity %d accepted", c)
		}
		if _, err := Open(Config{Dir: t.TempDir(), Capacity: c}); err == nil {
			t.Errorf("Open took capacity %d", c)
		}
	}
	if err := CheckCapacity(64 << 20); err != nil {
		t.Error(err)
	}
	dir := t.TempDir()
	if locked, err := Locked(dir); locked || err != nil {
		t.Fatalf("an empty directory: locked %v, %v", locked, err)
	}
	s, err := Open(Config{Dir: dir, Capacity: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if locked, err := Locked(dir); !locked || err != nil {
		t.Errorf("an open store: locked %v, %v", locked, err)
	}
	s.Close()
	if locked, err := Locked(dir); locked || err != nil {
		t.Errorf("a closed store: locked %v, %v", locked, err)
	}
	if MinFree(64<<20) <= 0 {
		t.Error("no floor")
	}
}
