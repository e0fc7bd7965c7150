package kvd

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// pythonWithMsgpack finds a python3 that imports msgpack (Debian's
// python3-msgpack, installed by .ci/run).
func pythonWithMsgpack(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(p); err == nil {
			if exec.Command(path, "-c", "import msgpack").Run() == nil {
				return path
			}
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("python3 with msgpack not installed: .ci/run must install python3-msgpack")
	}
	t.Skip("python3-msgpack not installed (apt-get install python3-msgpack)")
	return ""
}

// TestPythonClient (acceptance 1): a client written in Python from the
// protocol document speaks to the Go daemon: hello, fd passing and mmap,
// set/get, batches, reserve/commit into the arena, zero-copy reads with
// the slot-header check, exists, stats, clear, no-hello mode.
func TestPythonClient(t *testing.T) {
	py := pythonWithMsgpack(t)
	d := startDaemon(t, daemonOpts{arenaBytes: 1 << 20})
	out, err := exec.CommandContext(t.Context(), py, "testdata/kvd_client.py", d.path).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok") {
		t.Fatalf("python client: %v\n%s", err, out)
	}
}
