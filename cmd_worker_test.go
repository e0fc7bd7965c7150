package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestWorkerPreflightCommand runs `infera worker --preflight` on the rocm
// fixture nodes: exit 0 and a pass verdict on the MI355X node, exit 1 with
// the blocking finding on the node without RDMA, JSON with --json.
func TestWorkerPreflightCommand(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"infera", "worker", "--preflight", "--sysfs-root", "rocm/testdata/sysfs/mi355x", "--advertise-host", "10.16.0.11"}, &stdout, &stderr)
	if code != 0 || !strings.HasSuffix(stdout.String(), "verdict: pass\n") {
		t.Fatalf("mi355x: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}

	stdout.Reset()
	stderr.Reset()
	code = run([]string{"infera", "worker", "--preflight", "--json", "--sysfs-root", "rocm/testdata/sysfs/nordma", "--advertise-host", "10.16.0.11"}, &stdout, &stderr)
	if code != exitFailure || !strings.Contains(stderr.String(), "no RDMA device: rocm/testdata/sysfs/nordma/class/infiniband") {
		t.Fatalf("nordma: exit %d, stderr %s", code, stderr.String())
	}
	var rep struct {
		Verdict  string `json:"verdict"`
		Findings []struct{ Severity, Code string }
		Node     struct {
			GPUs []struct {
				GfxTarget string `json:"gfx_target"`
			} `json:"gpus"`
		} `json:"node"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, stdout.String())
	}
	if rep.Verdict != "fail" || len(rep.Node.GPUs) != 4 || rep.Node.GPUs[0].GfxTarget != "gfx942" {
		t.Fatalf("--json report: %+v", rep)
	}

	// --json without --preflight is a configuration error.
	if code := run([]string{"infera", "worker", "--engine", "sim", "--json"}, &stdout, &stderr); code != exitConfig {
		t.Fatalf("--json alone: exit %d", code)
	}
}
