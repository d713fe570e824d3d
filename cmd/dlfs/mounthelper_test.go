package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestParseHelperArgs: mount(8)'s calls of the helper, as it makes them
// (SPEC DIR [-sfnv] -o OPTS, with rw first), become dlfs mount's
// arguments; options that are mount(8)'s are left out; unknown ones and
// flags given without their value are refused with one line.
func TestParseHelperArgs(t *testing.T) {
	flags := helperFlags()
	for _, tc := range []struct {
		name, argv string
		root       bool
		want, log  string // want: the dlfs arguments
		fake, verb bool
		err        string
	}{
		{name: "plain", argv: "/src /mnt -o rw", root: true, want: "mount /src /mnt", log: "/var/log/dlfs.log"},
		{name: "options", argv: "/src /mnt -o rw,noatime,allow_other,ram-cache=1GiB,_netdev,nofail,join=a:1,join=b:2,log=/tmp/x.log",
			want: "mount --allow-other --ram-cache=1GiB --join=a:1 --join=b:2 /src /mnt", log: "/tmp/x.log"},
		{name: "user log", argv: "/src /mnt", want: "mount /src /mnt", log: "/home/u/.dlfs/dlfs.log"},
		{name: "flags", argv: "/src /mnt -f -v -n -s -o rw", root: true, want: "mount /src /mnt", log: "/var/log/dlfs.log", fake: true, verb: true},
		{name: "joined", argv: "-fv /src -orw,infer=false /mnt", root: true, want: "mount --infer=false /src /mnt", log: "/var/log/dlfs.log", fake: true, verb: true},
		{name: "relative", argv: "src /mnt", root: true, want: "mount " + mustAbs(t, "src") + " /mnt", log: "/var/log/dlfs.log"},
		{name: "config file", argv: "/src /mnt -o rw,config=/etc/dlfs/imagenet.yaml", root: true, want: "mount --config=/etc/dlfs/imagenet.yaml /src /mnt", log: "/var/log/dlfs.log"},
		{name: "unknown", argv: "/src /mnt -o rw,bogus=1", err: `option "bogus=1": dlfs mount has no flag --bogus`},
		{name: "no value", argv: "/src /mnt -o ram-cache", err: `--ram-cache needs a value: ram-cache=VALUE`},
		{name: "hidden", argv: "/src /mnt -o cpu-profile=/x", err: `no flag --cpu-profile`},
		{name: "empty log", argv: "/src /mnt -o log=", err: `want log=PATH`},
		{name: "one arg", argv: "/src -o rw", err: `want SOURCE and MOUNTPOINT`},
		{name: "namespace", argv: "/src /mnt -N 1234", err: `another namespace`},
		{name: "bad flag", argv: "/src /mnt -q", err: `unknown option -q`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseHelperArgs(strings.Fields(tc.argv), flags, tc.root, "/home/u")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(c.args, " "); got != tc.want || c.log != tc.log || c.fake != tc.fake || c.verbose != tc.verb {
				t.Errorf("got %q log %s fake %v verbose %v; want %q log %s fake %v verbose %v", got, c.log, c.fake, c.verbose, tc.want, tc.log, tc.fake, tc.verb)
			}
		})
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	abs, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}
