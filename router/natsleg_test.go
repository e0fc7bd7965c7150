package router_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/natstest"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/natsreq"
	"github.com/infera/infera/router"
)

// natsConn connects to ns for the test.
func natsConn(t *testing.T, ns *natstest.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// natsClient is the router's side of requests over NATS on ns.
func natsClient(t *testing.T, ns *natstest.Server, cfg natsreq.ClientConfig) *natsreq.Client {
	t.Helper()
	cfg.CancelGap = 20 * time.Millisecond
	c, err := natsreq.NewClient(t.Context(), cfg, natsConn(t, ns), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close) // after the router: cleanups run last-in first-out
	return c
}

// natsWorker runs a worker's request server on ns in front of engine and
// returns its record. The record's URL is a port nothing listens on: a
// request that reaches the engine came over NATS.
func natsWorker(t *testing.T, ns *natstest.Server, engine *upstream, maxPending int) (discovery.Record, *natsreq.Server) {
	t.Helper()
	id := "127.0.0.1:" + strconv.Itoa(testkit.FreePort(t))
	srv, err := natsreq.NewServer(natsreq.ServerConfig{WorkerID: id, EngineURL: "http://" + engine.addr, MaxPending: maxPending}, natsConn(t, ns), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop(0) })
	rec := discovery.Record{
		WorkerID: id, URL: "http://" + id, ModelName: "sim-model", Engine: "sim",
		DisaggMode: discovery.DisaggMixed, DPSize: 1, RequestTransport: config.RequestTransportNATS, Status: discovery.StatusActive,
	}
	return rec, srv
}

func natsRouter(t *testing.T, c *natsreq.Client, set func(*router.Config), workers ...discovery.Record) *testRouter {
	t.Helper()
	cfg := withConfig(func(c *router.Config) {
		if set != nil {
			set(c)
		}
	})
	cfg.NATSRequests = c
	return startRouter(t, router.RoundRobin{}, cfg, workers...)
}

// readStream reads an SSE answer to its end and returns its data events.
func readStream(t *testing.T, r *bufio.Reader) []string {
	t.Helper()
	var data []string
	for {
		ev, err := r.ReadString('\n')
		if err == io.EOF {
			return data
		}
		if err != nil {
			t.Fatalf("reading stream: %v", err)
		}
		if d, ok := strings.CutPrefix(ev, "data: "); ok {
			data = append(data, strings.TrimSpace(d))
		}
	}
}

// TestNATSRequests: unary and streamed chat and a completion travel over
// NATS to a worker whose record says so (its HTTP address is dead).
func TestNATSRequests(t *testing.T) {
	ns := natstest.Start(t)
	rec, _ := natsWorker(t, ns, startSim(t, nil), 0)
	tr := natsRouter(t, natsClient(t, ns, natsreq.ClientConfig{IdleTimeout: 10 * time.Second}), nil, rec)

	resp, body := tr.chat(t, "sim-model")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Infera-Worker") != rec.WorkerID {
		t.Fatalf("unary chat: %d %q %s", resp.StatusCode, resp.Header.Get("X-Infera-Worker"), body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("unary content type %q", ct)
	}
	var chat struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &chat); err != nil || chat.Object != "chat.completion" || len(chat.Choices) != 1 || chat.Choices[0].Message.Content == "" {
		t.Fatalf("unary chat body %s (%v)", body, err)
	}

	resp, body = tr.do(t, http.MethodPost, "/v1/completions", `{"model":"sim-model","prompt":"hello","max_tokens":5}`)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"text_completion"`) {
		t.Fatalf("completion: %d %s", resp.StatusCode, body)
	}

	sresp, r := tr.stream(t, `{"model":"sim-model","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`)
	defer sresp.Body.Close()
	if sresp.StatusCode != http.StatusOK || !strings.HasPrefix(sresp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %d %q", sresp.StatusCode, sresp.Header.Get("Content-Type"))
	}
	data := readStream(t, r)
	if len(data) < 3 || data[len(data)-1] != "[DONE]" || !strings.Contains(data[0], "chat.completion.chunk") {
		t.Fatalf("stream events %q", data)
	}

	// An engine's 4xx comes back with its status and body.
	resp, body = tr.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"sim-model","messages":"not a list"}`)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "error") {
		t.Fatalf("engine 400: %d %s", resp.StatusCode, body)
	}
}

// TestNATSClientLeavesCancels: a client that leaves a stream (or a unary
// request) cancels the engine's request through the cancel subject.
func TestNATSClientLeavesCancels(t *testing.T) {
	ns := natstest.Start(t)
	sim := startSim(t, func(c *config.Sim) { c.DecodeMsPerToken = 20; c.TimeScale = 1 })
	rec, srv := natsWorker(t, ns, sim, 0)
	tr := natsRouter(t, natsClient(t, ns, natsreq.ClientConfig{}), nil, rec)

	resp, r := tr.stream(t, `{"model":"sim-model","stream":true,"max_tokens":5000,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	readEvent(t, r)
	if srv.InFlight() != 1 {
		t.Fatalf("worker in flight %d, want 1", srv.InFlight())
	}
	resp.Body.Close()
	tr.client.Transport.(*http.Transport).CloseIdleConnections()
	testkit.Eventually(t, "the worker cancelled the streamed request", func() bool { return srv.InFlight() == 0 })
	testkit.Eventually(t, "the engine dropped the streamed request", func() bool { return simGauge(t, sim, "vllm:num_requests_running") == 0 })
}

