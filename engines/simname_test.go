package engines

import (
	"testing"

	"github.com/infera/infera/discovery"
)

// The simulator registers as the engine its --flavor imitates (vllm
// without one), so that Python Infera servers, which accept only vllm,
// sglang and atom, route simulated workers; real_engine says it is the sim.
func TestSimRegistersAsItsFlavor(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"default", nil, []string{"--port", "9200"}, discovery.EngineVLLM},
		{"--flavor sglang", nil, []string{"--port", "9201", "--flavor", "sglang", "--model-path", "m"}, discovery.EngineSGLang},
		{"--flavor=atom", nil, []string{"--port", "9202", "--flavor=atom", "--model", "m"}, discovery.EngineATOM},
		{"INFERA_FLAVOR", map[string]string{"INFERA_FLAVOR": "sglang"}, []string{"--port", "9203"}, discovery.EngineSGLang},
		{"flag beats env", map[string]string{"INFERA_FLAVOR": "sglang"}, []string{"--port", "9204", "--flavor", "atom"}, discovery.EngineATOM},
		{"after --", nil, []string{"--port", "9205", "--", "--flavor", "sglang"}, discovery.EngineVLLM},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := mustPrepare(t, "sim", Options{NoKVEvents: true}, tc.env, tc.args...)
			rec := l.Endpoint.Record("sim")
			if rec.Engine != tc.want || rec.RealEngine != "sim" {
				t.Fatalf("engine %q real_engine %q, want %q and sim", rec.Engine, rec.RealEngine, tc.want)
			}
			raw, err := rec.Encode()
			if err != nil {
				t.Fatal(err)
			}
			back, err := discovery.DecodeRecord(raw)
			if err != nil || back.Engine != tc.want || back.RealEngine != "sim" {
				t.Fatalf("round trip %s: %+v %v", raw, back, err)
			}
		})
	}
	// Real engines name themselves and write no real_engine.
	l := mustPrepare(t, "vllm", Options{NoKVEvents: true}, nil, "m", "--port", "8000")
	if rec := l.Endpoint.Record("vllm"); rec.Engine != "vllm" || rec.RealEngine != "" {
		t.Fatalf("vllm record engine %q real_engine %q", rec.Engine, rec.RealEngine)
	}
}
