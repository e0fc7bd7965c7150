package engines

import (
	"errors"
	"strings"
	"testing"

	"github.com/infera/infera/discovery"
)

// FuzzPrepare: no engine command line panics an adapter; a refused one is
// refused with ErrEngineArgs; an accepted one yields a record that passes
// the wire validation routers apply, so the worker never registers
// something a router would reject.
func FuzzPrepare(f *testing.F) {
	for _, tc := range goldenCases {
		f.Add(tc.engine, strings.Join(tc.args, "\x00"))
	}
	f.Add("vllm", "m\x00--kv-transfer-config.kv_connector_extra_config.connectors\x00[{\"kv_connector\":\"NixlConnector\"}]\x00--kv-transfer-config.kv_role\x00kv_producer\x00--kv-transfer-config.kv_connector\x00MultiConnector")
	f.Add("vllm", "m\x00--data-parallel-size\x00999\x00--data-parallel-rank\x00998\x00--kv-events-config\x00{\"endpoint\":\"tcp://*:65000\"}")
	f.Add("sglang", "--model-path\x00m\x00--host\x00[::1]\x00--served-model-name\x00\x7f")
	f.Add("atom", "--model\x00m\x00--kv-transfer-config\x00{\"kv_role\":\"kv_consumer\",\"dp_size\":\"7\"}")
	f.Add("sim", "--kv-events-endpoint\x00tcp://[fe80::1]:1\x00--host\x00fe80::1")
	f.Fuzz(func(t *testing.T, engine, joined string) {
		a, err := Lookup(engine)
		if err != nil {
			return
		}
		var args []string
		if joined != "" {
			args = strings.Split(joined, "\x00")
		}
		opts := Options{
			Bin:        "/usr/local/bin/infera",
			LookupEnv:  func(string) (string, bool) { return "", false },
			portBlock:  seqPorts(40000),
			interfaces: goldenMachine,
			newID:      func() string { return "0123abcd" },
		}
		l, err := a.Prepare(opts, args)
		if err != nil {
			if !errors.Is(err, ErrEngineArgs) {
				t.Fatalf("Prepare(%q) = %v, want ErrEngineArgs", args, err)
			}
			return
		}
		rec := l.Endpoint.Record(a.Name())
		if _, err := rec.Encode(); err != nil {
			t.Fatalf("Prepare(%q) accepted, but its record is invalid: %v\n%+v", args, err, l.Endpoint)
		}
		if l.Command.Path == "" {
			t.Fatalf("Prepare(%q): no executable", args)
		}
	})
}

// FuzzSGLangServerInfo: no /get_server_info body panics the SGLang probe;
// an accepted one gives a page size of at least 1 and a cache size a
// router accepts (0..discovery.MaxKVCapacityBlocks blocks).
func FuzzSGLangServerInfo(f *testing.F) {
	f.Add(`{"page_size": 16, "max_total_num_tokens": 270336}`)
	f.Add(`{"server_args": {"page_size": 128}, "max_total_num_tokens": 65536}`)
	f.Add(`{"page_size": 1, "max_total_num_tokens": 9223372036854775807}`)
	f.Add(`{"page_size": 3, "max_total_num_tokens": -1}`)
	f.Fuzz(func(t *testing.T, body string) {
		page, blocks, err := sglangAdapter{}.parseBlockSize(strings.NewReader(body))
		if err != nil {
			if !errors.Is(err, ErrMetrics) {
				t.Fatalf("error %v, want ErrMetrics", err)
			}
			return
		}
		if page < 1 || blocks < 0 || blocks > discovery.MaxKVCapacityBlocks {
			t.Fatalf("page_size %d, %d blocks from %q", page, blocks, body)
		}
	})
}
