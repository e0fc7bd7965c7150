package engines

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

const unitDir = "../deploy/systemd"

// unitSettings reads key=value lines of a unit file (the last one wins).
func unitSettings(t *testing.T, name string) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(unitDir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: line %q is not key=value", name, line)
		}
		out[k] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSystemdUnitsStopInTime: each unit gives its process longer to stop
// than the process takes to drain by default, restarts on failure, and
// stops its children only after the main process had its chance.
func TestSystemdUnitsStopInTime(t *testing.T) {
	var w config.Worker
	w.Flags()
	var s config.Serve
	s.Flags()
	need := map[string]time.Duration{
		// drain, then the engine's grace, then etcd calls and the final kill
		"infera-worker@.service": w.DrainTimeout + w.StopGrace + 15*time.Second,
		"infera-serve.service":   s.ShutdownTimeout + 5*time.Second,
		// kvd's clean stop writes the L3 snapshot (one fsync'd file per
		// path plus the directory); a kill before that costs a journal
		// replay at the next start, never data, but should be rare.
		"infera-kvd.service": 10 * time.Second,
	}
	for name, min := range need {
		u := unitSettings(t, name)
		stop, err := time.ParseDuration(u["TimeoutStopSec"])
		if err != nil || stop < min {
			t.Errorf("%s: TimeoutStopSec=%s, want at least %v", name, u["TimeoutStopSec"], min)
		}
		if u["Restart"] != "on-failure" || u["KillMode"] != "mixed" || u["NoNewPrivileges"] != "yes" || u["ProtectSystem"] != "strict" {
			t.Errorf("%s: Restart=%s KillMode=%s NoNewPrivileges=%s ProtectSystem=%s", name, u["Restart"], u["KillMode"], u["NoNewPrivileges"], u["ProtectSystem"])
		}
		if !strings.HasPrefix(u["ExecStart"], "/usr/local/bin/infera ") {
			t.Errorf("%s: ExecStart=%s", name, u["ExecStart"])
		}
	}
	// The worker's engine needs the GPUs and JIT compiles kernels.
	u := unitSettings(t, "infera-worker@.service")
	for _, k := range []string{"PrivateDevices", "DevicePolicy", "MemoryDenyWriteExecute", "SystemCallFilter"} {
		if _, ok := u[k]; ok {
			t.Errorf("infera-worker@.service sets %s, which breaks GPU engines", k)
		}
	}
	if u["EnvironmentFile"] != "/etc/infera/worker-%i.env" || u["ExecStart"] != "/usr/local/bin/infera worker -- $INFERA_ENGINE_ARGS" {
		t.Errorf("worker unit EnvironmentFile=%s ExecStart=%s", u["EnvironmentFile"], u["ExecStart"])
	}
}

// TestSystemdUnitsVerify runs deploy/systemd/verify.sh (systemd-analyze
// verify). .ci/run installs systemd-analyze, so in CI its absence fails.
func TestSystemdUnitsVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("systemd-analyze not installed: .ci/run must install Debian's systemd package")
		}
		t.Skip("systemd-analyze not installed (apt-get install systemd)")
	}
	out, err := exec.CommandContext(t.Context(), "sh", filepath.Join(unitDir, "verify.sh")).CombinedOutput()
	if err != nil {
		t.Fatalf("verify.sh: %v\n%s", err, out)
	}
}

// TestShims: the test shims on PATH turn the engines' command lines into
// the simulator facades' ones.
func TestShims(t *testing.T) {
	dir := t.TempDir()
	record := filepath.Join(dir, "argv")
	fake := filepath.Join(dir, "infera")
	script := "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done >" + record + "\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	shims, err := filepath.Abs(filepath.Join("testdata", "shims"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"vllm", []string{"serve", "Qwen/Qwen3-8B", "--kv-events-config", `{"a": 1}`}, []string{"sim", "--flavor", "vllm", "serve", "Qwen/Qwen3-8B", "--kv-events-config", `{"a": 1}`}},
		{"python3", []string{"-m", "sglang.launch_server", "--model-path", "m"}, []string{"sim", "--flavor", "sglang", "--model-path", "m"}},
		{"python", []string{"-m", "atom.entrypoints.openai_server", "--model", "m"}, []string{"sim", "--flavor", "atom", "--model", "m"}},
	}
	for _, tc := range cases {
		cmd := exec.CommandContext(t.Context(), filepath.Join(shims, tc.name), tc.args...)
		cmd.Env = append(os.Environ(), "INFERA_SIM_BIN="+fake)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", tc.name, err, out)
		}
		b, err := os.ReadFile(record)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n"); !slices.Equal(got, tc.want) {
			t.Errorf("%s %q ran %q, want %q", tc.name, tc.args, got, tc.want)
		}
	}
	cmd := exec.CommandContext(t.Context(), filepath.Join(shims, "python"), "-m", "vllm.entrypoints.openai.api_server")
	cmd.Env = append(os.Environ(), "INFERA_SIM_BIN="+fake)
	if err := cmd.Run(); err == nil {
		t.Error("python shim accepted a module it does not simulate")
	}
}
