package control

// Tests of the parser's bounds at their exact values, written against the
// mutants gremlins left alive (make mutate, docs/mutation.md): every
// limit is accepted at itself and refused one past it.

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func parseOne(t *testing.T, line string) (Command, error) {
	t.Helper()
	cmds, err := Parse([]byte(line))
	if err != nil {
		return nil, err
	}
	if len(cmds) != 1 {
		t.Fatalf("%q: %d commands, want 1", line, len(cmds))
	}
	return cmds[0], nil
}

func TestParseWriteLimit(t *testing.T) {
	// One write of exactly MaxWrite bytes: a job line padded with comments.
	line := "epoch=1\n"
	pad := strings.Repeat("#"+strings.Repeat("x", 99)+"\n", (MaxWrite-len(line))/101)
	exact := line + pad
	exact += strings.Repeat("#", MaxWrite-len(exact))
	if len(exact) != MaxWrite {
		t.Fatalf("built %d bytes, want %d", len(exact), MaxWrite)
	}
	if _, err := Parse([]byte(exact)); err != nil {
		t.Fatalf("a write of exactly MaxWrite bytes: %v", err)
	}
	if _, err := Parse([]byte(exact + "#")); !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), fmt.Sprint(MaxWrite+1)) {
		t.Fatalf("a write of MaxWrite+1 bytes: %v, want ErrSyntax naming its size", err)
	}
}

func TestParsePathLimit(t *testing.T) {
	paths := func(n int) string {
		ps := make([]string, n)
		for i := range ps {
			ps[i] = fmt.Sprintf("d/%d", i)
		}
		return strings.Join(ps, " ")
	}
	for _, verb := range []string{"warmup", "evict", "check"} {
		c, err := parseOne(t, verb+" "+paths(MaxPaths))
		if err != nil {
			t.Fatalf("%s of MaxPaths paths: %v", verb, err)
		}
		var got []string
		switch c := c.(type) {
		case Warmup:
			got = c.Paths
		case Evict:
			got = c.Paths
		case Check:
			got = c.Paths
		}
		if len(got) != MaxPaths || got[MaxPaths-1] != fmt.Sprintf("d/%d", MaxPaths-1) {
			t.Fatalf("%s: %d paths, last %q", verb, len(got), got[len(got)-1])
		}
		_, err = parseOne(t, verb+" "+paths(MaxPaths+1))
		want := fmt.Sprintf("%s of %d paths; at most %d", verb, MaxPaths+1, MaxPaths)
		if !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s of MaxPaths+1 paths: %v, want %q", verb, err, want)
		}
	}
}

func TestClip(t *testing.T) {
	s64 := strings.Repeat("a", 64)
	if got := clip(s64); got != s64 {
		t.Errorf("clip of 64 bytes = %q, want it whole", got)
	}
	if got := clip(s64 + "b"); got != s64+"..." {
		t.Errorf("clip of 65 bytes = %q, want 64 and ...", got)
	}
}

func TestRankLimits(t *testing.T) {
	top := fmt.Sprint(MaxWorld - 1)
	over := fmt.Sprint(MaxWorld)
	for _, c := range []struct {
		line string
		ok   bool
	}{
		{"epoch=0 world=65536 rank=" + top, true},
		{"epoch=0 world=65536 ranks=0," + top, true},
		{"epoch=0 rank=" + over, false},
		{"epoch=0 ranks=1," + over, false},
		{"epoch=0 rank=-1", false},
		{"epoch=0 ranks=-1", false},
		{strings.Replace(goodReport, "rank=1", "rank="+top, 1), true},
		{strings.Replace(goodReport, "rank=1", "rank="+over, 1), false},
		{strings.Replace(goodReport, "rank=1", "rank=-1", 1), false},
		{"epoch=0 world=65536", true},
		{"epoch=0 world=65537", false},
		{"epoch=0 world=0", false},
		{fmt.Sprintf("epoch=%d", MaxEpoch), true},
		{fmt.Sprintf("epoch=%d", MaxEpoch+1), false},
		{"epoch=-1", false},
	} {
		_, err := parseOne(t, c.line)
		if (err == nil) != c.ok {
			t.Errorf("%q: %v, want ok=%v", c.line, err, c.ok)
		}
	}
	c, err := parseOne(t, "epoch=0 world=65536 rank="+top)
	if err != nil || c.(Job).Ranks[0] != MaxWorld-1 {
		t.Fatalf("rank=%s: %v, %v", top, c, err)
	}
}

func TestNameRule(t *testing.T) {
	for _, name := range []string{"a", "z", "A", "Z", "0", "9", ".a", "_", "-", "a.b_c-D9", strings.Repeat("n", 64), "..."} {
		if !validName(name) {
			t.Errorf("%q refused, want a valid name", name)
		}
	}
	// Each neighbour of an accepted range in ASCII, and the rest.
	for _, name := range []string{"", ".", "..", strings.Repeat("n", 65), "`", "{", "@", "[", "/", ":", "a b", "a/b", "é", "a,b", "a=b"} {
		if validName(name) {
			t.Errorf("%q accepted, want it refused", name)
		}
	}
}

func TestParseTorch(t *testing.T) {
	for in, want := range map[string]bool{
		"2.7": true, "2.7.0+cu121": true, "2.10": true, "2.9": true, "3.0": true, "10.0": true,
		"2.6": false, "1.13.1": false, "0.4": false, "0.4.1": false, "2.0": false, "2.7a": true, "1.9": false,
	} {
		got, err := parseTorch(in)
		if err != nil || got != want {
			t.Errorf("parseTorch(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"2", "x.7", "2.x", "-1.0", "2.-7", ""} {
		if _, err := parseTorch(in); err == nil {
			t.Errorf("parseTorch(%q) accepted", in)
		}
	}
}

// TestLineOmitsUnset: Line writes the optional parts only when set, with
// no stray separators, and parses back.
func TestLineOmitsUnset(t *testing.T) {
	j := DefaultJob()
	j.Ranks = nil
	line := j.Line()
	if strings.HasPrefix(line, " ") || strings.Contains(line, "  ") || strings.Contains(line, "ranks=") {
		t.Fatalf("Line() = %q: a stray space or an empty ranks=", line)
	}
	if !strings.HasPrefix(line, "job=") {
		t.Fatalf("Line() = %q, want it to start with job=", line)
	}
	if _, err := parseOne(t, line); err != nil {
		t.Fatalf("Line() %q does not parse: %v", line, err)
	}

	r := Report{Job: "a", Rank: 0, Epoch: 0, Batch: 1, Workers: 0, Prefetch: 2, Samples: 1}
	want := "report job=a rank=0 epoch=0 batch=1 workers=0 prefetch=2 step=0 wait=0 decode=0 cpu=0 samples=1"
	if got := r.Line(); got != want {
		t.Fatalf("Report.Line() = %q, want %q", got, want)
	}
	back, err := parseOne(t, want)
	if err != nil || back != r {
		t.Fatalf("%q parsed to %#v, %v; want %#v", want, back, err, r)
	}
	r.Pid, r.Start, r.Length = 1, 0.25, 1
	if got := r.Line(); got != want+" pid=1 start=0.25 length=1" {
		t.Fatalf("Report.Line() = %q with pid, start and length set", got)
	}
}
