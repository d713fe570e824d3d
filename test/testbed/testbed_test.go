package testbed

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func newBed(t *testing.T, hosts int) *Bed {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("the test bed needs root")
	}
	b, err := New(Config{Hosts: hosts, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

func output(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v: %s", cmd.Args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestHostsTalkAndMountApart: hosts reach each other by name over the
// bridge; what one mounts neither the others nor the test see; an alias
// resolves to several hosts.
func TestHostsTalkAndMountApart(t *testing.T) {
	b := newBed(t, 3)
	h := b.Hosts()
	// h00 listens; h01 connects to it by name and reads its greeting.
	srv := h[0].Command("python3", "-c", `
import socket
s = socket.socket(); s.bind(("0.0.0.0", 7000)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); c.sendall(b"hello from h00"); c.close()`)
	stdout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := stdout.Read(buf); err != nil || string(buf) != "ready" && !strings.HasPrefix(string(buf), "ready") {
		t.Fatalf("server: %q, %v", buf, err)
	}
	got := output(t, h[1].Command("python3", "-c", `
import socket
s = socket.create_connection(("h00", 7000), timeout=10); print(s.recv(100).decode())`))
	if got != "hello from h00" {
		t.Errorf("h01 read %q from h00", got)
	}
	srv.Wait()

	// A mount on h00 shows only there.
	mnt := filepath.Join(h[0].Dir, "m")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	output(t, h[0].Command("mount", "-t", "tmpfs", "tmpfs", mnt))
	output(t, h[0].Command("sh", "-c", "echo inside > "+mnt+"/f"))
	if b, err := os.ReadFile(h[0].Path(mnt + "/f")); err != nil || string(b) != "inside\n" {
		t.Errorf("h00's file through its Path: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "f")); err == nil {
		t.Error("h00's mount shows in the test's namespace")
	}
	if _, err := os.Stat(h[1].Path(mnt + "/f")); err == nil {
		t.Error("h00's mount shows on h01")
	}
	if !strings.Contains(mustRead(t, h[0].MountInfo()), mnt) || strings.Contains(mustRead(t, h[1].MountInfo()), mnt) {
		t.Error("mountinfo: want h00's mount in h00's only")
	}

	// An alias with two addresses.
	if err := b.Alias("seeds", h[0], h[2]); err != nil {
		t.Fatal(err)
	}
	got = output(t, h[1].Command("python3", "-c", `
import socket
print(" ".join(sorted({a[4][0] for a in socket.getaddrinfo("seeds", 1, proto=socket.IPPROTO_TCP)})))`))
	if got != h[0].Addr+" "+h[2].Addr {
		t.Errorf("seeds resolves to %q on h01, want %s and %s", got, h[0].Addr, h[2].Addr)
	}
}

// TestLinkControls: a cap shows as tbf on both ends of the link, a link
// cut is down and restored up, a stopped host's namespace is gone, and
// an added host joins the network.
func TestLinkControls(t *testing.T) {
	b := newBed(t, 2)
	h := b.Hosts()
	if err := h[1].SetBandwidth(80_000_000); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{output(t, exec.Command("tc", "qdisc", "show", "dev", h[1].veth)),
		output(t, h[1].Command("tc", "qdisc", "show", "dev", "eth0"))} {
		if !strings.Contains(q, "tbf") || !strings.Contains(q, "80Mbit") {
			t.Errorf("qdisc after a cap of 80 Mbit/s: %s", q)
		}
	}
	if err := h[1].SetBandwidth(0); err != nil {
		t.Fatal(err)
	}
	if q := output(t, exec.Command("tc", "qdisc", "show", "dev", h[1].veth)); strings.Contains(q, "tbf") {
		t.Errorf("qdisc after the cap was lifted: %s", q)
	}
	// A dropped port stops answering; another port of the host answers.
	listen := func(port string) *exec.Cmd {
		c := h[0].Command("python3", "-c", `
import socket, sys
s = socket.socket(); s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(8); print("ready", flush=True)
while True: s.accept()[0].close()`, port)
		out, err := c.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		if _, err := out.Read(make([]byte, 5)); err != nil {
			t.Fatal(err)
		}
		return c
	}
	listen("7001")
	listen("7002")
	if err := h[0].DropPort(7001); err != nil {
		t.Fatal(err)
	}
	dial := func(port string) error {
		return h[1].Command("python3", "-c", `
import socket, sys
socket.create_connection(("h00", int(sys.argv[1])), timeout=1)`, port).Run()
	}
	if err := dial("7002"); err != nil {
		t.Errorf("h00's open port: %v", err)
	}
	if err := dial("7001"); err == nil {
		t.Error("h00's dropped port answered")
	}
	if err := h[0].LinkDown(); err != nil {
		t.Fatal(err)
	}
	if s := mustRead(t, "/sys/class/net/"+h[0].veth+"/operstate"); !strings.Contains(s, "down") {
		t.Errorf("h00's link after LinkDown: %s", s)
	}
	if err := h[0].LinkUp(); err != nil {
		t.Fatal(err)
	}
	h2, err := b.AddHost()
	if err != nil {
		t.Fatal(err)
	}
	output(t, h2.Command("python3", "-c", `import socket; socket.getaddrinfo("h00", 1)`))
	if err := h[1].Stop(); err != nil {
		t.Fatal(err)
	}
	if nsExists(h[1].netns) || linkExists(h[1].veth) {
		t.Error("a stopped host's namespace or link is still there")
	}
	if n := len(b.Hosts()); n != 2 {
		t.Errorf("%d hosts after one of 3 stopped", n)
	}
}

// TestSweep: a bed whose owner died is removed by the next New.
func TestSweep(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("the test bed needs root")
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	const id = "ffee"
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stateDir, id), []byte(strconv.Itoa(dead.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run("ip", "netns", "add", "dt"+id+"-h00"); err != nil {
		t.Fatal(err)
	}
	if err := run("ip", "link", "add", "dt"+id+"br", "type", "bridge"); err != nil {
		t.Fatal(err)
	}
	newBed(t, 1)
	if nsExists("dt"+id+"-h00") || linkExists("dt"+id+"br") {
		t.Error("a dead owner's bed survived New")
	}
	if _, err := os.Stat(filepath.Join(stateDir, id)); err == nil {
		t.Error("a dead owner's state file survived New")
	}
}

// TestIDsNeverCollide: a New that draws a live bed's id, or the id of
// names a bed left behind, takes another id and touches neither.
func TestIDsNeverCollide(t *testing.T) {
	live := newBed(t, 1)
	const left = "fffc" // a bridge left without a state file
	if err := run("ip", "link", "add", "dt"+left+"br", "type", "bridge"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run("ip", "link", "del", "dt"+left+"br") })
	draws := []string{live.id, left, "fffb"}
	t.Cleanup(func(old func() string) func() { return func() { newID = old } }(newID))
	newID = func() string {
		id := draws[0]
		if len(draws) > 1 {
			draws = draws[1:]
		}
		return id
	}
	b := newBed(t, 1)
	if b.id != "fffb" {
		t.Errorf("the new bed took id %s, want fffb (%s is live, %s left behind)", b.id, live.id, left)
	}
	if !linkExists(live.bridge) || !linkExists("dt"+left+"br") {
		t.Error("New removed another bed's bridge")
	}
	if got := mustRead(t, filepath.Join(stateDir, live.id)); got != strconv.Itoa(os.Getpid()) {
		t.Errorf("the live bed's state file holds %q", got)
	}
	if !nsExists(live.Hosts()[0].netns) {
		t.Error("New removed the live bed's host")
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
