package router_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/router"
)

func TestUnaryRelay(t *testing.T) {
	const answer = "{\"id\":\"cmpl-7\",\"choices\":[{\"message\":{\"content\":\"h\\u00e9llo\"}}],\n \"usage\":{\"prompt_tokens\":3}}\n"
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json; charset=utf-8")
		ctx.SetBodyString(answer)
	})
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), record(up, "m", discovery.StatusActive))

	const body = "{ \"model\" : \"m\",\n\"messages\":[{\"role\":\"user\",\"content\":\"caf\u00e9 \\\"x\\\"\"}], \"max_tokens\": 5 }"
	resp, got := tr.do(t, http.MethodPost, "/v1/chat/completions", body, "Authorization", "Bearer sk-test", "Cookie", "secret=1")
	if resp.StatusCode != http.StatusOK || string(got) != answer {
		t.Fatalf("got %d %q, want 200 %q", resp.StatusCode, got, answer)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
		t.Fatalf("content-type %q not relayed", ct)
	}
	if w := resp.Header.Get("X-Infera-Worker"); w != up.addr {
		t.Fatalf("X-Infera-Worker %q, want %q", w, up.addr)
	}
	id := resp.Header.Get("X-Request-Id")
	if id == "" {
		t.Fatal("no X-Request-Id generated")
	}
	seen := up.seen()
	if len(seen) != 1 {
		t.Fatalf("upstream saw %d requests", len(seen))
	}
	s := seen[0]
	if s.Path != "/v1/chat/completions" || string(s.Body) != body {
		t.Fatalf("upstream got %s %q, want the body byte for byte", s.Path, s.Body)
	}
	if s.Headers["Authorization"] != "Bearer sk-test" || s.Headers["Content-Type"] != "application/json" || s.Headers["X-Request-Id"] != id {
		t.Fatalf("headers not forwarded: %v", s.Headers)
	}
	if _, ok := s.Headers["Cookie"]; ok {
		t.Fatal("Cookie forwarded to the worker")
	}

	// A second request gets a different id.
	resp2, _ := tr.chat(t, "m")
	if id2 := resp2.Header.Get("X-Request-Id"); id2 == "" || id2 == id {
		t.Fatalf("request ids %q then %q, want distinct", id, id2)
	}
}

func TestRequestIDFromClient(t *testing.T) {
	up := jsonUpstream(t)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), record(up, "m", discovery.StatusActive))
	for _, tc := range []struct {
		sent string
		kept bool
	}{
		{"req-abc_123", true},
		{strings.Repeat("x", 128), true},
		{strings.Repeat("x", 129), false},
		{"has space", false},
	} {
		resp, _ := tr.do(t, http.MethodPost, "/v1/completions", `{"model":"m","prompt":"x"}`, "X-Request-Id", tc.sent)
		got := resp.Header.Get("X-Request-Id")
		if (got == tc.sent) != tc.kept || got == "" {
			t.Fatalf("sent X-Request-Id %q, got back %q (keep=%v)", tc.sent, got, tc.kept)
		}
		seen := up.seen()
		if up := seen[len(seen)-1]; up.Headers["X-Request-Id"] != got || up.Path != "/v1/completions" {
			t.Fatalf("worker got id %q path %s, client got %q", up.Headers["X-Request-Id"], up.Path, got)
		}
	}
}

func TestUpstreamStatusRelayed(t *testing.T) {
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"object":"error","message":"max_tokens too large","code":400}`)
	})
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), record(up, "m", discovery.StatusActive))
	resp, body := tr.chat(t, "m")
	if resp.StatusCode != 400 || string(body) != `{"object":"error","message":"max_tokens too large","code":400}` {
		t.Fatalf("got %d %s, want the worker's 400 relayed", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Infera-Worker") != up.addr {
		t.Fatal("X-Infera-Worker missing on a relayed error")
	}
}

// sseUpstream streams the given events, flushing each; before each event
// after the first it waits on gate (if not nil).
func sseUpstream(t *testing.T, events []string, gate <-chan struct{}) *upstream {
	return startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for i, ev := range events {
				if i > 0 && gate != nil {
					select {
					case <-gate:
					case <-time.After(10 * time.Second):
						return
					}
				}
				_, _ = w.WriteString(ev)
				if err := w.Flush(); err != nil {
					return
				}
			}
		})
	})
}

func TestStreamRelayByteExactAndFlushedPerEvent(t *testing.T) {
	events := []string{
		"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"h\u00e9\"}}]}\r\n\r\n",
		": keep-alive comment\n\n",
		"event: x\rdata: {\"choices\":[]}\r\r",
		"data: {\"usage\":{\"prompt_tokens\":3}}\n\n",
		"data: [DONE]\n\n",
	}
	gate := make(chan struct{})
	up := sseUpstream(t, events, gate)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), record(up, "m", discovery.StatusActive))

	resp, br := tr.stream(t, `{"model":"m","stream":true,"messages":[]}`)
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("X-Infera-Worker") != up.addr {
		t.Fatalf("status %d headers %v", resp.StatusCode, resp.Header)
	}
	// The worker sends event i+1 only after the client has read event i, so
	// the stream completes only if every event is flushed on its own.
	for i, ev := range events {
		got := make([]byte, len(ev))
		if _, err := io.ReadFull(br, got); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if string(got) != ev {
			t.Fatalf("event %d = %q, want %q", i, got, ev)
		}
		if i < len(events)-1 {
			gate <- struct{}{}
		}
	}
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after the last event: %q, %v", rest, err)
	}
}

func TestStreamTrailingPartialEvent(t *testing.T) {
	events := []string{"data: 1\n\n", "data: no blank line at the end"}
	up := sseUpstream(t, events, nil)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), record(up, "m", discovery.StatusActive))
	resp, body := tr.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"m","stream":true}`)
	if resp.StatusCode != 200 || string(body) != strings.Join(events, "") {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
}

