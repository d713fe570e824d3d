package atomicfile

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "snap")
	if err := Write(path, ".snap-", func(w io.Writer) error { _, err := io.WriteString(w, "one"); return err }); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := Write(path, ".snap-", func(w io.Writer) error { io.WriteString(w, "tw"); return boom }); !errors.Is(err, boom) {
		t.Fatalf("a failed fill returned %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "one" {
		t.Fatalf("after a failed write the file holds %q, want the old %q", b, "one")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("the directory holds %d files, want only the target: a failed write left its temporary file", len(ents))
	}
}

// The rule: RemoveStale removes every temporary file of its prefix that
// no writer holds (a killed writer's), and nothing else: not one being
// written, not another prefix's, not a directory or a link, not a file
// elsewhere.
func TestRemoveStale(t *testing.T) {
	dir := t.TempDir()
	other := t.TempDir()
	mk := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	stale := []string{mk(".snap-123"), mk(".snap-4567")}
	keep := []string{mk("snap"), mk(".snap-"), mk(".snap-12x"), mk(".other-123"), mk("x.snap-123")}
	if err := os.Mkdir(filepath.Join(dir, ".snap-99"), 0o700); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(other, ".snap-77")
	if err := os.WriteFile(target, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, ".snap-88")); err != nil {
		t.Fatal(err)
	}
	// One being written, by this process: its lock keeps it.
	live, err := create(dir, ".snap-")
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()

	removed, err := RemoveStale(dir, ".snap-")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if !slices.Equal(removed, stale) {
		t.Fatalf("removed %v, want %v", removed, stale)
	}
	for _, p := range append(keep, live.Name(), target, filepath.Join(dir, ".snap-99"), filepath.Join(dir, ".snap-88")) {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s: %v; it should be kept", p, err)
		}
	}
	if removed, err := RemoveStale(filepath.Join(dir, "missing"), ".snap-"); err != nil || len(removed) != 0 {
		t.Fatalf("a missing directory: %v, %v", removed, err)
	}
}

// A writer killed while writing leaves its temporary file; the next
// RemoveStale removes it once the writer is dead, not before.
func TestKilledWriter(t *testing.T) {
	if os.Getenv("ATOMICFILE_WRITER") != "" {
		dir := os.Getenv("ATOMICFILE_WRITER")
		_ = Write(filepath.Join(dir, "snap"), ".snap-", func(w io.Writer) error {
			io.WriteString(w, "partial")
			os.Stdout.WriteString("writing\n")
			select {} // killed here
		})
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledWriter$")
	cmd.Env = append(os.Environ(), "ATOMICFILE_WRITER="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 8)
	if _, err := io.ReadFull(out, line); err != nil || !strings.HasPrefix(string(line), "writing") {
		cmd.Process.Kill()
		t.Fatalf("the writer did not start writing: %q %v", line, err)
	}
	if removed, _ := RemoveStale(dir, ".snap-"); len(removed) != 0 {
		t.Fatalf("removed %v while its writer lives", removed)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || !IsTemp(ents[0].Name(), ".snap-") {
		t.Fatalf("the killed writer left %v, want its temporary file", ents)
	}
	removed, err := RemoveStale(dir, ".snap-")
	if err != nil || len(removed) != 1 {
		t.Fatalf("removed %v (%v), want the killed writer's temporary file", removed, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("left %v", ents)
	}
}

// Writers racing with RemoveStale all succeed: it never removes a file
// being written, whatever the interleaving.
func TestWriteRacesRemoveStale(t *testing.T) {
	dir := t.TempDir()
	done := make(chan struct{})
	cleaned := make(chan error, 1)
	go func() {
		for {
			select {
			case <-done:
				cleaned <- nil
				return
			default:
			}
			if _, err := RemoveStale(dir, ".snap-"); err != nil {
				cleaned <- err
				return
			}
		}
	}()
	errs := make(chan error, 4)
	for w := range 4 {
		go func() {
			path := filepath.Join(dir, "snap"+string(rune('a'+w)))
			for range 200 {
				if err := Write(path, ".snap-", func(w io.Writer) error { _, err := io.WriteString(w, "data"); return err }); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("a write racing RemoveStale failed: %v", err)
		}
	}
	close(done)
	if err := <-cleaned; err != nil {
		t.Fatal(err)
	}
}
