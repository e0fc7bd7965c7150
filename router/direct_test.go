package router_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/router"
)

// TestDirectMode (--router-mode direct): the endpoint picker's header sends
// a request to exactly that worker, with no failover when it fails; a
// worker that is not an active candidate is refused with the reference's
// 503; without the header the router picks as usual.
func TestDirectMode(t *testing.T) {
	a, b, down := startSim(t, nil), startSim(t, nil), downUpstream(t)
	tr := startRouter(t, router.RoundRobin{}, withConfig(func(c *router.Config) { c.Direct = true; c.MaxRetries = 2 }),
		simRecord(a), simRecord(b), record(down, "sim-model", discovery.StatusActive))
	const chat = `{"model":"sim-model","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`
	for range 4 {
		resp, body := tr.do(t, http.MethodPost, "/v1/chat/completions", chat, router.HeaderDirectWorker, b.addr)
		if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Worker") != b.addr {
			t.Fatalf("named %s: %d via %q: %s", b.addr, resp.StatusCode, resp.Header.Get("X-Infera-Worker"), body)
		}
	}
	resp, body := tr.do(t, http.MethodPost, "/v1/chat/completions", chat, router.HeaderDirectWorker, down.addr)
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("X-Infera-Worker") != down.addr {
		t.Fatalf("named a down worker: %d via %q (want 502 from it, no failover): %s", resp.StatusCode, resp.Header.Get("X-Infera-Worker"), body)
	}
	if n := metric(t, tr, `infera_router_retries_total{reason="connect"}`); n > 0 {
		t.Fatalf("direct mode retried %v times", n)
	}
	resp, body = tr.do(t, http.MethodPost, "/v1/chat/completions", chat, router.HeaderDirectWorker, "127.0.0.1:1")
	wantError(t, resp, body, http.StatusServiceUnavailable, "no_worker_available")
	if want := `worker '127.0.0.1:1' not found (stale gateway routing?)`; !strings.Contains(string(body), want) {
		t.Fatalf("refusal %s, want the reference's message %q", body, want)
	}
	resp, body = tr.do(t, http.MethodPost, "/v1/chat/completions", chat)
	if resp.StatusCode != 200 && resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("without the header: %d %s", resp.StatusCode, body)
	}
}

// TestDirectModePD: with both headers the named prefill and decode workers
// serve the request as a pair, whichever the policy would have picked.
func TestDirectModePD(t *testing.T) {
	proto := discovery.ProtocolVLLMNixl
	p1, p2 := startPDSim(t, "prefill", proto, nil), startPDSim(t, "prefill", proto, nil)
	d1, d2 := startPDSim(t, "decode", proto, nil), startPDSim(t, "decode", proto, nil)
	recs := []discovery.Record{p1.record(discovery.DisaggPrefill, proto), p2.record(discovery.DisaggPrefill, proto),
		d1.record(discovery.DisaggDecode, proto), d2.record(discovery.DisaggDecode, proto)}
	tr := pdRouter(t, func(c *router.Config) { c.Direct = true }, recs...)
	for _, pair := range [][2]string{{recs[1].WorkerID, recs[2].WorkerID}, {recs[0].WorkerID, recs[3].WorkerID}, {recs[1].WorkerID, recs[3].WorkerID}} {
		for _, stream := range []bool{false, true} {
			body := pdChat
			if stream {
				body = pdStreamChat(pdChat)
			}
			resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", body,
				router.HeaderDirectPrefill, pair[0], router.HeaderDirectWorker, pair[1])
			if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Prefill-Worker") != pair[0] || resp.Header.Get("X-Infera-Worker") != pair[1] {
				t.Fatalf("pair %v (stream %v): %d via %q/%q: %s", pair, stream, resp.StatusCode,
					resp.Header.Get("X-Infera-Prefill-Worker"), resp.Header.Get("X-Infera-Worker"), b)
			}
		}
	}
}
