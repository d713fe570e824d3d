package fusefs

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/test/pfssim"
)

// statfs of a PFS that hangs answers from the last answer, or ETIMEDOUT
// when there is none; an interrupted one returns at once.
func TestStatfsOfHungSource(t *testing.T) {
	dir, mnt := t.TempDir(), t.TempDir()
	sim, err := pfssim.Mount(mnt, pfssim.Config{Dir: dir})
	if err != nil {
		t.Skipf("no FUSE here: %v", err)
	}
	defer sim.Unmount()
	c := &statfsCall{wait: 20 * time.Millisecond}
	sim.Hang()
	if _, err := c.get(nil, mnt); !errors.Is(err, syscall.ETIMEDOUT) {
		t.Fatalf("statfs of a hung PFS never answered: %v, want ETIMEDOUT", err)
	}
	sim.Resume()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := c.get(nil, mnt); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("statfs never answered after the PFS resumed")
		}
	}
	want, _ := c.get(nil, mnt)
	sim.Hang()
	for range 3 {
		got, err := c.get(nil, mnt)
		if err != nil || got.Blocks != want.Blocks {
			t.Fatalf("statfs of a hung PFS: %+v, %v; want the last answer", got, err)
		}
	}
	cancel := make(chan struct{})
	close(cancel)
	if _, err := c.get(cancel, mnt); !errors.Is(err, syscall.EINTR) {
		t.Errorf("an interrupted statfs: %v, want EINTR", err)
	}
	sim.Resume()
}

// A statfs that SOURCE answers with an error reports that error, not a
// timeout, and not an older answer.
func TestStatfsError(t *testing.T) {
	c := &statfsCall{wait: time.Minute}
	if _, err := c.get(nil, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.get(nil, "/nonexistent/dlfs-statfs"); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("statfs of a missing SOURCE: %v, want ENOENT", err)
	}
}