// rawUpstream accepts connections and runs fn on each, one at a time (a
// worker that misbehaves at the TCP level). stop is closed when the test
// ends.
func rawUpstream(t *testing.T, fn func(c net.Conn, stop <-chan struct{})) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fn(c, stop)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { close(stop); _ = ln.Close(); <-done })
	return &upstream{addr: ln.Addr().String()}
}

func readRequest(c net.Conn) {
	var req fasthttp.Request
	_ = req.Read(bufio.NewReader(c))
}

func TestStreamWorkerDiesMidStream(t *testing.T) {
	up := rawUpstream(t, func(c net.Conn, _ <-chan struct{}) {
		readRequest(c)
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+
			"b\r\ndata: 1\n\nda\r\n")
		// ...and the connection drops in the middle of the second event.
	})
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), record(up, "m", discovery.StatusActive))
	resp, body := tr.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"m","stream":true}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	first, rest, _ := strings.Cut(string(body), "\n\n")
	if first != "data: 1" || !strings.HasPrefix(rest, `data: {"error":`) || !strings.HasSuffix(rest, "\n\n") {
		t.Fatalf("body %q: want the first event, then an SSE error event", body)
	}
	var env envelope
	if err := json.Unmarshal([]byte(strings.TrimSuffix(strings.TrimPrefix(rest, "data: "), "\n\n")), &env); err != nil || *env.Error.Code != "upstream_stream_error" {
		t.Fatalf("error event %q: %v", rest, err)
	}
}

func TestUpstreamTimeout(t *testing.T) {
	up := rawUpstream(t, func(c net.Conn, stop <-chan struct{}) {
		readRequest(c)
		<-stop
	})
	tr := startRouter(t, router.RoundRobin{}, withConfig(func(c *router.Config) { c.UpstreamTimeout = 100 * time.Millisecond }), record(up, "m", discovery.StatusActive))
	resp, body := tr.chat(t, "m")
	wantError(t, resp, body, http.StatusGatewayTimeout, "upstream_timeout")
}

func TestUpstreamDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := &upstream{addr: ln.Addr().String()}
	_ = ln.Close()
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), record(down, "m", discovery.StatusActive))
	resp, body := tr.chat(t, "m")
	wantError(t, resp, body, http.StatusBadGateway, "upstream_error")
	if resp.Header.Get("X-Infera-Worker") != down.addr {
		t.Fatal("X-Infera-Worker missing on 502")
	}
}

func TestRoundRobinSpreads(t *testing.T) {
	a, b := jsonUpstream(t), jsonUpstream(t)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(),
		record(a, "m", discovery.StatusActive), record(b, "m", discovery.StatusActive))
	var order []string
	for range 10 {
		resp, _ := tr.chat(t, "m")
		order = append(order, resp.Header.Get("X-Infera-Worker"))
	}
	for i := range order {
		if i > 0 && order[i] == order[i-1] {
			t.Fatalf("round-robin sent consecutive requests to the same worker: %v", order)
		}
	}
	if len(a.seen()) != 5 || len(b.seen()) != 5 {
		t.Fatalf("split %d/%d, want 5/5", len(a.seen()), len(b.seen()))
	}
}

