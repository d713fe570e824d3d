package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/dlfs/dlfs/test/mountproc"
)

// A remount from the saved catalog is served only as checked against
// SOURCE (issue 39): the scale suite times, from the remount's start,
// its first byte served (a file looked up, stat'ed against SOURCE, read)
// and, from the daemon's own log, the background pass that revalidates
// every directory and then checks every entry.

// remountTimes reads file (relative to p.Mnt) once the remount p is up,
// began seconds after start, and waits for the daemon's background pass;
// it returns the seconds to the first byte, to every directory
// revalidated and to every entry checked (the last two since the mount).
func remountTimes(p *mountproc.Proc, start time.Time, file string) (firstByte, dirs, entries float64, err error) {
	f, err := os.Open(filepath.Join(p.Mnt, file))
	if err != nil {
		return 0, 0, 0, err
	}
	var b [1]byte
	_, err = f.Read(b[:])
	f.Close()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("the first byte of %s after the remount: %w", file, err)
	}
	firstByte = time.Since(start).Seconds()
	for deadline := time.Now().Add(30 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		log := p.Stderr.String()
		dirs, okDirs := loggedSeconds(log, "every directory of the saved snapshot revalidated")
		entries, okEntries := loggedSeconds(log, "every entry of the saved snapshot checked")
		if okDirs && okEntries {
			return firstByte, dirs, entries, nil
		}
		if time.Now().After(deadline) {
			return firstByte, 0, 0, fmt.Errorf("the remount's background pass did not end within 30 minutes:\n%s", log)
		}
	}
}

// loggedSeconds is the seconds= value of the daemon's log line msg.
func loggedSeconds(log, msg string) (float64, bool) {
	m := regexp.MustCompile(regexp.QuoteMeta(msg) + `[^"\n]*"[^\n]*? seconds=([0-9.e+-]+)`).FindStringSubmatch(log)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	return v, err == nil
}
