package router_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/router"
	"github.com/infera/infera/tracing"
	"github.com/infera/infera/tracing/tracingtest"
)

// tracedPD is a PD router exporting to a real OTLP/gRPC receiver (batches
// every 20 ms) in front of a prefill and a decode simulator.
func tracedPD(t *testing.T, protocol string) (*testRouter, *pdSim, *pdSim, *tracingtest.Receiver) {
	t.Helper()
	rcv := tracingtest.Start(t)
	tr, err := tracing.New(t.Context(), tracing.Config{Endpoint: rcv.Endpoint, SampleRatio: 1, BatchTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	p := startPDSim(t, "prefill", protocol, nil)
	d := startPDSim(t, "decode", protocol, nil)
	rt := pdRouter(t, func(c *router.Config) { c.Tracer = tr }, p.record(discovery.DisaggPrefill, protocol), d.record(discovery.DisaggDecode, protocol))
	return rt, p, d, rcv
}

// byName indexes one trace's spans.
func traceSpans(rcv *tracingtest.Receiver, traceID string) map[string][]tracingtest.Span {
	out := map[string][]tracingtest.Span{}
	for _, s := range rcv.Spans() {
		if s.TraceID == traceID {
			out[s.Name] = append(out[s.Name], s)
		}
	}
	return out
}

// A disaggregated request is one trace: request, admission and pick per
// leg, a prefill and a decode leg whose contexts the engines got as
// traceparent, and the KV hand-off; a client's traceparent is its parent.
func TestTracingPDRequest(t *testing.T) {
	for _, proto := range []string{discovery.ProtocolVLLMNixl, discovery.ProtocolSGLangBootstrap} {
		t.Run(proto, func(t *testing.T) {
			rt, p, d, rcv := tracedPD(t, proto)
			const clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
			resp, r := rt.stream(t, pdStreamChat(pdChat), "traceparent", "00-"+clientTrace+"-00f067aa0ba902b7-01")
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			_, _ = io.Copy(io.Discard, r)
			resp.Body.Close()
			testkit.Eventually(t, "the request's spans", func() bool { return len(traceSpans(rcv, clientTrace)["POST /v1/chat/completions"]) == 1 })
			spans := traceSpans(rcv, clientTrace)
			root := spans["POST /v1/chat/completions"][0]
			if root.Parent != "00f067aa0ba902b7" || root.Attrs["http.response.status_code"] != int64(200) || root.Attrs["infera.pd"] != true ||
				root.Attrs["gen_ai.request.model"] != "sim-model" || !contains(root.Events, "first_token") {
				t.Fatalf("request span %+v", root)
			}
			if len(spans["admission"]) != 2 || len(spans["pick"]) != 2 || len(spans["leg"]) != 2 || len(spans["pd.kv_handoff"]) != 1 {
				t.Fatalf("spans %v", names(spans))
			}
			for _, pk := range spans["pick"] {
				if pk.Attrs["infera.policy"] != "round-robin" || pk.Attrs["infera.worker_id"] == "" {
					t.Fatalf("pick %+v", pk)
				}
			}
			legs := map[string]tracingtest.Span{}
			for _, l := range spans["leg"] {
				// The prefill's status is the decode's to know (a serial
				// prefill ends with its hand-off, not a status).
				role, _ := l.Attrs["infera.leg.role"].(string)
				if l.Parent != root.SpanID || l.Error || (role == "decode" && l.Attrs["http.response.status_code"] != int64(200)) ||
					l.Attrs["infera.leg.transport"] != "http" || l.Attrs["infera.pd.protocol"] != proto || l.Kind != 3 {
					t.Fatalf("leg %+v", l)
				}
				legs[l.Attrs["infera.leg.role"].(string)] = l
			}
			ho := spans["pd.kv_handoff"][0]
			if ho.Parent != root.SpanID || ho.Attrs["infera.pd.prefill_worker_id"] != p.addr || ho.Attrs["infera.pd.decode_worker_id"] != d.addr || ho.Attrs["infera.pd.protocol"] != proto {
				t.Fatalf("handoff %+v", ho)
			}
			// The engines got their leg's context.
			for role, sim := range map[string]*pdSim{"prefill": p, "decode": d} {
				got := sim.got(t)
				want := "00-" + clientTrace + "-" + legs[role].SpanID + "-01"
				if len(got) != 1 || got[0].Traceparent != want {
					t.Fatalf("%s engine got traceparent %v, want %s", role, got, want)
				}
			}
		})
	}
}

// Off, the client's traceparent reaches the engine unchanged; nothing is
// exported.
func TestTracingOffPassesTraceparent(t *testing.T) {
	p := startPDSim(t, "prefill", discovery.ProtocolVLLMNixl, nil)
	d := startPDSim(t, "decode", discovery.ProtocolVLLMNixl, nil)
	rt := pdRouter(t, nil, p.record(discovery.DisaggPrefill, discovery.ProtocolVLLMNixl), d.record(discovery.DisaggDecode, discovery.ProtocolVLLMNixl))
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	resp, b := rt.do(t, http.MethodPost, "/v1/chat/completions", pdChat, "traceparent", tp)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d %s", resp.StatusCode, b)
	}
	for _, sim := range []*pdSim{p, d} {
		if got := sim.got(t); len(got) != 1 || got[0].Traceparent != tp {
			t.Fatalf("engine got %+v, want traceparent %s", got, tp)
		}
	}
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func names(m map[string][]tracingtest.Span) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[k] = len(v)
	}
	return out
}