func TestLeastLoadPrefersIdle(t *testing.T) {
	gate := make(chan struct{})
	// The busy worker streams (held open by gate) when asked to, and
	// answers plain requests at once.
	busy := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if !strings.Contains(string(ctx.PostBody()), `"stream":true`) {
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{}`)
			return
		}
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			_, _ = w.WriteString("data: 1\n\n")
			_ = w.Flush()
			select {
			case <-gate:
			case <-time.After(10 * time.Second):
			}
			_, _ = w.WriteString("data: [DONE]\n\n")
		})
	})
	idle := jsonUpstream(t)
	// The busy worker sorts first, so a naive policy would pick it first.
	recs := []discovery.Record{record(busy, "m", discovery.StatusActive), record(idle, "m", discovery.StatusActive)}
	if recs[0].WorkerID > recs[1].WorkerID {
		recs[0], recs[1] = recs[1], recs[0]
	}
	tr := startRouter(t, router.LeastLoad{}, router.DefaultConfig(), recs...)

	// Hold one stream open on whichever worker takes it; make it the busy one.
	var resp *http.Response
	var br *bufio.Reader
	for {
		resp, br = tr.stream(t, `{"model":"m","stream":true}`)
		if resp.Header.Get("X-Infera-Worker") == busy.addr {
			break
		}
		_, _ = io.ReadAll(br)
		resp.Body.Close()
	}
	defer resp.Body.Close()
	readEvent(t, br)
	for range 5 {
		r, _ := tr.chat(t, "m")
		if w := r.Header.Get("X-Infera-Worker"); w != idle.addr {
			t.Fatalf("least-load picked %s while %s has a request in flight", w, busy.addr)
		}
	}
	gate <- struct{}{}
	if ev := readEvent(t, br); ev != "data: [DONE]\n\n" {
		t.Fatalf("last event %q", ev)
	}
	// The end of the body comes after the router has released the request.
	if rest, err := io.ReadAll(br); err != nil || len(rest) > 0 {
		t.Fatalf("after [DONE]: %q, %v", rest, err)
	}
	// Both idle again: ties rotate, so both get traffic.
	seen := map[string]int{}
	for range 4 {
		r, _ := tr.chat(t, "m")
		seen[r.Header.Get("X-Infera-Worker")]++
	}
	if len(seen) != 2 {
		t.Fatalf("idle workers did not share the load: %v", seen)
	}
}

func TestDrainingWorkerGetsNothing(t *testing.T) {
	active, draining := jsonUpstream(t), jsonUpstream(t)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(),
		record(active, "m", discovery.StatusActive), record(draining, "m", discovery.StatusDraining))
	for range 6 {
		resp, _ := tr.chat(t, "m")
		if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Worker") != active.addr {
			t.Fatalf("status %d worker %q", resp.StatusCode, resp.Header.Get("X-Infera-Worker"))
		}
	}
	if n := len(draining.seen()); n != 0 {
		t.Fatalf("draining worker got %d requests", n)
	}
	// Everyone draining: the model is known, but nobody takes it.
	tr.UpdateFleet(&discovery.Snapshot{Revision: 2, Workers: []discovery.Record{
		record(active, "m", discovery.StatusDraining), record(draining, "m", discovery.StatusDraining)}})
	resp, body := tr.chat(t, "m")
	wantError(t, resp, body, http.StatusServiceUnavailable, "no_worker_available")
}

func TestErrors(t *testing.T) {
	up := jsonUpstream(t)
	tr := startRouter(t, router.RoundRobin{}, withConfig(func(c *router.Config) { c.MaxBodyBytes = 4096 }), record(up, "m", discovery.StatusActive))
	big := `{"model":"m","prompt":"` + strings.Repeat("x", 5000) + `"}`
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"nope","messages":[]}`, 404, "model_not_found"},
		{"invalid json", "POST", "/v1/chat/completions", `{"model":"m",`, 400, "invalid_json"},
		{"invalid utf8", "POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"\xff\"}", 400, "invalid_json"},
		{"wrong type", "POST", "/v1/chat/completions", `{"model":"m","stream":"yes"}`, 400, "invalid_field"},
		{"no model", "POST", "/v1/completions", `{"prompt":"x"}`, 400, "missing_model"},
		{"not an object", "POST", "/v1/completions", `[1]`, 400, "invalid_body"},
		{"too large", "POST", "/v1/completions", big, 413, "request_too_large"},
		{"wrong method", "GET", "/v1/chat/completions", "", 405, "method_not_allowed"},
		{"info wrong method", "POST", "/v1/models", "", 405, "method_not_allowed"},
		{"unknown path", "GET", "/v2/nothing", "", 404, "not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := tr.do(t, tc.method, tc.path, tc.body)
			wantError(t, resp, body, tc.status, tc.code)
		})
	}
	if n := len(up.seen()); n != 0 {
		t.Fatalf("worker got %d requests that should have been refused", n)
	}
}

