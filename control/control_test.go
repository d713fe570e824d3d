package control

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	cases := []struct {
		name string
		in   string
		n    int    // commands
		err  string // substring of the error; "" for none
	}{
		{"refresh", "refresh\n", 1, ""},
		{"no newline", "refresh", 1, ""},
		{"blank and comments", "\n# a comment\n  refresh  \n\n", 1, ""},
		{"two", "refresh\nrefresh\n", 2, ""},
		{"empty", "", 0, ""},
		{"unknown", "frobnicate\n", 0, `unknown command "frobnicate"`},
		{"bad line names its number", "refresh\nbogus\n", 0, "line 2"},
		{"arguments", "refresh now\n", 0, "takes no arguments"},
		{"huge", strings.Repeat("x", MaxWrite+1), 0, "exceeds"},
		{"warmup", "warmup train val/x\n", 1, ""},
		{"warmup the mount", "warmup .\n", 1, ""},
		{"warmup stop", "warmup stop\n", 1, ""},
		{"evict and check", "evict train\ncheck train val\n", 2, ""},
		{"warmup nothing", "warmup\n", 0, "one or more paths"},
		{"warmup absolute", "warmup /etc\n", 0, "absolute"},
		{"warmup climbing", "check a/../../b\n", 0, "climbs out"},
		{"too many paths", "evict" + strings.Repeat(" a", MaxPaths+1), 0, "at most"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmds, err := Parse([]byte(c.in))
			if c.err == "" {
				if err != nil || len(cmds) != c.n {
					t.Fatalf("got %d commands, %v; want %d", len(cmds), err, c.n)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.err) || !errors.Is(err, ErrSyntax) {
				t.Fatalf("got %v; want an ErrSyntax containing %q", err, c.err)
			}
			if cmds != nil {
				t.Error("a failed parse returned commands")
			}
		})
	}
}

// TestParsePaths: paths come back cleaned, the mount itself as "".
func TestParsePaths(t *testing.T) {
	cmds, err := Parse([]byte("warmup ./train/ a//b .\nevict x/./y\ncheck z\nwarmup stop"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Command{Warmup{Paths: []string{"train", "a/b", ""}}, Evict{Paths: []string{"x/y"}}, Check{Paths: []string{"z"}}, WarmupStop{}}
	if !reflect.DeepEqual(cmds, want) {
		t.Errorf("%#v, want %#v", cmds, want)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"warmup a b\n", "evict ../x", "check /", "refresh\n", "", "# x\nrefresh", "bogus", "refresh x", "\x00\xff", "job=a epoch=1 world=4 ranks=0,1 seed=-5", "end job=a", "epoch=1 dataset=list:x/y torch=2.7", goodReport, "report job=a rank=0 step=nan"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cmds, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrSyntax) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q: want one line wrapping ErrSyntax", err)
			}
			if cmds != nil {
				t.Fatal("commands returned with an error")
			}
		}
		for _, c := range cmds {
			if j, ok := c.(Job); ok {
				if err := j.Validate(); err != nil {
					t.Fatalf("a parsed job fails Validate: %v", err)
				}
				checkLine(t, j.Merge(DefaultJob()))
			}
			if r, ok := c.(Report); ok {
				for _, v := range []float64{r.Step, r.Wait, r.Decode, r.CPU} {
					if !(v >= 0 && v <= MaxReportSeconds) {
						t.Fatalf("report %q accepted a figure %v", r.Line(), v)
					}
				}
				if r.Workers < 0 || r.Workers > MaxReportWorkers || r.Batch < 1 || r.Samples < 1 || r.Prefetch < 1 {
					t.Fatalf("report %q accepted out-of-range counts", r.Line())
				}
			}
		}
	})
}

// checkLine checks that j.Line parses back to j.
func checkLine(t *testing.T, j Job) {
	t.Helper()
	cmds, err := Parse([]byte(j.Line()))
	if err != nil || len(cmds) != 1 {
		t.Fatalf("Line() %q does not parse: %v", j.Line(), err)
	}
	back := cmds[0].(Job).Merge(DefaultJob())
	back.Set, j.Set = nil, nil
	if !reflect.DeepEqual(back, j) {
		t.Fatalf("Line() %q parses to %+v, want %+v", j.Line(), back, j)
	}
}

