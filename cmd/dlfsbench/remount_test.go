package main

import "testing"

// TestLoggedSeconds: the remount's times are read from the daemon's
// text log lines, and a line not logged yet is not a zero.
func TestLoggedSeconds(t *testing.T) {
	log := `time=2026-11-29T07:40:55Z level=INFO msg="catalog: every directory of the saved snapshot revalidated" seconds=1.25` + "\n" +
		`time=2026-11-29T07:40:56Z level=INFO msg="catalog: every entry of the saved snapshot checked against SOURCE" behind=0 seconds=3.5e+00` + "\n"
	if v, ok := loggedSeconds(log, "every directory of the saved snapshot revalidated"); !ok || v != 1.25 {
		t.Errorf("directories: %v, %v", v, ok)
	}
	if v, ok := loggedSeconds(log, "every entry of the saved snapshot checked"); !ok || v != 3.5 {
		t.Errorf("entries: %v, %v", v, ok)
	}
	if _, ok := loggedSeconds(log, "never logged"); ok {
		t.Error("a line never logged was found")
	}
}
