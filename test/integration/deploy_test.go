package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDeployFiles checks deploy/ with the tools Debian has: the systemd
// unit with systemd-analyze verify (as an instance, its dlfs the one just
// built), the DaemonSet with yamllint and for what it must hold
// (privileged, bidirectional propagation of the mount, the key from a
// Secret, readiness on .dlfs/stats, a clean stop). The flags both give
// dlfs are checked in cmd/dlfs, the dashboard's metrics in daemon.
func TestDeployFiles(t *testing.T) {
	unit, err := os.ReadFile("../../deploy/systemd/dlfs@.service")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	inst := filepath.Join(dir, "dlfs@imagenet.service")
	if err := os.WriteFile(inst, []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/dlfs", bin.dlfs)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("systemd-analyze", "verify", "--man=no", inst).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify dlfs@.service: %v\n%s", err, out)
	}
	for _, want := range []string{"LoadCredential=cluster-key:", "${CREDENTIALS_DIRECTORY}/cluster-key", "KillSignal=SIGTERM", "ExecStopPost=-", "dlfs doctor"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("dlfs@.service lacks %s", want)
		}
	}

	ds := "../../deploy/kubernetes/daemonset.yaml"
	if out, err := exec.Command("yamllint", "-s", "-d", "{extends: default, rules: {line-length: {max: 120}}}", ds).CombinedOutput(); err != nil {
		t.Errorf("yamllint: %v\n%s", err, out)
	}
	var spec map[string]any
	for _, d := range yamlDocs(t, ds) {
		if d["kind"] == "DaemonSet" {
			spec = dig(d, "spec", "template", "spec").(map[string]any)
		}
	}
	if spec == nil {
		t.Fatal("no DaemonSet")
	}
	c := spec["containers"].([]any)[0].(map[string]any)
	b, _ := json.Marshal(c)
	container := string(b)
	for _, want := range []string{`"privileged":true`, `"mountPropagation":"Bidirectional"`, `.dlfs/stats`, `"umount","--lazy"`, `"args":["mount",`} {
		if !strings.Contains(container, want) {
			t.Errorf("the DaemonSet's container lacks %s: %s", want, container)
		}
	}
	b, _ = json.Marshal(spec["volumes"])
	if !strings.Contains(string(b), `"secretName":"dlfs-cluster-key"`) || !strings.Contains(string(b), `"/dev/fuse"`) {
		t.Errorf("the DaemonSet's volumes lack the key Secret or /dev/fuse: %s", b)
	}
}

// dig walks nested maps.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, _ := v.(map[string]any)
		v = m[k]
	}
	return v
}
