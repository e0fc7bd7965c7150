package router

import (
	"encoding/json"
	"testing"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/jsonx"
	"github.com/infera/infera/openai"
)

// FuzzPDBodies: every protocol's leg bodies, from any client body and any
// prefill hand-off, are valid JSON objects carrying the protocol's fields,
// or an error; nothing panics.
func FuzzPDBodies(f *testing.F) {
	f.Add([]byte(`{"model":"m","max_tokens":5,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`), []byte(`{"remote_engine_id":"e","remote_block_ids":[1,2]}`), uint64(12345))
	f.Add([]byte(`{"model":"m","max_completion_tokens":1,"max_tokens":-3,"prompt":"x","kv_transfer_params":{"a":1}}`), []byte(`null`), uint64(1<<62))
	f.Add([]byte(`{"max_tokens":1e3}`), []byte(`{}`), uint64(0))
	f.Add([]byte(`[1,2]`), []byte(`{`), uint64(7))
	f.Add([]byte(`{"model":"m","prompt":"p"}`), []byte(`{"transfer_id":"t","dp_rank":2,"tp_size":4}`), uint64(9))
	f.Add([]byte(`{"model":"m","prompt":"p","priority":3,"infera_retention":"short","_infera_retention":"short","kv_transfer_params":{"infera_retention":"short"},"max_tokens":4}`),
		[]byte(`{"remote_block_ids":[1,2],"infera_retention":"x","transfer_id":"t"}`), uint64(10))
	f.Add([]byte(` { "model" : "m" , "stream" : true, "stream_options" : {}, "max_completion_tokens" : 9 , "kv_transfer_param\u0073":1, "kv_transfer_params":2 } `),
		[]byte(` { "transfer_id" : "t" , "remote_block_ids" : [ 1 , 2 ] } `), uint64(11))
	prefill := &discovery.Record{WorkerID: "p:1", DisaggMeta: discovery.DisaggMeta{Params: map[string]any{
		"bootstrap_addr": "[::1]:8998", "engine_id": "eid", "host": "10.0.0.1", "http_port": 8000.0, "handshake_port": 6301.0, "tp_size": 2.0,
		"kv_connector_extra_config": map[string]any{"handshake_port": 7000.0, "notify_port": 7001.0},
	}}}
	f.Fuzz(func(t *testing.T, body, handoff []byte, room uint64) {
		if topLevelField(body, "kv_transfer_params") == nil && topLevelField(body, "x") != nil {
			t.Skip()
		}
		l := pdLegs{body: body, prefill: prefill, decode: prefill, room: room >> 1, prefillDPSize: 3, prefillDPRank: int(room % 3),
			prefillHost: "10.0.0.1", decodeHost: "10.0.0.2"}
		var scan openai.Request
		scanned := openai.Scan(body, &scan) == nil
		// The folded legs are shaped into one pooled scratch (as the
		// relay's), reused leg after leg.
		var scratch pdScratch
		// The client body's walk, kept across every leg shaped from it
		// (the relay's pdWalk, Reset for each pair).
		var walk jsonx.Walk
		for name, proto := range pdProtocols {
			if proto.prepare != nil {
				if err := proto.prepare(&l); err != nil {
					t.Fatalf("%s prepare: %v", name, err)
				}
			}
			for leg, shape := range map[string]func(l *pdLegs) ([]byte, error){
				"prefill": func(l *pdLegs) ([]byte, error) { return proto.prefillBody(l) },
				"decode":  func(l *pdLegs) ([]byte, error) { return proto.decodeBody(l, handoff) },
			} {
				out, err := shape(&l)
				if err != nil {
					continue
				}
				if jsonx.Valid(out, maxEditDepth) != nil {
					t.Fatalf("%s %s body %q is not valid JSON (from %q)", name, leg, out, body)
				}
				var m map[string]json.RawMessage
				if err := json.Unmarshal(out, &m); err != nil {
					t.Fatalf("%s %s body %q: %v", name, leg, out, err)
				}
				want := "kv_transfer_params"
				if name == discovery.ProtocolSGLangBootstrap {
					want = "bootstrap_room"
				}
				if _, ok := m[want]; !ok {
					t.Fatalf("%s %s body %q has no %s", name, leg, out, want)
				}
				if !scanned {
					continue
				}
				// Each engine's cache hints on top keep it valid, with
				// the protocol's field.
				for _, engine := range []string{discovery.EngineVLLM, discovery.EngineSGLang, discovery.EngineATOM} {
					hinted, err := pdCacheHints(out, body, &scan, engine)
					if err != nil {
						t.Fatalf("%s %s hints for %s on %q: %v", name, leg, engine, out, err)
					}
					var hm map[string]json.RawMessage
					if jsonx.Valid(hinted, maxEditDepth) != nil || json.Unmarshal(hinted, &hm) != nil || hm[want] == nil {
						t.Fatalf("%s %s hints for %s: %q (from %q)", name, leg, engine, hinted, out)
					}
					// The hints folded into the protocol's pass (the
					// relay's way) give the same bytes.
					hl := l
					rec := *prefill
					rec.Engine = engine
					hl.prefill, hl.decode, hl.hints, hl.out, hl.walk = &rec, &rec, &scan, &scratch, &walk
					folded, err := shape(&hl)
					if err != nil || string(folded) != string(hinted) {
						t.Fatalf("%s %s hints for %s folded: %q, %v; want %q", name, leg, engine, folded, err, hinted)
					}
				}
			}
		}
	})
}
