package daemon

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/dlfs/dlfs/cmd/dlfs/packer"
	"github.com/dlfs/dlfs/seqfile"
	"github.com/dlfs/dlfs/test/conformance"
	"github.com/dlfs/dlfs/test/datagen"
)

// TestPackedSource: a seqfile pack of the odd tree mounts as that tree,
// byte for byte, with its names, modes, mtimes and symlinks; the second
// read of the tree reads nothing from the shards.
func TestPackedSource(t *testing.T) {
	src := conformance.OddTree(t, t.TempDir())
	out := pack(t, src, 3)
	n, mnt := start(t, out, nil)
	conformance.Tree(t, src, mnt)
	before := n.Stats().PFS
	if before.Opens > 4 { // the index and 3 shards, each opened once
		t.Errorf("%d opens of the pack for one read of the tree", before.Opens)
	}
	conformance.Tree(t, src, mnt)
	if after := n.Stats().PFS; after.Bytes != before.Bytes {
		t.Errorf("the second read of the tree read %d bytes from the shards", after.Bytes-before.Bytes)
	}
}

// TestCorruptPack: a record whose bytes were flipped in its shard fails
// with EIO and a log line naming the shard; every other file reads fine.
func TestCorruptPack(t *testing.T) {
	src := conformance.OddTree(t, t.TempDir())
	out := pack(t, src, 1)
	ix, err := seqfile.ReadIndex(out)
	if err != nil {
		t.Fatal(err)
	}
	e, _ := ix.Lookup("dogs/sub/b.jpg")
	shard := filepath.Join(out, ix.Shards[0])
	b, _ := os.ReadFile(shard)
	b[e.DataOffset()+100] ^= 0xff
	if err := os.WriteFile(shard, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, mnt := start(t, out, nil)
	if _, err := os.ReadFile(filepath.Join(mnt, "dogs/sub/b.jpg")); !errors.Is(err, syscall.EIO) {
		t.Errorf("reading the corrupt record: %v, want EIO", err)
	}
	for _, ok := range []string{"README", "cats/tabby 01.jpg", "dogs/sub-x/a.jpg"} {
		got, err := os.ReadFile(filepath.Join(mnt, ok))
		want, _ := os.ReadFile(filepath.Join(src, ok))
		if err != nil || string(got) != string(want) {
			t.Errorf("%s: %v", ok, err)
		}
	}
	// A truncated index refuses to mount with a one-line reason.
	idx := filepath.Join(out, seqfile.IndexName)
	ib, _ := os.ReadFile(idx)
	os.WriteFile(idx, ib[:len(ib)/2], 0o644)
	startFails(t, out, "index")
}

// TestTruncatedRecordIO: a .rec file cut inside a record refuses to mount
// with one line naming the file, the offset and the problem.
func TestTruncatedRecordIO(t *testing.T) {
	src := t.TempDir()
	rec := binary.LittleEndian.AppendUint32(nil, 0xced7230a)
	rec = binary.LittleEndian.AppendUint32(rec, 100)
	rec = append(rec, make([]byte, 40)...)
	if err := os.WriteFile(filepath.Join(src, "train.rec"), rec, 0o644); err != nil {
		t.Fatal(err)
	}
	startFails(t, src, "train.rec", "truncated")
}

// TestBadHDF5: a .h5 file that is not HDF5 refuses to mount with one line
// naming it.
func TestBadHDF5(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "bad.h5"), []byte("\x89HDF\r\n\x1a\nnot really"), 0o644); err != nil {
		t.Fatal(err)
	}
	startFails(t, src, "bad.h5", "HDF5")
}

