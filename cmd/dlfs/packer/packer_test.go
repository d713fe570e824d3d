package packer

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlfs/dlfs/seqfile"
	"github.com/dlfs/dlfs/test/datagen"
)

func tree(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	if _, err := datagen.ImageFolder(filepath.Join(src, "train"), datagen.Spec{Classes: 5, Files: 300, MeanSize: 2000, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(src, "empty"), 0o700)
	os.WriteFile(filepath.Join(src, "zero"), nil, 0o600)
	os.Symlink("train", filepath.Join(src, "link"))
	return src
}

// TestPackVerify: a pack holds every entry with its mode and bytes,
// verifies clean against SOURCE, and packing again does nothing.
func TestPackVerify(t *testing.T) {
	src, out := tree(t), filepath.Join(t.TempDir(), "pack")
	var reports int
	res, err := Pack(context.Background(), Config{Source: src, Out: out, Shards: 4, Workers: 3, AheadBytes: 10_000,
		Progress: func(Progress) { reports++ }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Files != 302 || res.TotalFiles != 302 || res.AlreadyPacked || reports == 0 {
		t.Errorf("result %+v after %d progress reports", res, reports)
	}
	n, bad, err := Verify(out, src, 10)
	if err != nil || len(bad) != 0 || n != 302+7 { // files, symlink; train, 5 classes, empty
		t.Fatalf("verify: %d entries, %v, %v", n, bad, err)
	}
	des, _ := os.ReadDir(out)
	if len(des) != 5 {
		t.Errorf("the pack holds %d files, want 4 shards and the index", len(des))
	}
	ix, _ := seqfile.ReadIndex(out)
	if e, ok := ix.Lookup("empty"); !ok || e.Mode&0o777 != 0o700 {
		t.Errorf("empty directory: %+v", e)
	}
	again, err := Pack(context.Background(), Config{Source: src, Out: out, Shards: 4})
	if err != nil || !again.AlreadyPacked {
		t.Errorf("second pack: %+v, %v", again, err)
	}
	// A changed SOURCE: Verify names the file; Pack refuses.
	victim := filepath.Join(src, "train", "class_001")
	des, _ = os.ReadDir(victim)
	f := filepath.Join(victim, des[0].Name())
	b, _ := os.ReadFile(f)
	b[0] ^= 1
	os.WriteFile(f, b, 0o644)
	_, bad, _ = Verify(out, src, 10)
	if len(bad) != 1 || !strings.Contains(bad[0].Reason, "bytes differ") {
		t.Errorf("verify after a change: %v", bad)
	}
	os.WriteFile(filepath.Join(src, "new"), []byte("x"), 0o644)
	if _, err := Pack(context.Background(), Config{Source: src, Out: out}); !errors.Is(err, ErrOther) {
		t.Errorf("pack over another tree's pack: %v", err)
	}
}

// TestPackCorruptShard: Verify reports a corrupt record with its shard and
// offset.
func TestPackCorruptShard(t *testing.T) {
	src, out := tree(t), filepath.Join(t.TempDir(), "pack")
	if _, err := Pack(context.Background(), Config{Source: src, Out: out, Shards: 2}); err != nil {
		t.Fatal(err)
	}
	shard := filepath.Join(out, seqfile.ShardName(1))
	b, _ := os.ReadFile(shard)
	b[len(b)/2] ^= 0xff
	os.WriteFile(shard, b, 0o644)
	_, bad, err := Verify(out, src, 10)
	if err != nil || len(bad) == 0 || !strings.Contains(bad[0].Reason, "shard-00001.seq") {
		t.Errorf("verify of a corrupt shard: %v, %v", bad, err)
	}
}