func TestNotReadyBeforeFirstSnapshot(t *testing.T) {
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig())
	resp, body := tr.chat(t, "m")
	wantError(t, resp, body, http.StatusServiceUnavailable, "not_ready")
	resp, body = tr.do(t, "GET", "/health", "")
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"active_workers":0`) {
		t.Fatalf("health before the first snapshot: %d %s", resp.StatusCode, body)
	}
}

func TestInfoEndpoints(t *testing.T) {
	a, b, c := jsonUpstream(t), jsonUpstream(t), jsonUpstream(t)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(),
		record(a, "m1", discovery.StatusActive), record(b, "m1", discovery.StatusActive), record(c, "m2", discovery.StatusDraining))
	tr.UpdateFleet(&discovery.Snapshot{Revision: 7, Workers: []discovery.Record{
		record(a, "m1", discovery.StatusActive), record(b, "m1", discovery.StatusActive), record(c, "m2", discovery.StatusDraining)}})

	resp, body := tr.do(t, "GET", "/v1/models", "")
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &models); err != nil || resp.StatusCode != 200 || models.Object != "list" ||
		len(models.Data) != 1 || models.Data[0].ID != "m1" || models.Data[0].Object != "model" {
		t.Fatalf("/v1/models = %d %s (%v): want only m1, the model with active workers", resp.StatusCode, body, err)
	}

	resp, body = tr.do(t, "GET", "/v1/workers", "")
	var workers struct {
		Revision int64              `json:"revision"`
		Workers  []discovery.Record `json:"workers"`
	}
	if err := json.Unmarshal(body, &workers); err != nil || resp.StatusCode != 200 || workers.Revision != 7 || len(workers.Workers) != 3 {
		t.Fatalf("/v1/workers = %d %s (%v)", resp.StatusCode, body, err)
	}
	for _, w := range workers.Workers {
		if w.WorkerID == c.addr && w.Status != discovery.StatusDraining {
			t.Fatalf("worker %s status %q, want draining", w.WorkerID, w.Status)
		}
	}

	resp, body = tr.do(t, "GET", "/health", "")
	var health struct {
		Status        string `json:"status"`
		ActiveWorkers int    `json:"active_workers"`
		Workers       int    `json:"workers"`
	}
	if err := json.Unmarshal(body, &health); err != nil || resp.StatusCode != 200 || health.Status != "ok" || health.ActiveWorkers != 2 || health.Workers != 3 {
		t.Fatalf("/health = %d %s (%v)", resp.StatusCode, body, err)
	}

	tr.chat(t, "m1")
	tr.chat(t, "m1")
	tr.chat(t, "nope")
	resp, body = tr.do(t, "GET", "/metrics", "")
	text := string(body)
	for _, want := range []string{
		`infera_requests_total{outcome="ok",route="chat_completions"} 2`,
		`infera_requests_total{outcome="model_not_found",route="chat_completions"} 1`,
		`infera_router_request_duration_seconds_count{route="chat_completions"} 3`,
		`infera_request_duration_seconds_count{outcome="ok",router="mixed"} 2`,
		`infera_request_duration_seconds_count{outcome="4xx",router="mixed"} 1`,
		`infera_request_inflight{router="mixed"} 0`,
		`infera_router_picks_total{role="mixed",worker_id="` + a.addr + `"} 1`,
		`infera_ttft_seconds_bucket{route="chat_completions",le="+Inf"} 0`,
		`infera_requests_in_flight 0`,
		`infera_active_workers{disagg_mode="mixed"} 2`,
		`infera_worker_picks_total{worker_id="` + a.addr + `"} 1`,
		`infera_worker_picks_total{worker_id="` + b.addr + `"} 1`,
		`infera_worker_in_flight{worker_id="` + c.addr + `"} 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("/metrics: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if t.Failed() {
		t.Log(text)
	}
}

// TestClientDisconnectClosesUpstream: a client that goes away mid-stream
// makes the router close the worker connection, which the worker notices.
func TestClientDisconnectClosesUpstream(t *testing.T) {
	workerSawClose := make(chan struct{})
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for i := 0; ; i++ {
				_, _ = w.WriteString("data: " + strconv.Itoa(i) + "\n\n")
				if err := w.Flush(); err != nil {
					close(workerSawClose)
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	})
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), record(up, "m", discovery.StatusActive))
	resp, br := tr.stream(t, `{"model":"m","stream":true}`)
	if ev := readEvent(t, br); ev != "data: 0\n\n" {
		t.Fatalf("first event %q", ev)
	}
	resp.Body.Close() // net/http closes the connection of an unfinished body
	select {
	case <-workerSawClose:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker kept streaming after the client went away")
	}
	testkit.Eventually(t, "in-flight back to 0", func() bool {
		_, body := tr.do(t, "GET", "/metrics", "")
		return strings.Contains(string(body), "infera_requests_in_flight 0") &&
			strings.Contains(string(body), `infera_requests_total{outcome="client_gone",route="chat_completions"} 1`)
	})
}

