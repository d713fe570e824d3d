package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlfs/dlfs/daemon"
)

// TestDoctorJoin: a --join whose addresses answer is ok; one none of whose
// addresses answers, or that does not resolve, is a warning (the node
// serves alone and keeps trying).
func TestDoctorJoin(t *testing.T) {
	env := fakeEnv(t)
	if c := find(t, checkJoin(env, []string{"127.0.0.1:7946"}), "--join"); c.Level != daemon.OK || !strings.Contains(c.Detail, "1 of 1") {
		t.Errorf("an answering join: %+v", c)
	}
	env.dialTCP = func(string) error { return errors.New("connection refused") }
	if c := find(t, checkJoin(env, []string{"127.0.0.1:7946"}), "--join"); c.Level != daemon.Warn || !strings.Contains(c.Detail, "serve alone") {
		t.Errorf("a silent join: %+v", c)
	}
	if c := find(t, checkJoin(env, []string{"no-such-host.invalid:7946"}), "--join"); c.Level != daemon.Warn || !strings.Contains(c.Detail, "does not resolve") {
		t.Errorf("an unresolvable join: %+v", c)
	}
	if c := find(t, checkJoin(env, []string{"nonsense"}), "--join"); c.Level != daemon.Fail {
		t.Errorf("a join without a port: %+v", c)
	}
}

// TestDoctorLiveMembers: on a live mount, each alive member whose data
// address the daemon could not reach, or doctor cannot dial, fails;
// dead members and the node itself are not checked.
func TestDoctorLiveMembers(t *testing.T) {
	mnt := t.TempDir()
	if err := os.MkdirAll(filepath.Join(mnt, ".dlfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	stats := `{"node":"a","cluster":{"members":[
	  {"name":"a","state":"alive","meta":{"data":"10.0.0.1:7947"}},
	  {"name":"b","state":"alive","meta":{"data":"10.0.0.2:7947"},"data":{"reachable":true}},
	  {"name":"c","state":"alive","meta":{"data":"10.0.0.3:7947"},"data":{"reachable":false,"error":"peer: dial 10.0.0.3:7947: connect: no route to host"}},
	  {"name":"d","state":"alive","meta":{"data":"10.0.0.4:7947"}},
	  {"name":"e","state":"dead","meta":{"data":"10.0.0.5:7947"},"data":{"reachable":false,"error":"x"}}]}}`
	if err := os.WriteFile(filepath.Join(mnt, ".dlfs", "stats"), []byte(stats), 0o644); err != nil {
		t.Fatal(err)
	}
	env := fakeEnv(t)
	var dialed []string
	env.dialTCP = func(a string) error {
		dialed = append(dialed, a)
		return errors.New("connection refused")
	}
	checks := checkLiveMembers(env, mnt, ".dlfs")
	if c := find(t, checks, "member c"); c.Level != daemon.Fail || !strings.Contains(c.Detail, "no route to host") || !strings.Contains(c.Detail, "10.0.0.3:7947") {
		t.Errorf("member c: %+v", c)
	}
	if c := find(t, checks, "member d"); c.Level != daemon.Fail || !strings.Contains(c.Detail, "connection refused") {
		t.Errorf("member d, never dialled by the daemon: %+v", c)
	}
	for _, c := range checks {
		if c.What == "member a" || c.What == "member b" || c.What == "member e" {
			t.Errorf("checked %s: %+v", c.What, c)
		}
	}
	if len(dialed) != 1 || dialed[0] != "10.0.0.4:7947" {
		t.Errorf("doctor dialled %v, want only d's address", dialed)
	}
	env.dialTCP = func(string) error { return nil }
	os.WriteFile(filepath.Join(mnt, ".dlfs", "stats"), []byte(strings.Replace(stats, `"reachable":false,"error":"peer`, `"reachable":true,"error":"peer`, 1)), 0o644)
	if c := find(t, checkLiveMembers(env, mnt, ".dlfs"), "members"); c.Level != daemon.OK || !strings.Contains(c.Detail, "3 other members") {
		t.Errorf("all reachable: %+v", c)
	}
}
