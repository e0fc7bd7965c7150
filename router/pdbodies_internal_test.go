package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/jsonx"
	"github.com/infera/infera/openai"
)

var goldenBodies = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`,
	`{"model":"m","prompt":"p","max_completion_tokens":7,"max_tokens":9,"stream":false}`,
	` { "model" : "m" , "prompt":"p", "stream" : true, "max_completion_tokens" : null , "kv_transfer_param\u0073":{"infera_retention":"short","x":1}, "kv_transfer_params":2 } `,
	`{"model":"m","prompt":"p","priority":3,"infera_retention":"none","_infera_retention":"short","kv_transfer_params":{"infera_retention":"none"},"max_tokens":4}`,
	`{"model":"m","messages":[{"role":"user","content":"a \"quoted\" \u00e9 text"}],"max_tokens":1,"infera_retention":"short"}`,
}

var goldenHandoffs = []string{
	`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[0,1,2,3],"remote_engine_id":"e","remote_host":"127.0.0.1","remote_port":41703,"remote_request_id":"nixl-1","tp_size":1}`,
	` { "transfer_id" : "t" , "remote_block_ids" : [ 1 , 2 ], "dp_rank":1, "infera_retention":"x" } `,
}

// TestPDBodiesAsBefore: every protocol's leg bodies, with each engine's
// cache hints folded into the protocol's pass (pdLegs.shape), are the bytes
// the legs got when the protocol's edits were applied one after the other
// and the hints after them (testdata/pd_bodies.jsonl: written by main at
// a9d1a57, protocolBody then pdCacheHints), errors included.
func TestPDBodiesAsBefore(t *testing.T) {
	params := map[string]any{
		"bootstrap_addr": "10.0.0.1:8998", "engine_id": "eid", "host": "10.0.0.1", "http_port": 8000.0, "handshake_port": 6301.0, "tp_size": 2.0, "dp_size": 2.0,
		"kv_connector_extra_config": map[string]any{"handshake_port": 7000.0, "notify_port": 7001.0},
	}
	names := []string{}
	for n := range pdProtocols {
		names = append(names, n)
	}
	slices.Sort(names)
	type row struct {
		Protocol, Engine, Leg string
		Body, Handoff, DPSize int
		Out, Err              string
	}
	var rows []row
	// The legs are shaped into pooled buffers (pdLegs.out) as pdTry does,
	// reused row after row: a longer body before must leave no trace.
	var bufs [2]pdScratch
	for _, name := range names {
		proto := pdProtocols[name]
		for _, engine := range []string{"vllm", "sglang"} {
			for dp := 2; dp <= 2; dp++ {
				for bi, body := range goldenBodies {
					if bi == 1 || bi == 4 {
						continue
					}
					for hi, handoff := range goldenHandoffs {
						var scan openai.Request
						if err := openai.Scan([]byte(body), &scan); err != nil {
							t.Fatal(err)
						}
						rec := &discovery.Record{WorkerID: "w", Engine: engine, DisaggMeta: discovery.DisaggMeta{Protocol: name, Params: params}}
						l := pdLegs{body: []byte(body), prefill: rec, decode: rec, room: 12345, prefillDPRank: dp - 1, prefillDPSize: dp, prefillHost: "10.0.0.1", decodeHost: "10.0.0.2", hints: &scan}
						if proto.prepare != nil {
							_ = proto.prepare(&l)
						}
						if l.requestID != "" {
							l.requestID = "forged-id"
						}
						if l.transferID != "" {
							l.transferID = "tx-fixed"
						}
						for _, leg := range []string{"prefill", "decode"} {
							var out []byte
							var err error
							if leg == "prefill" {
								if hi > 0 {
									continue
								}
								l.out = &bufs[0]
								out, err = proto.prefillBody(&l)
							} else {
								l.out = &bufs[1]
								out, err = proto.decodeBody(&l, []byte(handoff))
							}

							r := row{Protocol: name, Engine: engine, Leg: leg, Body: bi, Handoff: hi, DPSize: dp, Out: string(out)}
							if err != nil {
								r.Err, r.Out = err.Error(), ""
							}
							rows = append(rows, r)
						}
					}
				}
			}
		}
	}
	golden, err := os.ReadFile("testdata/pd_bodies.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(golden), []byte("\n"))
	if len(lines) != len(rows) {
		t.Fatalf("%d bodies, %d in testdata", len(rows), len(lines))
	}
	for i, line := range lines {
		var want row
		if err := json.Unmarshal(line, &want); err != nil {
			t.Fatal(err)
		}
		if rows[i] != want {
			t.Errorf("%s %s leg (%s, body %d, hand-off %d):\n%q (%s)\nwant\n%q (%s)", want.Protocol, want.Leg, want.Engine, want.Body, want.Handoff,
				rows[i].Out, rows[i].Err, want.Out, want.Err)
		}
	}
}

// TestPDBodiesWalkedOnce: the legs shaped as pdTry does, the client
// body's walk kept from the first leg edited (pdLegs.walk), are the bytes
// and errors of the legs each walking it, for every protocol, engine,
// golden body and hand-off, a walk kept across a pair's failover too.
func TestPDBodiesWalkedOnce(t *testing.T) {
	params := map[string]any{
		"bootstrap_addr": "10.0.0.1:8998", "engine_id": "eid", "host": "10.0.0.1", "http_port": 8000.0, "handshake_port": 6301.0, "tp_size": 2.0, "dp_size": 2.0,
		"kv_connector_extra_config": map[string]any{"handshake_port": 7000.0, "notify_port": 7001.0},
	}
	var walk jsonx.Walk
	var bufs, walkedBufs [2]pdScratch
	for name, proto := range pdProtocols {
		for _, engine := range []string{"vllm", "sglang", "atom"} {
			for bi, body := range goldenBodies {
				for hi, handoff := range goldenHandoffs {
					var scan openai.Request
					if err := openai.Scan([]byte(body), &scan); err != nil {
						t.Fatal(err)
					}
					rec := &discovery.Record{WorkerID: "w", Engine: engine, DisaggMeta: discovery.DisaggMeta{Protocol: name, Params: params}}
					l := pdLegs{body: []byte(body), prefill: rec, decode: rec, room: 12345, prefillDPRank: 1, prefillDPSize: 2, prefillHost: "10.0.0.1", decodeHost: "10.0.0.2", hints: &scan}
					if proto.prepare != nil {
						_ = proto.prepare(&l)
					}
					walk.Reset()
					for pair := range 2 {
						w := l
						w.walk = &walk
						for leg := range 2 {
							var want, got []byte
							var werr, err error
							if leg == 0 {
								l.out, w.out = &bufs[0], &walkedBufs[0]
								want, werr = proto.prefillBody(&l)
								got, err = proto.prefillBody(&w)
							} else {
								l.out, w.out = &bufs[1], &walkedBufs[1]
								want, werr = proto.decodeBody(&l, []byte(handoff))
								got, err = proto.decodeBody(&w, []byte(handoff))
							}
							if string(got) != string(want) || fmt.Sprint(err) != fmt.Sprint(werr) {
								t.Errorf("%s %s body %d hand-off %d pair %d leg %d: %q, %v; want %q, %v", name, engine, bi, hi, pair, leg, got, err, want, werr)
							}
						}
					}
				}
			}
		}
	}
}

// TestPDLegBodiesAlloc: a request's leg bodies, shaped with their cache
// hints into the relay's pooled buffers (pdLegs.out), allocate nothing once
// the buffers have grown (a serial protocol, both legs, and a concurrent
// one's).
func TestPDLegBodiesAlloc(t *testing.T) {
	body := []byte(goldenBodies[0])
	handoff := []byte(goldenHandoffs[0])
	var scan openai.Request
	if err := openai.Scan(body, &scan); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ protocol, engine string }{
		{discovery.ProtocolVLLMNixl, "vllm"},
		{discovery.ProtocolSGLangBootstrap, "sglang"},
	} {
		t.Run(c.protocol, func(t *testing.T) {
			params := map[string]any{"bootstrap_addr": "10.0.0.1:8998", "bootstrap_port": 8998.0}
			rec := &discovery.Record{WorkerID: "w", Engine: c.engine, DisaggMeta: discovery.DisaggMeta{Protocol: c.protocol, Params: params}}
			proto := pdProtocols[c.protocol]
			var bufs [2]pdScratch
			var walk jsonx.Walk
			l := pdLegs{body: body, prefill: rec, decode: rec, room: 12345, prefillDPSize: 1, hints: &scan, walk: &walk}
			run := func() {
				walk.Reset()
				l.out = &bufs[0]
				if _, err := proto.prefillBody(&l); err != nil {
					t.Fatal(err)
				}
				l.out = &bufs[1]
				if _, err := proto.decodeBody(&l, handoff); err != nil {
					t.Fatal(err)
				}
			}
			run()
			if n := testing.AllocsPerRun(100, run); n != 0 {
				t.Fatalf("shaping both legs allocates %.1f times, want 0", n)
			}
		})
	}
}
