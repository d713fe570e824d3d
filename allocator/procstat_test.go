package allocator

import (
	"strings"
	"testing"
)

func TestParseProcStat(t *testing.T) {
	busy, total, err := parseProcStat("cpu  100 5 50 800 40 1 2 0 0 0\ncpu0 50 2 25 400 20 0 1 0 0 0\n")
	if err != nil || busy != 158 || total != 998 {
		t.Errorf("busy %v total %v err %v; want 158 and 998", busy, total, err)
	}
	if _, _, err := ProcStat(); err != nil {
		t.Errorf("this machine's /proc/stat: %v", err)
	}
}

func FuzzParseProcStat(f *testing.F) {
	for _, s := range []string{"cpu  100 5 50 800 40 1 2 0 0 0\n", "", "cpu 1 2", "intr 1 2 3 4 5 6", "cpu -1 2 3 4 5 6", "cpu " + strings.Repeat("9", 30) + " 1 1 1 1 1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		busy, total, err := parseProcStat(s)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error of more than one line: %q", err)
			}
			return
		}
		if busy < 0 || busy > total {
			t.Fatalf("busy %v of %v", busy, total)
		}
	})
}