// TestCoalescedPrefetch: over a pack, an announced shuffled epoch is
// prefetched in runs of neighbouring records: under half a PFS read call
// per sample, every sample right.
func TestCoalescedPrefetch(t *testing.T) {
	src := t.TempDir()
	if _, err := datagen.ImageFolder(filepath.Join(src, "train"), datagen.Spec{Classes: 4, Files: 400, MeanSize: 3000, Seed: 4}); err != nil {
		t.Fatal(err)
	}
	out := pack(t, src, 2)
	n, mnt := start(t, out, nil)
	if err := os.WriteFile(filepath.Join(mnt, ".dlfs/control"), []byte("job=j root=train seed=9 epoch=0 lookahead=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for n.Stats().Fetched["pfs"].Reads < 400 {
		if time.Now().After(deadline) {
			t.Fatalf("prefetched %d of 400 samples", n.Stats().Fetched["pfs"].Reads)
		}
		time.Sleep(10 * time.Millisecond)
	}
	conformance.Tree(t, src, mnt)
	st := n.Stats()
	if st.Coalescing.Reads == 0 || st.Coalescing.CallsPerSample > 0.5 {
		t.Errorf("coalescing %+v: want under half a PFS call per sample", st.Coalescing)
	}
	t.Logf("coalescing: %+v", st.Coalescing)
}

// TestPackedCluster: two nodes over one pack share it as over a tree:
// every byte right through b, the files a owns read from a, and the pack
// read about once between them.
func TestPackedCluster(t *testing.T) {
	src := conformance.OddTree(t, t.TempDir())
	out := pack(t, src, 2)
	_, mntA, _, mntB := startPair(t, out)
	conformance.Tree(t, src, mntB)
	var sa, sb Stats
	readJSON(t, filepath.Join(mntA, ".dlfs/stats"), &sa)
	readJSON(t, filepath.Join(mntB, ".dlfs/stats"), &sb)
	if sb.Served["peer"].Reads == 0 || sa.Cluster.ServedToPeers == 0 {
		t.Fatalf("no block moved between the nodes: b served %+v", sb.Served)
	}
	data := sa.Fetched["pfs"].Bytes + sb.Fetched["pfs"].Bytes
	if data != sb.Catalog.Bytes {
		t.Errorf("the nodes fetched %d sample bytes from the pack for a %d-byte tree read once", data, sb.Catalog.Bytes)
	}
}

// TestTruncatedShard: a shard cut short fails the reads of the records it
// lost with EIO; the records before the cut read fine.
func TestTruncatedShard(t *testing.T) {
	src := conformance.OddTree(t, t.TempDir())
	out := pack(t, src, 1)
	ix, err := seqfile.ReadIndex(out)
	if err != nil {
		t.Fatal(err)
	}
	recs := ix.Records()
	last, prev := recs[len(recs)-1], recs[len(recs)-2]
	if err := os.Truncate(filepath.Join(out, ix.Shards[0]), last.DataOffset()+last.Length/2); err != nil {
		t.Fatal(err)
	}
	_, mnt := start(t, out, nil)
	if _, err := os.ReadFile(filepath.Join(mnt, last.Name)); !errors.Is(err, syscall.EIO) {
		t.Errorf("reading %s past the cut: %v, want EIO", last.Name, err)
	}
	got, err := os.ReadFile(filepath.Join(mnt, prev.Name))
	want, _ := os.ReadFile(filepath.Join(src, prev.Name))
	if err != nil || string(got) != string(want) {
		t.Errorf("reading %s before the cut: %v", prev.Name, err)
	}
}

// TestCorruptRecordInRun: a corrupt record inside a coalesced run fails
// only its own reads; its neighbours, fetched in the same run, read right.
func TestCorruptRecordInRun(t *testing.T) {
	src := t.TempDir()
	files, err := datagen.ImageFolder(filepath.Join(src, "train"), datagen.Spec{Classes: 2, Files: 100, MeanSize: 3000, Seed: 6})
	if err != nil {
		t.Fatal(err)
	}
	out := pack(t, src, 1)
	ix, _ := seqfile.ReadIndex(out)
	bad := "train/" + files[50].Path
	e, _ := ix.Lookup(bad)
	shard := filepath.Join(out, ix.Shards[0])
	b, _ := os.ReadFile(shard)
	b[e.DataOffset()+10] ^= 0xff
	os.WriteFile(shard, b, 0o644)
	n, mnt := start(t, out, nil)
	if err := os.WriteFile(filepath.Join(mnt, ".dlfs/control"), []byte("job=j root=train seed=2 epoch=0 lookahead=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for n.Stats().Fetched["pfs"].Reads < 99 {
		if time.Now().After(deadline) {
			t.Fatalf("prefetched %d of 99 good samples", n.Stats().Fetched["pfs"].Reads)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, f := range files {
		p := "train/" + f.Path
		got, err := os.ReadFile(filepath.Join(mnt, p))
		if p == bad {
			if !errors.Is(err, syscall.EIO) {
				t.Errorf("the corrupt record: %v, want EIO", err)
			}
			continue
		}
		want, _ := os.ReadFile(filepath.Join(src, p))
		if err != nil || string(got) != string(want) {
			t.Errorf("%s: %v", p, err)
		}
	}
}

// pack packs src into shards and returns the pack's directory.
func pack(t *testing.T, src string, shards int) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "pack")
	if _, err := packer.Pack(context.Background(), packer.Config{Source: src, Out: out, Shards: shards}); err != nil {
		t.Fatal(err)
	}
	return out
}