func TestShutdownCutsStalledStreams(t *testing.T) {
	stall := make(chan struct{})
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			_, _ = w.WriteString("data: 1\n\n")
			_ = w.Flush()
			<-stall
		})
	})
	t.Cleanup(func() { close(stall) })
	r, err := router.New(withConfig(func(c *router.Config) {
		c.ShutdownTimeout = 100 * time.Millisecond
		c.IdleConnTimeout = 50 * time.Millisecond
	}), router.RoundRobin{}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	r.UpdateFleet(&discovery.Snapshot{Workers: []discovery.Record{record(up, "m", discovery.StatusActive)}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest("POST", "http://"+ln.Addr().String()+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	readEvent(t, br)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after the shutdown grace")
	}
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "upstream_stream_error") {
		t.Fatalf("a cut stream should end with an error event, got %q", rest)
	}
}

// ServeAll with a context already cancelled (SIGTERM during start-up) must
// return, not wait forever for a listener fasthttp registers after its
// Shutdown ran. 100 runs; a hang fails by the test timeout.
func TestServeAllCancelledContextReturns(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for i := range 100 {
		r, err := router.New(router.DefaultConfig(), router.RoundRobin{}, testLog(t))
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var adminLn net.Listener
		if i%2 == 1 {
			if adminLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.ServeAll(ctx, ln, adminLn); err != nil {
			t.Fatalf("run %d: ServeAll: %v", i, err)
		}
	}
}

func TestRegistry(t *testing.T) {
	reg := router.NewRegistry()
	if err := router.RegisterBuiltins(reg); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(reg.Names(), ","); got != "least-load,round-robin" {
		t.Fatalf("names %q", got)
	}
	if err := reg.Register("round-robin", func() (router.Policy, error) { return router.RoundRobin{}, nil }); !errors.Is(err, router.ErrDuplicatePolicy) {
		t.Fatalf("duplicate register: %v", err)
	}
	if _, err := reg.New("kv-aware"); !errors.Is(err, router.ErrUnknownPolicy) {
		t.Fatalf("unknown policy: %v", err)
	}
	for _, name := range reg.Names() {
		p, err := reg.New(name)
		if err != nil || p.Name() != name {
			t.Fatalf("New(%q) = %v, %v", name, p, err)
		}
	}
}

// GET /ready is 503 until a worker can take requests (before the first
// snapshot, with only draining workers) and 200 with one; /health stays
// 200 throughout and says how many workers are routable.
func TestReadyEndpoint(t *testing.T) {
	a := jsonUpstream(t)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig())
	ready := func(wantStatus, wantRoutable int) {
		t.Helper()
		resp, body := tr.do(t, "GET", "/ready", "")
		var r struct {
			RoutableWorkers int `json:"routable_workers"`
		}
		if err := json.Unmarshal(body, &r); err != nil || resp.StatusCode != wantStatus || r.RoutableWorkers != wantRoutable {
			t.Fatalf("/ready = %d %s (%v), want %d with %d routable", resp.StatusCode, body, err, wantStatus, wantRoutable)
		}
		resp, body = tr.do(t, "GET", "/health", "")
		var h struct {
			Status          string `json:"status"`
			RoutableWorkers int    `json:"routable_workers"`
			Ready           bool   `json:"ready"`
		}
		if err := json.Unmarshal(body, &h); err != nil || resp.StatusCode != 200 || h.RoutableWorkers != wantRoutable || h.Ready != (wantRoutable > 0) {
			t.Fatalf("/health = %d %s (%v), want 200 with %d routable", resp.StatusCode, body, err, wantRoutable)
		}
	}
	ready(http.StatusServiceUnavailable, 0)
	tr.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: []discovery.Record{record(a, "m", discovery.StatusDraining)}})
	ready(http.StatusServiceUnavailable, 0)
	tr.UpdateFleet(&discovery.Snapshot{Revision: 2, Workers: []discovery.Record{record(a, "m", discovery.StatusActive)}})
	ready(http.StatusOK, 1)
	tr.UpdateFleet(&discovery.Snapshot{Revision: 3})
	ready(http.StatusServiceUnavailable, 0)
}
