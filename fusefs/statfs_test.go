package fusefs

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dlfs/dlfs/test/pfssim"
)

// simulatedSource mounts a simulated PFS, unmounted when t ends, and
// returns it and its mountpoint.
func simulatedSource(t *testing.T) (*pfssim.Sim, string) {
	t.Helper()
	mnt := t.TempDir()
	sim, err := pfssim.Mount(mnt, pfssim.Config{Dir: t.TempDir()})
	if err != nil {
		t.Skipf("no FUSE here: %v", err)
	}
	t.Cleanup(func() { _ = sim.Unmount() })
	return sim, mnt
}

// statfs of a PFS that hangs answers from the last answer, or ETIMEDOUT
// when there is none; an interrupted one returns at once.
func TestStatfsOfHungSource(t *testing.T) {
	sim, mnt := simulatedSource(t)
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

// A filesystem as New makes it waits statfsWait for SOURCE: while SOURCE
// hangs, a statfs request interrupted at once is answered EINTR, never
// ETIMEDOUT (a request that waited for nothing would time out as soon as
// it began, whenever the runtime chose that of the two).
func TestStatfsWaitsByDefault(t *testing.T) {
	sim, mnt := simulatedSource(t)
	f := New(Config{}, snapData{dir: mnt}, nil)
	sim.Hang()
	cancel := make(chan struct{})
	close(cancel)
	for i := range 64 {
		var out fuse.StatfsOut
		if st := f.StatFs(cancel, &fuse.InHeader{}, &out); st != fuse.Status(syscall.EINTR) {
			t.Fatalf("statfs %d of a hung SOURCE, interrupted: %v, want EINTR", i, st)
		}
	}
	sim.Resume()
}
