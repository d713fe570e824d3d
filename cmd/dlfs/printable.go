package main

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// printable returns s as dlfs prints it to an operator's terminal. Names
// from SOURCE, peers and jobs are chosen by others: a directory named with
// ESC sequences would rewrite the terminal, a newline would forge a line.
// So s comes back unchanged when every rune is printable (normal UTF-8
// included) and it holds no backslash; otherwise Go-quoted, as slog's text
// handler quotes a value: control bytes, invalid UTF-8 and runes that do
// not print (bidi overrides, say) escaped, the rest as it is. A printed
// backslash thus always starts an escape, and "\x1b" on screen is never
// a name's own text. Every name, message and error a command prints goes
// through it; JSON output needs not (encoding/json escapes control bytes).
func printable(s string) string {
	for i, r := range s {
		if r == '\\' || !unicode.IsPrint(r) || r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD") {
			return strconv.Quote(s)
		}
	}
	return s
}

// printables is printable of each of names.
func printables(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = printable(n)
	}
	return out
}