func TestLineRoundTrip(t *testing.T) {
	for _, s := range []string{
		"epoch=0",
		"job=a root=x/y dataset=list:l.txt extensions=.a,.B sampler=random seed=18446744073709551615 epoch=7 world=8 ranks=3,1 shuffle=0 drop_last=1 batch=9 workers=4 lookahead=3 torch=2.7",
	} {
		cmds, err := Parse([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		checkLine(t, cmds[0].(Job).Merge(DefaultJob()))
	}
}

func TestParseJob(t *testing.T) {
	cmds, err := Parse([]byte("job=imnet root=train dataset=imagefolder sampler=distributed seed=18446744073709551615 epoch=3 world=8 ranks=2,3 shuffle=true drop_last=1 batch=256 workers=8 lookahead=3 torch=2.7.1+cu121 extensions=.jpg,.JPEG\n"))
	if err != nil {
		t.Fatal(err)
	}
	j := cmds[0].(Job).Merge(DefaultJob())
	if j.Name != "imnet" || j.Root != "train" || j.Seed != 1<<64-1 || j.Epoch != 3 || j.World != 8 ||
		len(j.Ranks) != 2 || j.Ranks[1] != 3 || !j.DropLast || j.Batch != 256 || j.Workers != 8 || j.Lookahead != 3 ||
		!j.Torch27 || len(j.Extensions) != 2 {
		t.Errorf("parsed %+v", j)
	}
	if err := j.Check(); err != nil {
		t.Error(err)
	}
	// An update keeps what it does not mention.
	up, err := Parse([]byte("job=imnet epoch=4"))
	if err != nil {
		t.Fatal(err)
	}
	if m := up[0].(Job).Merge(j); m.Epoch != 4 || m.World != 8 || m.Root != "train" {
		t.Errorf("merged update %+v", m)
	}
	r1, _ := Parse([]byte("job=imnet epoch=4 rank=5"))
	if m := r1[0].(Job).Merge(j); len(m.Ranks) != 3 || m.Ranks[2] != 5 {
		t.Errorf("rank=5 should join ranks 2,3: %v", m.Ranks)
	}
	if neg, err := Parse([]byte("seed=-1 epoch=0")); err != nil || neg[0].(Job).Seed != 1<<64-1 {
		t.Errorf("negative seed: %v", err)
	}
	if end, err := Parse([]byte("end job=imnet")); err != nil || end[0].(End).Job != "imnet" {
		t.Errorf("end: %v", err)
	}
	bad := map[string]string{
		"seed=1":                     "epoch=N is required",
		"epoch=1 color=blue":         "unknown key",
		"epoch=x":                    "want an integer",
		"epoch=-1":                   "want an integer",
		"epoch=1 world=0":            "world",
		"epoch=1 rank=1 ranks=2":     "twice",
		"epoch=1 epoch=2":            "twice",
		"epoch=1 ranks=1,1":          "listed twice",
		"epoch=1 job=../x":           "want a name",
		"epoch=1 sampler=weighted":   "want distributed",
		"epoch=1 dataset=hdf5":       "want imagefolder",
		"epoch=1 shuffle=maybe":      "want true or false",
		"epoch=1 torch=two":          "version",
		"epoch=1 lookahead=100":      "lookahead",
		"epoch=1 =x":                 "not key=value",
		"end":                        "end takes exactly",
		"end job=x epoch=1":          "end takes exactly",
		"epoch=1 extensions=.jpg,,x": "empty extension",
		"epoch=1 root=../..":         "climbs out of the mount",
		"epoch=1 rank=-1":            "want an integer",
		"epoch=1 balance=nearest":    "want locality or solar",
		"epoch=1 ranks=0,-1":         "want an integer",
		"epoch=1 root=a/../../b":     "climbs out of the mount",
		"epoch=1 root=/train":        "absolute path",
		"epoch=1 dataset=list:/x":    "absolute path",
		"epoch=1 dataset=list:../x":  "climbs out",
		"epoch=1 dataset=list:.":     "names a file",
	}
	for line, want := range bad {
		if _, err := Parse([]byte(line)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want an error containing %q", line, err, want)
		}
	}
	for line, want := range map[string]string{
		"epoch=1 balance=locality":                      "needs batch",
		"epoch=1 balance=solar batch=32 sampler=random": "sampler=random has none",
		"epoch=1 epochorder=true batch=32":              "needs balance",
	} {
		c, err := Parse([]byte(line))
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if err := c[0].(Job).Merge(DefaultJob()).Check(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: Check gave %v, want an error containing %q", line, err, want)
		}
	}
	if c, _ := Parse([]byte("epoch=1 balance=locality batch=32 epochorder=true")); c[0].(Job).Merge(DefaultJob()).Check() != nil {
		t.Error("a good balance line was refused")
	}
	rankOver := Job{World: 2, Ranks: []int{2}}
	if err := rankOver.Check(); err == nil {
		t.Error("rank >= world accepted")
	}
}

func TestRankJoinsOnlyRegisteredJobs(t *testing.T) {
	c, _ := Parse([]byte("epoch=0 world=4 rank=2"))
	if m := c[0].(Job).Merge(DefaultJob()); len(m.Ranks) != 1 || m.Ranks[0] != 2 {
		t.Errorf("a new job's rank=2 gave ranks %v", m.Ranks)
	}
	c, _ = Parse([]byte("epoch=0"))
	if m := c[0].(Job).Merge(DefaultJob()); len(m.Ranks) != 1 || m.Ranks[0] != 0 {
		t.Errorf("no rank gave ranks %v, want [0]", m.Ranks)
	}
}
