package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Two users of one mount (--allow-other): alice (uid 1001, group users,
// which may write the control file) and bob (uid 1002).
var (
	alice = &syscall.Credential{Uid: 1001, Gid: 100, Groups: []uint32{}}
	bob   = &syscall.Credential{Uid: 1002, Gid: 1002, Groups: []uint32{}}
)

// as runs a command as cred and returns its combined output.
func as(cred *syscall.Credential, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// holdReader starts, as cred, a Python process that reads files (in
// order, each whole) and then waits for its stdin to close, so that its
// stream and inferred job live on while the test looks; the cleanup ends
// it.
func holdReader(t *testing.T, cred *syscall.Credential, files []string) int {
	t.Helper()
	script := `
import sys
for p in sys.argv[1:]:
    with open(p, "rb") as f:
        f.read()
print("read", flush=True)
sys.stdin.read()
`
	cmd := exec.Command("/usr/bin/python3", append([]string{"-c", script}, files...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "read\n" {
		t.Fatalf("reader as uid %d: %q %v", cred.Uid, line, err)
	}
	go io.Copy(io.Discard, out)
	return cmd.Process.Pid
}

// TestOtherUsers: with --allow-other, what one user does never shows the
// other's names nor changes the other's jobs.
//   - Bob's reader, scanning the public class, gets an inferred job over
//     the dataset that plans none of alice's private class (0700): its
//     plan files are his, and readable by all only because everything in
//     them is.
//   - Alice's reader of her private class gets an inferred job whose plan
//     files are hers alone (0400 under a 0500 directory): bob cannot list
//     or read them.
//   - Bob's stats and stats.prom show his stream and job and none of
//     alice's; root sees both.
//   - Alice announces a job; bob reads one file late in her plan: her
//     cursor does not move (it jumped past 300 samples read by no one).
func TestOtherUsers(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to act as other users")
	}
	src := t.TempDir()
	os.Chmod(src, 0o755)
	mk := func(dir string, mode os.FileMode, n int, name string) []string {
		full := filepath.Join(src, dir)
		os.MkdirAll(full, 0o755)
		var out []string
		for i := 0; i < n; i++ {
			p := filepath.Join(full, fmt.Sprintf(name, i))
			os.WriteFile(p, randomBytes(2000+i, uint64(i)), 0o644)
			os.Chown(p, 1001, 100)
			out = append(out, filepath.Join(dir, fmt.Sprintf(name, i)))
		}
		os.Chown(full, 1001, 100)
		os.Chmod(full, mode)
		return out
	}
	pub := mk("data/pub", 0o755, 600, "%04d.jpg")
	mk("data/alice", 0o700, 50, "secret-%02d.jpg")
	other := mk("other/c", 0o755, 500, "%04d.jpg")
	mnt := t.TempDir()
	os.Chmod(mnt, 0o755)
	os.Chmod(filepath.Dir(mnt), 0o755)
	d := startMount(t, bin.dlfs, mnt, "mount", "--allow-other", "--push=false", "--control-group", "users", src, mnt)
	at := func(rel []string) []string {
		out := make([]string, len(rel))
		for i, r := range rel {
			out[i] = filepath.Join(d.Mnt, r)
		}
		return out
	}

	// Bob scans the public class.
	bobPid := holdReader(t, bob, at(pub))
	bobJob := fmt.Sprintf("auto-%d", bobPid)
	waitFor(t, "bob's inferred job", 30*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(d.Mnt, ".dlfs/jobs", bobJob, "rank-0/epoch-0"))
		return err == nil
	})
	plan, err := os.ReadFile(filepath.Join(d.Mnt, ".dlfs/jobs", bobJob, "rank-0/epoch-0"))
	if err != nil || strings.Contains(string(plan), "alice") || strings.Count(string(plan), "\n") != len(pub) {
		t.Errorf("bob's plan (%v): %d lines, alice's files in it: %v", err, strings.Count(string(plan), "\n"), strings.Contains(string(plan), "alice"))
	}
	checkOwner(t, filepath.Join(d.Mnt, ".dlfs/jobs", bobJob), 1002, 0o555)
	checkOwner(t, filepath.Join(d.Mnt, ".dlfs/jobs", bobJob, "rank-0/epoch-0"), 1002, 0o444)

	// Alice reads her private class.
	alicePid := holdReader(t, alice, at([]string{"data/alice/secret-00.jpg", "data/alice/secret-01.jpg", "data/alice/secret-02.jpg",
		"data/alice/secret-03.jpg", "data/alice/secret-04.jpg", "data/alice/secret-05.jpg", "data/alice/secret-06.jpg",
		"data/alice/secret-07.jpg", "data/alice/secret-08.jpg", "data/alice/secret-09.jpg", "data/alice/secret-10.jpg",
		"data/alice/secret-11.jpg"}))
	aliceJob := fmt.Sprintf("auto-%d", alicePid)
	alicePlan := filepath.Join(d.Mnt, ".dlfs/jobs", aliceJob, "rank-0/epoch-0")
	waitFor(t, "alice's inferred job", 30*time.Second, func() bool { _, err := os.Stat(alicePlan); return err == nil })
	checkOwner(t, filepath.Join(d.Mnt, ".dlfs/jobs", aliceJob), 1001, 0o500)
	checkOwner(t, alicePlan, 1001, 0o400)
	if out, err := as(bob, "cat", alicePlan); err == nil || strings.Contains(out, "secret") {
		t.Errorf("bob read alice's plan: %v %q", err, out[:min(len(out), 80)])
	}
	if out, err := as(bob, "ls", filepath.Join(d.Mnt, ".dlfs/jobs", aliceJob)); err == nil {
		t.Errorf("bob listed alice's job: %q", out)
	}
	if out, err := as(alice, "cat", alicePlan); err != nil || !strings.Contains(out, "data/alice/secret-00.jpg") {
		t.Errorf("alice cannot read her own plan: %v %q", err, out[:min(len(out), 80)])
	}

	// What each sees of the other in the stats.
	out, err := as(bob, "cat", filepath.Join(d.Mnt, ".dlfs/stats"))
	if err != nil {
		t.Fatalf("bob reads the stats: %v %s", err, out)
	}
	var st struct {
		Streams []struct {
			Uid uint32 `json:"uid"`
			Job string `json:"job"`
		} `json:"streams"`
		Jobs map[string]any `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	if _, ok := st.Jobs[aliceJob]; ok || st.Jobs[bobJob] == nil || strings.Contains(out, "secret") {
		t.Errorf("bob's stats show jobs %v", keys(st.Jobs))
	}
	for _, s := range st.Streams {
		if s.Uid != 1002 {
			t.Errorf("bob's stats show a stream of uid %d (job %q)", s.Uid, s.Job)
		}
	}
	if prom, err := as(bob, "cat", filepath.Join(d.Mnt, ".dlfs/stats.prom")); err != nil || strings.Contains(prom, aliceJob) {
		t.Errorf("bob's stats.prom (%v) names alice's job: %v", err, strings.Contains(prom, aliceJob))
	}
	all := dlfsStats(t, d.Mnt)
	if jobs, _ := all["jobs"].(map[string]any); jobs[aliceJob] == nil || jobs[bobJob] == nil {
		t.Errorf("root's stats show jobs %v", keys(jobs))
	}

	// Alice announces a job and reads its first ten samples; bob reads a
	// file late in her plan.
	ctl := filepath.Join(d.Mnt, ".dlfs/control")
	if out, err := as(alice, "sh", "-c", "echo 'job=a root=other sampler=sequential epoch=0 lookahead=1' > "+ctl); err != nil {
		t.Fatalf("alice's job line: %v %s", err, out)
	}
	if out, err := as(bob, "sh", "-c", "echo 'end job=a' > "+ctl); err == nil {
		t.Errorf("bob wrote the control file: %s", out)
	}
	if out, err := as(alice, "cat", at(other[:10])...); err != nil {
		t.Fatalf("alice reads: %v %s", err, out[:min(len(out), 200)])
	}
	cursor := func() (float64, float64) {
		s := dlfsStats(t, d.Mnt)
		return num(s, "jobs", "a", "rank-0", "cursor"), num(s, "jobs", "a", "rank-0", "inferred")
	}
	waitFor(t, "alice's cursor at 10", 30*time.Second, func() bool { c, _ := cursor(); return c == 10 })
	if out, err := as(bob, "cat", filepath.Join(d.Mnt, other[400])); err != nil {
		t.Fatalf("bob reads: %v %s", err, out[:min(len(out), 200)])
	}
	if c, inferred := cursor(); c != 10 || inferred != 0 {
		t.Errorf("bob's read moved alice's cursor to %v (%v samples taken as read)", c, inferred)
	}
	if out, err := as(alice, "cat", at(other[10:12])...); err != nil {
		t.Fatalf("alice reads on: %v %s", err, out[:min(len(out), 200)])
	}
	waitFor(t, "alice's cursor at 12", 30*time.Second, func() bool { c, _ := cursor(); return c == 12 })
}

// checkOwner fails the test unless p belongs to uid with permission bits
// mode.
func checkOwner(t *testing.T, p string, uid uint32, mode os.FileMode) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Errorf("%s: %v", p, err)
		return
	}
	if got := fi.Sys().(*syscall.Stat_t).Uid; got != uid || fi.Mode().Perm() != mode {
		t.Errorf("%s: uid %d mode %v, want uid %d mode %v", p, got, fi.Mode().Perm(), uid, mode)
	}
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// carol (uid 1003, group users) is the user SOURCE's ACLs name in
// TestSourceACLs.
var carol = &syscall.Credential{Uid: 1003, Gid: 100, Groups: []uint32{}}

// TestSourceACLs: with --allow-other, SOURCE's POSIX ACLs (set with
// setfacl) hold through the mount as on SOURCE, and in the plans of jobs,
// and again after a remount from the saved catalog:
//   - a 0644 file with user:1003:--- is denied to carol, readable by bob;
//   - a 0600 file with user:1003:r-- is readable by carol, denied to bob;
//   - a directory with user:1003:--- cannot be listed or entered by carol;
//   - getfacl through the mount shows SOURCE's ACL;
//   - carol's job plans only the samples she may read.
//
// (That the saved catalog keeps ACLs is catalog's TestScanACLs: here the
// remount's background pass re-reads these directories, changed within a
// minute of the scan, and may have done so before the checks.)
func TestSourceACLs(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to act as other users")
	}
	if _, err := exec.LookPath("setfacl"); err != nil {
		t.Fatal("setfacl is missing: scripts/install-deps.sh installs it (Debian package acl)")
	}
	src := t.TempDir()
	os.Chmod(src, 0o755)
	data := filepath.Join(src, "data")
	for _, d := range []string{"pub", "hidden"} {
		if err := os.MkdirAll(filepath.Join(data, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]os.FileMode{"pub/denied.jpg": 0o644, "pub/granted.jpg": 0o600, "hidden/0.jpg": 0o644, "hidden/1.jpg": 0o644}
	for i := range 20 {
		files[fmt.Sprintf("pub/%02d.jpg", i)] = 0o644
	}
	for name, mode := range files {
		p := filepath.Join(data, name)
		if err := os.WriteFile(p, randomBytes(1000, uint64(len(name))), mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"", "pub", "hidden", "pub/denied.jpg", "pub/granted.jpg", "hidden/0.jpg", "hidden/1.jpg"} {
		os.Chown(filepath.Join(data, p), 1001, 100)
	}
	for _, a := range [][2]string{{"u:1003:---", "pub/denied.jpg"}, {"u:1003:r--", "pub/granted.jpg"}, {"u:1003:---", "hidden"}} {
		if out, err := exec.Command("setfacl", "-m", a[0], filepath.Join(data, a[1])).CombinedOutput(); err != nil {
			if strings.Contains(string(out), "Operation not supported") {
				t.Skipf("the filesystem of %s keeps no ACLs: %s", src, out)
			}
			t.Fatalf("setfacl %s %s: %v %s", a[0], a[1], err, out)
		}
	}
	// As on SOURCE itself.
	if _, err := as(carol, "cat", filepath.Join(data, "pub/denied.jpg")); err == nil {
		t.Fatal("carol reads denied.jpg on SOURCE: the ACL is not in force there")
	}

	mnt := t.TempDir()
	os.Chmod(mnt, 0o755)
	os.Chmod(filepath.Dir(mnt), 0o755)
	ssd := t.TempDir()
	args := []string{"mount", "--allow-other", "--push=false", "--control-group", "users", "--ssd-cache", ssd, src, mnt}
	check := func(phase string) {
		t.Helper()
		at := func(p string) string { return filepath.Join(mnt, "data", p) }
		for _, c := range []struct {
			who  *syscall.Credential
			args []string
			ok   bool
		}{
			{carol, []string{"cat", at("pub/denied.jpg")}, false},
			{bob, []string{"cat", at("pub/denied.jpg")}, true},
			{carol, []string{"cat", at("pub/granted.jpg")}, true},
			{bob, []string{"cat", at("pub/granted.jpg")}, false},
			{carol, []string{"ls", at("hidden")}, false},
			{carol, []string{"cat", at("hidden/0.jpg")}, false},
			{bob, []string{"cat", at("hidden/0.jpg")}, true},
			{carol, []string{"cat", at("pub/00.jpg")}, true},
		} {
			out, err := as(c.who, c.args[0], c.args[1:]...)
			if (err == nil) != c.ok {
				t.Errorf("%s: uid %d: %s: %v %q, want allowed %v", phase, c.who.Uid, strings.Join(c.args, " "), err, out[:min(len(out), 80)], c.ok)
			}
		}
		if out, err := exec.Command("getfacl", "-n", "--omit-header", at("pub/denied.jpg")).CombinedOutput(); err != nil || !strings.Contains(string(out), "user:1003:---") {
			t.Errorf("%s: getfacl through the mount: %v %q, want user:1003:---", phase, err, out)
		}
		ctl := filepath.Join(mnt, ".dlfs/control")
		if out, err := as(carol, "sh", "-c", "echo 'job=carol root=data sampler=sequential epoch=0' > "+ctl); err != nil {
			t.Fatalf("%s: carol's job line: %v %s", phase, err, out)
		}
		plan := filepath.Join(mnt, ".dlfs/jobs/carol/rank-0/epoch-0")
		waitFor(t, "carol's plan", 30*time.Second, func() bool { _, err := os.Stat(plan); return err == nil })
		out, err := as(carol, "cat", plan)
		if err != nil {
			t.Fatalf("%s: carol reads her plan: %v %s", phase, err, out)
		}
		if strings.Contains(out, "denied.jpg") || strings.Contains(out, "hidden/") || !strings.Contains(out, "granted.jpg") ||
			strings.Count(out, "\n") != 21 {
			t.Errorf("%s: carol's plan has denied.jpg %v, hidden/ %v, granted.jpg %v, %d samples (want 21: pub/ but denied.jpg)",
				phase, strings.Contains(out, "denied.jpg"), strings.Contains(out, "hidden/"), strings.Contains(out, "granted.jpg"), strings.Count(out, "\n"))
		}
	}
	d := startMount(t, bin.dlfs, mnt, args...)
	check("mounted")
	waitFor(t, "the catalog to be saved", 30*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(ssd, "catalog.snap"))
		return err == nil
	})
	d.stop(t)
	d = startMount(t, bin.dlfs, mnt, args...)
	if !strings.Contains(d.Stderr.String(), "loaded the saved snapshot") {
		t.Errorf("the remount did not start from the saved catalog:\n%s", d.Stderr)
	}
	check("remounted")
}
