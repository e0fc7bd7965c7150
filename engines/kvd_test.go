package engines

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/infera/infera/kvd/kvdtest"
)

// prepareKVD runs PrepareLaunch with the golden seams and --kvd-socket.
func prepareKVD(t *testing.T, engine string, args ...string) (Launch, error) {
	t.Helper()
	a, err := Lookup(engine)
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{NoKVEvents: true, KVDSocket: "/run/infera/kvd.sock"}
	opts.LookupEnv = func(string) (string, bool) { return "", false }
	opts.portBlock = seqPorts(40000)
	opts.interfaces = goldenMachine
	opts.newID = func() string { return "0123abcd" }
	if engine == "sim" {
		opts.Bin = "/usr/local/bin/infera"
	}
	return PrepareLaunch(a, opts, args)
}

func mustPrepareKVD(t *testing.T, engine string, args ...string) Launch {
	t.Helper()
	l, err := prepareKVD(t, engine, args...)
	if err != nil {
		t.Fatalf("PrepareLaunch(%s %q): %v", engine, args, err)
	}
	return l
}

func TestKVDSocketEnvEveryEngine(t *testing.T) {
	for _, tc := range []struct {
		engine string
		args   []string
	}{
		{"sim", []string{"--port", "8000"}},
		{"vllm", []string{"m", "--port", "8000"}},
		{"sglang", []string{"--model-path", "m", "--port", "8000"}},
		{"atom", []string{"--model", "m", "--server-port", "8000"}},
	} {
		l := mustPrepareKVD(t, tc.engine, tc.args...)
		if !slices.Contains(l.Command.Env, "INFERA_KVD_SOCKET=/run/infera/kvd.sock") {
			t.Errorf("%s: env %q lacks INFERA_KVD_SOCKET", tc.engine, l.Command.Env)
		}
	}
	// Without --kvd-socket nothing changes.
	a, _ := Lookup("vllm")
	opts := Options{NoKVEvents: true, LookupEnv: func(string) (string, bool) { return "", false }, portBlock: seqPorts(40000)}
	l, err := PrepareLaunch(a, opts, []string{"m", "--port", "8000"})
	if err != nil || slices.ContainsFunc(l.Command.Env, func(e string) bool { return strings.HasPrefix(e, "INFERA_KVD_SOCKET=") }) ||
		slices.Contains(l.Command.Args, "--kv-transfer-config") {
		t.Fatalf("no --kvd-socket: %+v %v", l.Command, err)
	}
}

func TestKVDVLLMCommandLines(t *testing.T) {
	cases := []struct {
		name     string
		args     []string
		want     []string // exact arguments
		warnings int
	}{
		{"absent", []string{"m", "--port", "8000"},
			[]string{"serve", "m", "--port", "8000", "--kv-transfer-config",
				`{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}`}, 0},
		{"merged with the user's keys", []string{"m", "--port", "8000", "--kv-transfer-config", `{"kv_role":"kv_both","kv_connector_extra_config":{"x":1}}`},
			[]string{"serve", "m", "--port", "8000", "--kv-transfer-config",
				`{"kv_connector":"InferaKvdConnector","kv_connector_module_path":"infera.engine.vllm.kvd_connector","kv_role":"kv_both","kv_connector_extra_config":{"x":1}}`}, 0},
		{"inline form, user's module path kept", []string{"m", "--port", "8000", `--kv-transfer-config={"kv_connector":"InferaKvdConnector","kv_connector_module_path":"my.mod"}`},
			[]string{"serve", "m", "--port", "8000", `--kv-transfer-config={"kv_role":"kv_both","kv_connector":"InferaKvdConnector","kv_connector_module_path":"my.mod"}`}, 0},
		{"complete: untouched", []string{"m", "--port", "8000", "--kv-transfer-config", `{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"p"}`},
			[]string{"serve", "m", "--port", "8000", "--kv-transfer-config", `{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"p"}`}, 0},
		{"dotted form", []string{"m", "--port", "8000", "--kv-transfer-config.kv_role", "kv_both"},
			[]string{"serve", "m", "--port", "8000", "--kv-transfer-config.kv_role", "kv_both",
				"--kv-transfer-config.kv_connector", "InferaKvdConnector", "--kv-transfer-config.kv_connector_module_path", "infera.engine.vllm.kvd_connector"}, 0},
		{"another connector: left alone, warned", []string{"m", "--port", "8000", "--kv-transfer-config", `{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`},
			[]string{"serve", "m", "--port", "8000", "--kv-transfer-config", `{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`}, 1},
		{"multi connector holding kvd", []string{"m", "--port", "8000", "--kv-transfer-config",
			`{"kv_connector":"MultiConnector","kv_role":"kv_both","kv_connector_extra_config":{"connectors":[{"kv_connector":"InferaKvdConnector"}]}}`},
			[]string{"serve", "m", "--port", "8000", "--kv-transfer-config",
				`{"kv_connector":"MultiConnector","kv_role":"kv_both","kv_connector_extra_config":{"connectors":[{"kv_connector":"InferaKvdConnector"}]}}`}, 0},
		{"user args after --", []string{"m", "--port", "8000", "--", "x"},
			[]string{"serve", "m", "--port", "8000", "--kv-transfer-config",
				`{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"}`, "--", "x"}, 0},
	}
	for _, tc := range cases {
		l := mustPrepareKVD(t, "vllm", tc.args...)
		if !slices.Equal(l.Command.Args, tc.want) || len(l.Warnings) != tc.warnings {
			t.Errorf("%s:\n got %q warnings %q\nwant %q", tc.name, l.Command.Args, l.Warnings, tc.want)
		}
	}
	for _, bad := range []string{"{not json", "[1]", `{"kv_connector":5}`} {
		_, err := prepareKVD(t, "vllm", "m", "--port", "8000", "--kv-transfer-config", bad)
		if err == nil || !strings.Contains(err.Error(), "kv-transfer-config") {
			t.Errorf("--kv-transfer-config %s: err %v, want one naming the flag", bad, err)
		}
	}
}

