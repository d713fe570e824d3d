package source

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestLocal(t *testing.T) {
	for p, want := range map[string]bool{
		"a": true, "a/b.jpg": true, "a b/#c": true, "..a": true,
		"": false, "/etc/passwd": false, "..": false, "a/../../x": false, "./a": false, "a//b": false, "a/": false, "a\x00b": false,
	} {
		if Local(p) != want {
			t.Errorf("Local(%q) = %v, want %v", p, !want, want)
		}
	}
}

func TestReadAt(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "f"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Symlink(outside, filepath.Join(root, "escape"))
	os.Symlink(filepath.Dir(outside), filepath.Join(root, "dirlink"))
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fi, _ := os.Stat(filepath.Join(root, "f"))
	want := Want{Size: fi.Size(), Mtime: fi.ModTime().UnixNano()}
	buf := make([]byte, 5)
	if n, err := s.ReadAt("f", want, buf, 0); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("ReadAt: %q, %v", buf[:n], err)
	}
	if st := s.Stats(); st.Opens != 1 || st.Bytes != 5 || st.ReadOps != 1 {
		t.Errorf("stats %+v", st)
	}
	if _, err := s.ReadAt("f", Want{Size: 4, Mtime: want.Mtime}, buf, 0); !errors.Is(err, ErrChanged) {
		t.Errorf("identity mismatch: %v", err)
	}
	for _, p := range []string{"escape", "dirlink/secret", "../secret", "/etc/passwd"} {
		if _, err := s.ReadAt(p, Want{Size: 6}, buf, 0); err == nil {
			t.Errorf("ReadAt(%q) read outside the dataset", p)
		}
	}
}
