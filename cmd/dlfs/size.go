package main

import (
	"fmt"
	"strconv"
	"strings"
)

// sizeValue is a pflag.Value for byte sizes written as people write them:
// 512MiB, 4GiB, 1.5G, 100k, 4096.
type sizeValue int64

var sizeUnits = []struct {
	suffix string
	mult   float64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	// Bare letters mean binary units, as in dd, ls -h and most tools.
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1}, {"", 1},
}

// parseSize parses a human size.
func parseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	for _, u := range sizeUnits {
		num, ok := strings.CutSuffix(t, u.suffix)
		if !ok {
			continue
		}
		num = strings.TrimSpace(num)
		f, err := strconv.ParseFloat(num, 64)
		if err != nil || num == "" || f < 0 || f*u.mult > 1<<62 || strings.ContainsAny(num, "eEnN+xX_") {
			break
		}
		return int64(f * u.mult), nil
	}
	return 0, fmt.Errorf("%q is not a size; write a number with an optional unit, e.g. 512MiB, 4GiB, 100k", s)
}

func (v *sizeValue) String() string { return formatSize(int64(*v)) }
func (v *sizeValue) Type() string   { return "SIZE" }
func (v *sizeValue) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*v = sizeValue(n)
	return nil
}

func formatSize(n int64) string {
	for _, u := range []struct {
		s string
		m int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return fmt.Sprintf("%d%s", n/u.m, u.s)
		}
	}
	return strconv.FormatInt(n, 10)
}