func TestKVDSGLangCommandLines(t *testing.T) {
	const cfg = `{"backend_name":"infera-kvd","module_path":"infera.engine.sglang.kvd_adapter","class_name":"InferaKvdBackend","prefetch_threshold":64}`
	cases := []struct {
		name     string
		args     []string
		want     []string
		warnings int
	}{
		{"absent", []string{"--model-path", "m", "--port", "8000", "--enable-metrics"},
			[]string{"-m", "sglang.launch_server", "--model-path", "m", "--port", "8000", "--enable-metrics",
				"--enable-hierarchical-cache", "--hicache-storage-backend", "dynamic", "--hicache-storage-backend-extra-config", cfg}, 0},
		{"user's hicache flags kept", []string{"--model-path", "m", "--port", "8000", "--enable-metrics", "--enable-hierarchical-cache",
			"--hicache-storage-backend", "dynamic", "--hicache-storage-backend-extra-config", `{"class_name":"Mine"}`},
			[]string{"-m", "sglang.launch_server", "--model-path", "m", "--port", "8000", "--enable-metrics", "--enable-hierarchical-cache",
				"--hicache-storage-backend", "dynamic", "--hicache-storage-backend-extra-config",
				`{"backend_name":"infera-kvd","module_path":"infera.engine.sglang.kvd_adapter","prefetch_threshold":64,"class_name":"Mine"}`}, 0},
		{"another backend: left alone, warned", []string{"--model-path", "m", "--port", "8000", "--enable-metrics", "--hicache-storage-backend", "mooncake"},
			[]string{"-m", "sglang.launch_server", "--model-path", "m", "--port", "8000", "--enable-metrics", "--hicache-storage-backend", "mooncake"}, 1},
	}
	for _, tc := range cases {
		l := mustPrepareKVD(t, "sglang", tc.args...)
		if !slices.Equal(l.Command.Args, tc.want) || len(l.Warnings) != tc.warnings {
			t.Errorf("%s:\n got %q warnings %q\nwant %q", tc.name, l.Command.Args, l.Warnings, tc.want)
		}
	}
	_, err := prepareKVD(t, "sglang", "--model-path", "m", "--port", "8000", "--hicache-storage-backend-extra-config", "{bad")
	if err == nil || !strings.Contains(err.Error(), "hicache-storage-backend-extra-config") {
		t.Fatalf("bad extra config: %v", err)
	}
}

// TestProbeKVD: the worker's start-up check answers nil against a real
// kvd and names the socket when nothing listens there.
func TestProbeKVD(t *testing.T) {
	sock, _ := kvdtest.Start(t, 1<<20)
	if err := ProbeKVD(t.Context(), sock); err != nil {
		t.Fatalf("probe of a running kvd: %v", err)
	}
	missing := filepath.Join(t.TempDir(), "none.sock")
	err := ProbeKVD(t.Context(), missing)
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "kvd does not answer") {
		t.Fatalf("probe of a missing socket: %v", err)
	}
}

// TestKVDSGLangDecodeLegNotWired: a PD decode engine gets the socket in its
// environment but no HiCache flags (its KV comes from the prefill), with a
// warning that says so; a prefill engine is wired.
func TestKVDSGLangDecodeLegNotWired(t *testing.T) {
	l := mustPrepareKVD(t, "sglang", "--model-path", "m", "--port", "8000", "--enable-metrics", "--disaggregation-mode", "decode")
	if slices.Contains(l.Command.Args, "--enable-hierarchical-cache") || len(l.Warnings) != 1 || !strings.Contains(l.Warnings[0], "decode") {
		t.Fatalf("decode leg: args %q warnings %q", l.Command.Args, l.Warnings)
	}
	if !slices.Contains(l.Command.Env, KVDSocketEnv+"=/run/infera/kvd.sock") {
		t.Fatalf("decode leg env %q lacks %s", l.Command.Env, KVDSocketEnv)
	}
	l = mustPrepareKVD(t, "sglang", "--model-path", "m", "--port", "8000", "--enable-metrics", "--disaggregation-mode", "prefill")
	if !slices.Contains(l.Command.Args, "--enable-hierarchical-cache") {
		t.Fatalf("prefill leg not wired: %q", l.Command.Args)
	}
}