// TestNATSFailover: a worker that sends nothing before the first-byte
// deadline loses the request to the other one, and the client never sees
// it; over NATS's own idle timeout too.
func TestNATSFailover(t *testing.T) {
	ns := natstest.Start(t)
	hung, hungSrv := natsWorker(t, ns, startSim(t, func(c *config.Sim) { c.HangBeforeFirstToken = 1 }), 0)
	good, _ := natsWorker(t, ns, startSim(t, nil), 0)
	for _, tc := range []struct {
		name string
		ccfg natsreq.ClientConfig
		set  func(*router.Config)
	}{
		{"ttft-timeout", natsreq.ClientConfig{}, func(c *router.Config) { c.TTFTTimeout = time.Second }},
		{"nats-idle-timeout", natsreq.ClientConfig{IdleTimeout: time.Second}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := natsRouter(t, natsClient(t, ns, tc.ccfg), func(c *router.Config) {
				c.BreakerThreshold = 100
				if tc.set != nil {
					tc.set(c)
				}
			}, hung, good)
			for i := range 4 {
				resp, body := tr.chat(t, "sim-model")
				if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Infera-Worker") != good.WorkerID {
					t.Fatalf("unary %d: %d %q %s", i, resp.StatusCode, resp.Header.Get("X-Infera-Worker"), body)
				}
				sresp, r := tr.stream(t, `{"model":"sim-model","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
				data := readStream(t, r)
				sresp.Body.Close()
				if sresp.StatusCode != http.StatusOK || len(data) == 0 || data[len(data)-1] != "[DONE]" {
					t.Fatalf("stream %d: %d %q", i, sresp.StatusCode, data)
				}
			}
			testkit.Eventually(t, "the hung worker's requests were cancelled", func() bool { return hungSrv.InFlight() == 0 })
		})
	}
	// Alone, the hung worker's request ends in 504.
	tr := natsRouter(t, natsClient(t, ns, natsreq.ClientConfig{IdleTimeout: 300 * time.Millisecond}), nil, hung)
	resp, body := tr.chat(t, "sim-model")
	wantError(t, resp, body, http.StatusGatewayTimeout, "upstream_timeout")
}

// TestNATSBacklog: with JetStream admission a worker whose backlog reached
// --nats-req-max-pending is skipped; when every candidate is, 429 with
// Retry-After: 1 and the reference's body. Nothing is lost: the accepted
// request completes.
func TestNATSBacklog(t *testing.T) {
	ns := natstest.Start(t)
	sim := startSim(t, func(c *config.Sim) { c.DecodeMsPerToken = 20; c.TimeScale = 1 })
	rec, _ := natsWorker(t, ns, sim, 1)
	c := natsClient(t, ns, natsreq.ClientConfig{MaxPending: 1})
	tr := natsRouter(t, c, nil, rec)

	resp, r := tr.stream(t, `{"model":"sim-model","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("first stream: %d", resp.StatusCode)
	}
	readEvent(t, r)
	// The backlog is read in the background: once a read saw the stream,
	// the worker is refused.
	var resp2 *http.Response
	var body []byte
	testkit.Eventually(t, "the backlog read refuses", func() bool {
		resp2, body = tr.chat(t, "sim-model")
		return resp2.StatusCode != http.StatusOK
	})
	if resp2.StatusCode != http.StatusTooManyRequests || resp2.Header.Get("Retry-After") != "1" ||
		string(body) != `{"error":"worker `+rec.WorkerID+` request backlog over limit"}` {
		t.Fatalf("over the backlog: %d %q %s", resp2.StatusCode, resp2.Header.Get("Retry-After"), body)
	}
	data := readStream(t, r)
	if len(data) == 0 || data[len(data)-1] != "[DONE]" {
		t.Fatalf("the accepted stream did not complete: %q", data)
	}
	testkit.Eventually(t, "the backlog emptied", func() bool {
		resp, body := tr.chat(t, "sim-model")
		return resp.StatusCode == http.StatusOK && len(body) > 0
	})
}

// TestNATSMixedFleet: one worker over HTTP, one over NATS, same model: the
// router sends requests to both; without a NATS client the NATS worker is
// unroutable.
func TestNATSMixedFleet(t *testing.T) {
	ns := natstest.Start(t)
	httpSim := startSim(t, nil)
	httpRec := simRecord(httpSim)
	natsRec, _ := natsWorker(t, ns, startSim(t, nil), 0)
	tr := natsRouter(t, natsClient(t, ns, natsreq.ClientConfig{}), nil, httpRec, natsRec)
	got := map[string]int{}
	for i := range 6 {
		resp, body := tr.chat(t, "sim-model")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("chat %d: %d %s", i, resp.StatusCode, body)
		}
		got[resp.Header.Get("X-Infera-Worker")]++
		sresp, r := tr.stream(t, `{"model":"sim-model","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
		data := readStream(t, r)
		sresp.Body.Close()
		if len(data) == 0 || data[len(data)-1] != "[DONE]" {
			t.Fatalf("stream %d: %q", i, data)
		}
		got[sresp.Header.Get("X-Infera-Worker")]++
	}
	if got[httpRec.WorkerID] == 0 || got[natsRec.WorkerID] == 0 || len(got) != 2 {
		t.Fatalf("requests by worker %v", got)
	}

	plain := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), natsRec)
	resp, body := plain.chat(t, "sim-model")
	wantError(t, resp, body, http.StatusServiceUnavailable, "no_worker_available")
	resp, body = plain.do(t, http.MethodGet, "/v1/workers", "")
	if !strings.Contains(string(body), `"unroutable":"unroutable: nats transport"`) {
		t.Fatalf("workers without a nats client: %d %s", resp.StatusCode, body)
	}
}

// fakeNATSWorker answers the requests published to a worker's subject with
// answer (a worker that misbehaves on the wire) and returns its record.
func fakeNATSWorker(t *testing.T, ns *natstest.Server, answer func(nc *nats.Conn, inbox string)) discovery.Record {
	t.Helper()
	nc := natsConn(t, ns)
	id := "127.0.0.1:" + strconv.Itoa(testkit.FreePort(t))
	sub, err := nc.Subscribe(natsreq.Subject(id), func(m *nats.Msg) { answer(nc, m.Reply) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return discovery.Record{
		WorkerID: id, URL: "http://" + id, ModelName: "sim-model", Engine: "sim",
		DisaggMode: discovery.DisaggMixed, DPSize: 1, RequestTransport: config.RequestTransportNATS, Status: discovery.StatusActive,
	}
}

func frame(nc *nats.Conn, inbox, typ string, data []byte) {
	_ = nc.PublishMsg(&nats.Msg{Subject: inbox, Data: data, Header: nats.Header{natsreq.HeaderType: []string{typ}}})
}

// TestNATSErrorsOnTheWire: an error frame before the first byte moves the
// request to another worker; silence after the first event ends the stream
// with an in-stream timeout error event; a worker's draining hand-back
// mid-stream ends it with an error event too.
func TestNATSErrorsOnTheWire(t *testing.T) {
	ns := natstest.Start(t)
	broken := fakeNATSWorker(t, ns, func(nc *nats.Conn, inbox string) {
		frame(nc, inbox, natsreq.TypeError, []byte("engine exploded"))
	})
	good, _ := natsWorker(t, ns, startSim(t, nil), 0)
	c := natsClient(t, ns, natsreq.ClientConfig{})
	tr := natsRouter(t, c, func(c *router.Config) { c.BreakerThreshold = 100 }, broken, good)
	for i := range 4 {
		resp, body := tr.chat(t, "sim-model")
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Infera-Worker") != good.WorkerID {
			t.Fatalf("chat %d: %d %q %s", i, resp.StatusCode, resp.Header.Get("X-Infera-Worker"), body)
		}
	}

	for _, tc := range []struct {
		name, after string
		then        func(nc *nats.Conn, inbox string)
	}{
		{"idle", "worker timed out", func(*nats.Conn, string) {}},
		{"draining", "worker draining", func(nc *nats.Conn, inbox string) {
			frame(nc, inbox, natsreq.TypeError, []byte(natsreq.DrainingNotice))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			silent := fakeNATSWorker(t, ns, func(nc *nats.Conn, inbox string) {
				frame(nc, inbox, natsreq.TypeData, []byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"))
				tc.then(nc, inbox)
			})
			tr := natsRouter(t, c, func(c *router.Config) { c.StreamIdleTimeout = 300 * time.Millisecond }, silent)
			resp, r := tr.stream(t, `{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
			defer resp.Body.Close()
			if ev := readEvent(t, r); !strings.Contains(ev, `"content":"a"`) {
				t.Fatalf("first event %q", ev)
			}
			if ev := readEvent(t, r); !strings.Contains(ev, `"error"`) || !strings.Contains(ev, tc.after) {
				t.Fatalf("after the first event: %q", ev)
			}
		})
	}
}

// TestNATSUnaryClientLeaves: a unary client that leaves while its answer is
// awaited cancels the worker's request.
func TestNATSUnaryClientLeaves(t *testing.T) {
	ns := natstest.Start(t)
	sim := startSim(t, func(c *config.Sim) { c.DecodeMsPerToken = 20; c.TimeScale = 1 })
	rec, srv := natsWorker(t, ns, sim, 0)
	tr := natsRouter(t, natsClient(t, ns, natsreq.ClientConfig{}), nil, rec)
	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tr.url+"/v1/chat/completions",
		strings.NewReader(`{"model":"sim-model","max_tokens":5000,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		resp, err := tr.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	testkit.Eventually(t, "the request on the worker", func() bool { return srv.InFlight() == 1 })
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the request completed")
	}
	testkit.Eventually(t, "the worker cancelled the request", func() bool { return srv.InFlight() == 0 })
	testkit.Eventually(t, "the engine dropped the request", func() bool { return simGauge(t, sim, "vllm:num_requests_running") == 0 })
}

// TestNATSOutage: with the NATS server stopped (SIGSTOP), requests for the
// NATS worker fail over to the HTTP worker after the first-byte deadline
// and every client is answered; a fleet of NATS workers only answers 504;
// once the server resumes the NATS worker serves again, without a restart.
// With JetStream admission too: neither the backlog read nor the publish
// (which waits for the stream's acknowledgement) holds a request past its
// first-byte deadline.
func TestNATSOutage(t *testing.T) {
	for _, pending := range []int{0, 4} {
		name := "core"
		if pending > 0 {
			name = "jetstream"
		}
		t.Run(name, func(t *testing.T) { testNATSOutage(t, pending) })
	}
}

func testNATSOutage(t *testing.T, pending int) {
	ns := natstest.Start(t)
	httpRec := simRecord(startSim(t, nil))
	natsRec, _ := natsWorker(t, ns, startSim(t, nil), pending)
	c := natsClient(t, ns, natsreq.ClientConfig{MaxPending: pending})
	set := func(c *router.Config) { c.TTFTTimeout = time.Second; c.BreakerThreshold = 100 }
	tr := natsRouter(t, c, set, httpRec, natsRec)
	only := natsRouter(t, c, set, natsRec)
	// The backlog read once before the outage.
	testkit.Eventually(t, "the NATS worker serves", func() bool {
		resp, _ := only.chat(t, "sim-model")
		return resp.StatusCode == http.StatusOK
	})

	ns.Pause()
	for i := range 4 {
		start := time.Now()
		resp, body := tr.chat(t, "sim-model")
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Infera-Worker") != httpRec.WorkerID {
			t.Fatalf("chat %d during the outage: %d %q %s", i, resp.StatusCode, resp.Header.Get("X-Infera-Worker"), body)
		}
		// At most one first-byte deadline on the NATS worker (1 s), far
		// from the JetStream client's 5 s publish timeout.
		if d := time.Since(start); d > 4*time.Second {
			t.Fatalf("chat %d during the outage took %v", i, d)
		}
	}
	resp, body := only.chat(t, "sim-model")
	wantError(t, resp, body, http.StatusGatewayTimeout, "upstream_timeout")
	ns.Resume()

	testkit.Eventually(t, "the NATS worker serves again", func() bool {
		resp, _ := only.chat(t, "sim-model")
		return resp.StatusCode == http.StatusOK
	})
	// Both workers serve again (with admission, once the requests the
	// resumed server still delivered are done).
	seen := map[string]int{}
	testkit.Eventually(t, "both workers serve after the outage", func() bool {
		resp, body := tr.chat(t, "sim-model")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("after the outage: %d %s", resp.StatusCode, body)
		}
		seen[resp.Header.Get("X-Infera-Worker")]++
		return seen[natsRec.WorkerID] > 0 && seen[httpRec.WorkerID] > 0
	})
}

// TestNATSPD: a pair of a concurrent protocol whose workers both take NATS
// exchanges both legs over NATS (the prefill's envelope never streams); a
// serial protocol's pair stays on HTTP, as the reference's.
func TestNATSPD(t *testing.T) {
	ns := natstest.Start(t)
	mon := natsConn(t, ns)
	type seen struct {
		subject string
		stream  bool
	}
	envs := make(chan seen, 64)
	if _, err := mon.Subscribe(natsreq.SubjectPrefix+".>", func(m *nats.Msg) {
		e, err := natsreq.ParseEnvelope(m.Data)
		if err != nil {
			t.Errorf("envelope %q: %v", m.Data, err)
		}
		envs <- seen{m.Subject, e.Stream}
	}); err != nil {
		t.Fatal(err)
	}
	if err := mon.Flush(); err != nil {
		t.Fatal(err)
	}
	c := natsClient(t, ns, natsreq.ClientConfig{})
	for _, proto := range []string{discovery.ProtocolSGLangBootstrap, discovery.ProtocolVLLMMooncake, discovery.ProtocolVLLMNixl} {
		t.Run(proto, func(t *testing.T) {
			p := startPDSim(t, "prefill", proto, nil)
			d := startPDSim(t, "decode", proto, nil)
			recs := []discovery.Record{p.record(discovery.DisaggPrefill, proto), d.record(discovery.DisaggDecode, proto)}
			for i := range recs {
				recs[i].RequestTransport = config.RequestTransportNATS
				srv, err := natsreq.NewServer(natsreq.ServerConfig{WorkerID: recs[i].WorkerID, EngineURL: recs[i].URL}, natsConn(t, ns), zerolog.Nop())
				if err != nil {
					t.Fatal(err)
				}
				if err := srv.Start(t.Context()); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { srv.Stop(0) })
			}
			cfg := withConfig(func(c *router.Config) { c.PDPrefillTimeout = 5 * time.Second; c.TTFTTimeout = 10 * time.Second })
			cfg.NATSRequests = c
			tr := startRouter(t, &router.RoundRobin{}, cfg, recs...)
			for _, stream := range []bool{false, true} {
				body := pdChat
				if stream {
					body = pdStreamChat(pdChat)
				}
				resp, out := tr.do(t, http.MethodPost, "/v1/chat/completions", body)
				if resp.StatusCode != http.StatusOK || strings.Contains(string(out), `"error"`) || resp.Header.Get("X-Infera-PD") != "disaggregated" {
					t.Fatalf("stream %v: %d %s (prefill got %v, decode got %v)", stream, resp.StatusCode, out, p.got(t), d.got(t))
				}
				if stream && !strings.Contains(string(out), "data: [DONE]") {
					t.Fatalf("stream without its end: %s", out)
				}
				if proto == discovery.ProtocolVLLMNixl {
					continue
				}
				got := map[string]bool{}
				for range 2 {
					select {
					case e := <-envs:
						got[e.subject] = e.stream
					case <-time.After(10 * time.Second):
						t.Fatalf("stream %v: envelopes %v, want both legs'", stream, got)
					}
				}
				ps, pok := got[natsreq.Subject(recs[0].WorkerID)]
				ds, dok := got[natsreq.Subject(recs[1].WorkerID)]
				if !pok || !dok || ps || ds != stream {
					t.Fatalf("stream %v: envelopes by subject %v", stream, got)
				}
			}
			if proto == discovery.ProtocolVLLMNixl {
				select {
				case e := <-envs:
					t.Fatalf("a serial protocol's leg over NATS: %v", e)
				case <-time.After(200 * time.Millisecond):
				}
			}
			if len(p.got(t)) != 2 || len(d.got(t)) != 2 {
				t.Fatalf("prefill got %d, decode %d", len(p.got(t)), len(d.got(t)))
			}
		})
	}
}

// TestNATSPDBacklog: a pair over NATS whose decode worker's backlog is at
// the limit is refused with 429 and the reference's PD body, no retry;
// the accepted request completes.
func TestNATSPDBacklog(t *testing.T) {
	ns := natstest.Start(t)
	proto := discovery.ProtocolSGLangBootstrap
	p := startPDSim(t, "prefill", proto, nil)
	d := startPDSim(t, "decode", proto, func(c *config.Sim) { c.TimeScale = 1; c.DecodeMsPerToken = 20 })
	recs := []discovery.Record{p.record(discovery.DisaggPrefill, proto), d.record(discovery.DisaggDecode, proto)}
	for i := range recs {
		recs[i].RequestTransport = config.RequestTransportNATS
		srv, err := natsreq.NewServer(natsreq.ServerConfig{WorkerID: recs[i].WorkerID, EngineURL: recs[i].URL, MaxPending: 1}, natsConn(t, ns), zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Stop(0) })
	}
	cfg := withConfig(func(c *router.Config) { c.PDPrefillTimeout = 5 * time.Second })
	cfg.NATSRequests = natsClient(t, ns, natsreq.ClientConfig{MaxPending: 1})
	tr := startRouter(t, &router.RoundRobin{}, cfg, recs...)

	resp, r := tr.stream(t, strings.Replace(pdStreamChat(pdChat), `"max_tokens":5`, `"max_tokens":100`, 1))
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	readEvent(t, r)
	var resp2 *http.Response
	var body []byte
	testkit.Eventually(t, "the backlog read refuses", func() bool {
		resp2, body = tr.do(t, http.MethodPost, "/v1/chat/completions", pdChat)
		return resp2.StatusCode != http.StatusOK
	})
	if resp2.StatusCode != http.StatusTooManyRequests || resp2.Header.Get("Retry-After") != "1" || string(body) != natsreq.PDBacklogBody {
		t.Fatalf("over the backlog: %d %q %s", resp2.StatusCode, resp2.Header.Get("Retry-After"), body)
	}
	data := readSSE(t, r)
	if len(data) == 0 || data[len(data)-1] != "[DONE]" {
		t.Fatalf("the accepted stream did not complete: %q", data)
	}
}

// TestNATSDrainHandBackContinues: a worker whose record the router still
// sees active hands a stream back with the drain notice after its first
// event: the stream continues on another worker over NATS, ends with
// [DONE] and no error event, and counts as a worker_draining migration
// (the notice, not the record's status, says why it broke), not as a
// fault of the worker.
func TestNATSDrainHandBackContinues(t *testing.T) {
	ns := natstest.Start(t)
	handing := fakeNATSWorker(t, ns, func(nc *nats.Conn, inbox string) {
		frame(nc, inbox, natsreq.TypeData, []byte("data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n"))
		frame(nc, inbox, natsreq.TypeError, []byte(natsreq.DrainingNotice))
	})
	good, _ := natsWorker(t, ns, startSim(t, nil), 0)
	cfg := migrationConfig(3)
	cfg.NATSRequests = natsClient(t, ns, natsreq.ClientConfig{})
	tr := startRouter(t, prefer{handing.WorkerID, good.WorkerID}, cfg, handing, good)
	_, _, errored, raw := streamText(t, tr, "/v1/chat/completions", contChat)
	if errored || !strings.HasSuffix(strings.TrimSpace(raw), "data: [DONE]") || !strings.Contains(raw, `"content":"a"`) {
		t.Fatalf("handed-back stream: error %v\n%s", errored, raw)
	}
	if n := metric(t, tr, `infera_migrations_total{reason="worker_draining"}`); n != 1 {
		t.Fatalf("infera_migrations_total{worker_draining} = %v, want 1", n)
	}
	if n := metric(t, tr, `infera_migrations_total{reason="stream_broken"}`); n != 0 {
		t.Fatalf("infera_migrations_total{stream_broken} = %v, want 0", n)
	}
}

// TestNATSStalledWorkerGivenUp: a NATS worker whose engine hangs (no
// frame, no idle timeout on the NATS client, a long first-byte timeout)
// is given up once the stall is confirmed, as an HTTP worker is: the
// unary request and the stream waiting there move to another worker long
// before --ttft-timeout.
func TestNATSStalledWorkerGivenUp(t *testing.T) {
	ns := natstest.Start(t)
	hung, hungSrv := natsWorker(t, ns, startSim(t, func(c *config.Sim) { c.HangBeforeFirstToken = 1 }), 0)
	good, _ := natsWorker(t, ns, startSim(t, nil), 0)
	cfg := withConfig(func(c *router.Config) {
		c.StallWindow = 300 * time.Millisecond
		c.StallProbeInterval = 100 * time.Millisecond
		c.TTFTTimeout = time.Minute
		c.MaxRetries = 1
	})
	cfg.NATSRequests = natsClient(t, ns, natsreq.ClientConfig{})
	tr := startRouter(t, prefer{hung.WorkerID, good.WorkerID}, cfg, hung, good)

	start := time.Now()
	resp, body := tr.chat(t, "sim-model")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Infera-Worker") != good.WorkerID {
		t.Fatalf("unary: %d %q %s", resp.StatusCode, resp.Header.Get("X-Infera-Worker"), body)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("the unary request left the stalled worker after %v", d)
	}
	if got := metric(t, tr, `infera_router_upstream_failures_total{reason="stalled"}`); got != 1 {
		t.Fatalf("stalled attempts = %v, want 1", got)
	}
	testkit.Eventually(t, "the stalled worker's request cancelled", func() bool { return hungSrv.InFlight() == 0 })
}
