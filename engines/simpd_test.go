package engines

import (
	"errors"
	"slices"
	"testing"

	"github.com/infera/infera/discovery"
)

// TestSimPrepareDisagg: a sim in a PD role registers as its protocol's
// engines do.
func TestSimPrepareDisagg(t *testing.T) {
	opts := Options{Bin: "/opt/infera", LookupEnv: func(string) (string, bool) { return "", false }, NoKVEvents: true}
	l, err := simAdapter{}.Prepare(opts, []string{"--host", "127.0.0.1", "--port", "9100", "--pd-role", "prefill", "--pd-protocol", "sglang-bootstrap", "--pd-kv-port", "9200"})
	if err != nil {
		t.Fatal(err)
	}
	ep := l.Endpoint
	if ep.DisaggMode != discovery.DisaggPrefill || ep.DisaggMeta.Protocol != discovery.ProtocolSGLangBootstrap ||
		ep.DisaggMeta.Params["bootstrap_addr"] != "127.0.0.1:9200" {
		t.Errorf("sglang prefill endpoint %+v", ep)
	}
	l, err = simAdapter{}.Prepare(opts, []string{"--host", "127.0.0.1", "--port", "9100", "--pd-role", "prefill", "--pd-protocol", "vllm-mooncake"})
	if err != nil {
		t.Fatal(err)
	}
	ep = l.Endpoint
	addr, _ := ep.DisaggMeta.Params["bootstrap_addr"].(string)
	id, _ := ep.DisaggMeta.Params["engine_id"].(string)
	if ep.DisaggMeta.Protocol != discovery.ProtocolVLLMMooncake || len(addr) < len("http://127.0.0.1:1") || id == "" ||
		!slices.Contains(l.Command.Args, "--pd-kv-port") || !slices.Contains(l.Command.Args, id) {
		t.Errorf("mooncake prefill %+v args %v: want a picked KV port and an engine id passed to the sim", ep, l.Command.Args)
	}
	l, err = simAdapter{}.Prepare(opts, []string{"--pd-role", "decode", "--pd-protocol", "vllm-nixl"})
	if err != nil || l.Endpoint.DisaggMode != discovery.DisaggDecode || l.Endpoint.DisaggMeta.Params["engine_id"] == nil {
		t.Errorf("nixl decode %+v, %v", l.Endpoint, err)
	}
	for _, bad := range [][]string{{"--pd-role", "both"}, {"--pd-role", "decode", "--pd-protocol", "vllm-foo"}} {
		if _, err := (simAdapter{}).Prepare(opts, bad); !errors.Is(err, ErrEngineArgs) {
			t.Errorf("%v: %v, want ErrEngineArgs", bad, err)
		}
	}
}
