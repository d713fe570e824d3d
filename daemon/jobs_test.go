package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/dlfs/dlfs/sampler"
	"github.com/dlfs/dlfs/test/datagen"
)

func TestJobPlans(t *testing.T) {
	src := t.TempDir()
	files, err := datagen.ImageFolder(filepath.Join(src, "train"), datagen.Spec{Classes: 3, Files: 30, MeanSize: 100, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, mnt := start(t, src, nil)
	ctl := filepath.Join(mnt, ".dlfs/control")
	write := func(line string) error { return os.WriteFile(ctl, []byte(line+"\n"), 0o644) }
	if err := write("job=j root=train seed=7 epoch=2 world=4 ranks=1,3 lookahead=2"); err != nil {
		t.Fatal(err)
	}
	// ImageFolder order: class by class, files sorted by name.
	var index []string
	for c := 0; c < 3; c++ {
		for _, f := range files {
			if strings.HasPrefix(f.Path, fmt.Sprintf("class_%03d/", c)) {
				index = append(index, "train/"+f.Path)
			}
		}
	}
	for _, rank := range []int{1, 3} {
		for _, epoch := range []int{2, 3} {
			b, err := os.ReadFile(filepath.Join(mnt, fmt.Sprintf(".dlfs/jobs/j/rank-%d/epoch-%d", rank, epoch)))
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, i := range (sampler.Distributed{N: 30, World: 4, Rank: rank, Shuffle: true, Seed: 7}).Epoch(epoch) {
				want = append(want, index[i])
			}
			if got := strings.TrimSpace(string(b)); got != strings.Join(want, "\n") {
				t.Errorf("rank %d epoch %d:\n%s\nwant\n%s", rank, epoch, got, strings.Join(want, "\n"))
			}
		}
	}
	for _, p := range []string{"jobs/j/rank-0/epoch-2", "jobs/j/rank-1/epoch-4", "jobs/j/rank-1/epoch-1", "jobs/nope"} {
		if _, err := os.Stat(filepath.Join(mnt, ".dlfs", p)); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want not-exist", p, err)
		}
	}
	// Bad lines fail with EINVAL and leave the job as it was.
	for _, bad := range []string{"job=j epoch=3 ranks=4", "job=j epoch=3 root=nope", "job=j seed=1", "job=j epoch=3 bogus=1", "end job=zzz"} {
		if err := write(bad); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%q: got %v, want EINVAL", bad, err)
		}
	}
	var st ControlStatus
	readJSON(t, ctl, &st)
	if j, ok := st.Jobs["j"]; !ok || j.Epoch != 2 || j.Samples != 30 || len(j.Ranks) != 2 {
		t.Errorf("job after bad lines: %+v", st.Jobs)
	}
	if !strings.Contains(st.LastError, "no such job") {
		t.Errorf("last_error %q", st.LastError)
	}
	// A new epoch moves the plan at once; end drops the job.
	if err := write("job=j epoch=5"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mnt, ".dlfs/jobs/j/rank-3/epoch-6")); err != nil {
		t.Errorf("epoch 6 after the update: %v", err)
	}
	if err := write("end job=j"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mnt, ".dlfs/jobs/j")); !os.IsNotExist(err) {
		t.Errorf("ended job still listed: %v", err)
	}
}
