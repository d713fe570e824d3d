package fusefs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The kernel's read-ahead for a FUSE mount.
//
// The kernel sends a FUSE file's page-cache reads in requests no larger
// than the mount's read-ahead window. It takes the smaller of what the
// filesystem asks for at INIT (MaxReadAhead) and its device's default,
// read_ahead_kb in /sys/class/bdi/MAJOR:MINOR, 128 KiB: so a reader of
// 1 MiB buffers got eight 128 KiB READs per block, each a round trip to
// the daemon. SetReadAhead raises the device's window to the size asked
// for, as an administrator would with read_ahead_kb (root only; the
// window is per mount and goes with it).

// SetReadAhead sets the read-ahead window of the FUSE mount at dir to
// bytes, at most its max_read, if it is smaller. It returns the window
// now in force.
func SetReadAhead(dir string, bytes int) (int, error) {
	m, ok := MountAt(dir)
	if !ok || !m.IsFUSE() {
		return 0, fmt.Errorf("fusefs: read-ahead of %s: not a FUSE mount", dir)
	}
	path := "/sys/class/bdi/" + m.Dev + "/read_ahead_kb"
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("fusefs: read-ahead of %s: %w", dir, err)
	}
	kb, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("fusefs: read-ahead of %s: %s holds %q", dir, path, b)
	}
	for _, o := range strings.Split(m.Options, ",") {
		if v, found := strings.CutPrefix(o, "max_read="); found {
			if n, err := strconv.Atoi(v); err == nil && n > 0 {
				bytes = min(bytes, n) // no request is larger
			}
		}
	}
	want := bytes >> 10
	if kb >= want {
		return kb << 10, nil
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(want)), 0); err != nil {
		return kb << 10, fmt.Errorf("fusefs: read-ahead of %s: %w (the kernel sends reads of %d KiB)", dir, err, kb)
	}
	return want << 10, nil
}
