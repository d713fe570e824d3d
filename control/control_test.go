package control

import (
	"errors"
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

func FuzzParse(f *testing.F) {
	for _, s := range []string{"refresh\n", "", "# x\nrefresh", "bogus", "refresh x", "\x00\xff"} {
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
	})
}
