package control

import (
	"errors"
	"math"
	"strings"
	"testing"
)

const goodReport = "report job=a rank=1 epoch=3 batch=32 workers=4 prefetch=2 step=0.02 wait=0.001 decode=0.004 cpu=0.003 samples=640 pid=4242 start=0.5 length=6400"

func TestParseReport(t *testing.T) {
	cmds, err := Parse([]byte(goodReport))
	if err != nil {
		t.Fatal(err)
	}
	want := Report{Job: "a", Rank: 1, Epoch: 3, Batch: 32, Workers: 4, Prefetch: 2, Step: 0.02, Wait: 0.001, Decode: 0.004, CPU: 0.003, Samples: 640, Pid: 4242, Start: 0.5, Length: 6400}
	if len(cmds) != 1 || cmds[0] != want {
		t.Fatalf("%#v, want %#v", cmds, want)
	}
	back, err := Parse([]byte(want.Line()))
	if err != nil || back[0] != want {
		t.Fatalf("Line %q parsed back to %#v, %v", want.Line(), back, err)
	}
	noPrefetch := strings.Replace(goodReport, " prefetch=2", "", 1)
	if cmds, err := Parse([]byte(noPrefetch)); err != nil || cmds[0].(Report).Prefetch != 2 {
		t.Fatalf("without prefetch: %#v, %v; want prefetch 2", cmds, err)
	}
}

// TestReportImpossible: impossible figures are refused, each with one line
// naming the key.
func TestReportImpossible(t *testing.T) {
	cases := map[string]string{
		"negative":           strings.Replace(goodReport, "step=0.02", "step=-0.02", 1),
		"NaN":                strings.Replace(goodReport, "wait=0.001", "wait=NaN", 1),
		"infinite":           strings.Replace(goodReport, "decode=0.004", "decode=+Inf", 1),
		"huge seconds":       strings.Replace(goodReport, "cpu=0.003", "cpu=1e300", 1),
		"workers beyond":     strings.Replace(goodReport, "workers=4", "workers=100000", 1),
		"negative workers":   strings.Replace(goodReport, "workers=4", "workers=-1", 1),
		"zero batch":         strings.Replace(goodReport, "batch=32", "batch=0", 1),
		"zero samples":       strings.Replace(goodReport, "samples=640", "samples=0", 1),
		"missing key":        strings.Replace(goodReport, " wait=0.001", "", 1),
		"unknown key":        goodReport + " gpu=1",
		"twice":              goodReport + " rank=2",
		"bad name":           strings.Replace(goodReport, "job=a", "job=../x", 1),
		"not a number":       strings.Replace(goodReport, "step=0.02", "step=fast", 1),
		"bare word":          goodReport + " x",
		"prefetch zero":      strings.Replace(goodReport, "prefetch=2", "prefetch=0", 1),
		"report with no key": "report",
	}
	for name, line := range cases {
		cmds, err := Parse([]byte(line))
		if err == nil || !errors.Is(err, ErrSyntax) || cmds != nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %q gave %v, %v; want one ErrSyntax line", name, line, cmds, err)
		}
	}
	if _, err := parseSeconds("1e5"); err != nil {
		t.Errorf("the limit itself is refused: %v", err)
	}
	if v, err := parseSeconds("0"); err != nil || v != 0 || math.Signbit(v) {
		t.Errorf("0: %v, %v", v, err)
	}
}
