package allocator

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ProcStat reads the node's busy and total CPU time so far from
// /proc/stat's first line, in clock ticks (busy: all but idle and
// iowait): a Config.NodeCPU.
func ProcStat() (busy, total float64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	return parseProcStat(string(b))
}

func parseProcStat(s string) (busy, total float64, err error) {
	line, _, _ := strings.Cut(s, "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", clip(line))
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: field %d %q: %w", i+2, clip(v), err)
		}
		total += float64(n)
		if i != 3 && i != 4 { // idle, iowait
			busy += float64(n)
		}
	}
	return busy, total, nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
