package router_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/router"
)

// metric returns the value of the /metrics line starting with series (name
// and labels, exactly as exported), or -1 when absent.
func metric(t *testing.T, tr *testRouter, series string) float64 {
	t.Helper()
	_, body := tr.do(t, http.MethodGet, "/metrics", "")
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return -1
}

// prefer picks the first candidate in its order of worker ids (else the
// first candidate): it fixes which worker a test's attempts hit, in turn.
type prefer []string

func (p prefer) Name() string { return "prefer" }
func (p prefer) Pick(_ *router.PickInput, c *router.Candidates) (router.Ticket, error) {
	for _, id := range p {
		for _, w := range c.Workers {
			if w.ID() == id {
				return router.Ticket{Worker: w}, nil
			}
		}
	}
	return router.Ticket{Worker: c.Workers[0]}, nil
}
func (p prefer) Release(router.Ticket, router.Result) {}

func downUpstream(t *testing.T) *upstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_ = ln.Close()
	return &upstream{addr: ln.Addr().String()}
}

// namedSSE streams events "data: <name>-i" n times.
func namedSSE(t *testing.T, name string, n int) *upstream {
	return startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for i := range n {
				_, _ = w.WriteString("data: " + name + "-" + strconv.Itoa(i) + "\n\n")
				_ = w.Flush()
			}
		})
	})
}

func TestFailoverUnaryConnectError(t *testing.T) {
	down, good := downUpstream(t), jsonUpstream(t)
	tr := startRouter(t, prefer{down.addr}, router.DefaultConfig(),
		record(down, "m", discovery.StatusActive), record(good, "m", discovery.StatusActive))
	for range 3 {
		resp, body := tr.chat(t, "m")
		if resp.StatusCode != 200 || !strings.Contains(string(body), good.addr) {
			t.Fatalf("status %d body %s: want the good worker's answer", resp.StatusCode, body)
		}
	}
	if got := metric(t, tr, `infera_router_retries_total{reason="connect"}`); got < 1 {
		t.Fatalf("retries_total{connect} = %v", got)
	}
}

// TestRetryShunsSilentWorker: a retry does not go to a worker that has a
// request in flight and has answered nothing since the retried request
// arrived (an engine hung before its first token, not yet suspected: its
// stall window has not run out) while another worker is free. It went
// there before, and the request's last attempt waited for --ttft-timeout
// and failed: in TestChaosUnary, requests from the killed engine.
func TestRetryShunsSilentWorker(t *testing.T) {
	down := downUpstream(t)
	hung, _ := frozenUpstream(t) // accepts, reads, never answers
	good := jsonUpstream(t)
	tr := startRouter(t, prefer{down.addr, hung.addr}, withConfig(func(c *router.Config) {
		c.MaxRetries = 1
		c.StallWindow = time.Hour // never suspected within the test
		c.TTFTTimeout = time.Minute
	}), record(down, "m", discovery.StatusActive), record(hung, "m", discovery.StatusActive), record(good, "m", discovery.StatusActive))

	// The first request fails on the down worker and its retry goes to
	// the hung one, idle until then: it waits there until we leave.
	ctx, cancel := context.WithCancel(t.Context())
	waiting := make(chan struct{})
	go func() {
		defer close(waiting)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tr.url+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := tr.client.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}()
	defer func() { cancel(); <-waiting }()
	testkit.Eventually(t, "the first request on the hung worker", func() bool { return len(hung.seen()) == 1 })

	// The second fails on the down worker too; its retry has the hung
	// worker, silent since before it arrived, and the good one.
	resp, body := tr.chat(t, "m")
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Worker") != good.addr {
		t.Fatalf("status %d from %s, body %s: want the good worker's answer", resp.StatusCode, resp.Header.Get("X-Infera-Worker"), body)
	}
	if n := len(hung.seen()); n != 1 {
		t.Fatalf("the hung worker got %d requests, want 1 (the retry shuns it)", n)
	}
}

// TestFailover5xxOpensBreaker: a worker answering 500 is retried around
// and, after the threshold, skipped entirely until its cooldown ends.
func TestFailover5xxOpensBreaker(t *testing.T) {
	bad := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.Error(`{"error":"boom"}`, 500) })
	good := jsonUpstream(t)
	tr := startRouter(t, prefer{bad.addr}, withConfig(func(c *router.Config) { c.BreakerThreshold = 2; c.BreakerCooldown = time.Hour }),
		record(bad, "m", discovery.StatusActive), record(good, "m", discovery.StatusActive))
	for range 6 {
		if resp, body := tr.chat(t, "m"); resp.StatusCode != 200 {
			t.Fatalf("status %d body %s", resp.StatusCode, body)
		}
	}
	if n := len(bad.seen()); n != 2 {
		t.Fatalf("the failing worker got %d requests, want 2 (then its breaker is open)", n)
	}
	if got := metric(t, tr, `infera_router_worker_breaker_state{worker_id="`+bad.addr+`"}`); got != 2 {
		t.Fatalf("breaker state %v, want 2 (open, as Infera numbers it)", got)
	}
	if got := metric(t, tr, `infera_router_worker_breaker_trips_total{worker_id="`+bad.addr+`"}`); got != 1 {
		t.Fatalf("trips %v, want 1", got)
	}
}

// TestAllBreakersOpenRoutesAnyway: when every candidate is open the request
// still goes out (and the worker's own 5xx comes back as is).
func TestAllBreakersOpenRoutesAnyway(t *testing.T) {
	bad := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.Error(`{"error":"boom"}`, 503) })
	tr := startRouter(t, router.RoundRobin{}, withConfig(func(c *router.Config) { c.BreakerThreshold = 1; c.BreakerCooldown = time.Hour }), record(bad, "m", discovery.StatusActive))
	for i := range 3 {
		resp, _ := tr.chat(t, "m")
		if resp.StatusCode != 503 {
			t.Fatalf("request %d: status %d, want the worker's 503", i, resp.StatusCode)
		}
	}
	if n := len(bad.seen()); n != 3 {
		t.Fatalf("worker saw %d requests, want 3", n)
	}
}

func TestUnary4xxNotRetried(t *testing.T) {
	a := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.Error(`{"error":"slow down"}`, 429) })
	b := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.Error(`{"error":"slow down"}`, 429) })
	tr := startRouter(t, router.RoundRobin{}, withConfig(func(c *router.Config) { c.BreakerThreshold = 1 }),
		record(a, "m", discovery.StatusActive), record(b, "m", discovery.StatusActive))
	resp, body := tr.chat(t, "m")
	if resp.StatusCode != 429 || string(body) != `{"error":"slow down"}` {
		t.Fatalf("status %d body %s: want the worker's 429 unchanged", resp.StatusCode, body)
	}
	if n := len(a.seen()) + len(b.seen()); n != 1 {
		t.Fatalf("a 4xx was retried: %d attempts", n)
	}
	if got := metric(t, tr, `infera_router_worker_breaker_state{worker_id="`+a.addr+`"}`); got != 0 {
		t.Fatal("a 429 tripped the breaker")
	}
}

// TestStreamFailoverBeforeFirstEvent: a stream that ends before its first
// event is replaced by another worker's; the client sees only the latter.
func TestStreamFailoverBeforeFirstEvent(t *testing.T) {
	empty := rawUpstream(t, func(c net.Conn, _ <-chan struct{}) {
		readRequest(c)
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
	})
	good := namedSSE(t, "good", 3)
	tr := startRouter(t, prefer{empty.addr}, router.DefaultConfig(),
		record(empty, "m", discovery.StatusActive), record(good, "m", discovery.StatusActive))
	resp, body := tr.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"m","stream":true}`)
	if resp.StatusCode != 200 || string(body) != "data: good-0\n\ndata: good-1\n\ndata: good-2\n\n" {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	if got := metric(t, tr, `infera_router_retries_total{reason="stream_ended"}`); got != 1 {
		t.Fatalf("retries{stream_ended} = %v", got)
	}
}

// TestStreamTTFTFailoverWithHeartbeats: a worker that sends headers and
// then nothing is abandoned at the first-byte timeout (its connection
// closed) and the stream comes from another worker; meanwhile the client
// got SSE comment heartbeats.
func TestStreamTTFTFailoverWithHeartbeats(t *testing.T) {
	closed := make(chan struct{})
	stall := rawUpstream(t, func(c net.Conn, stop <-chan struct{}) {
		readRequest(c)
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		var b [1]byte
		_, _ = c.Read(b[:]) // returns when the router closes the connection
		close(closed)
	})
	good := namedSSE(t, "good", 2)
	tr := startRouter(t, prefer{stall.addr}, withConfig(func(c *router.Config) {
		c.TTFTTimeout = 400 * time.Millisecond
		c.HeartbeatInterval = 50 * time.Millisecond
	}),
		record(stall, "m", discovery.StatusActive), record(good, "m", discovery.StatusActive))
	resp, body := tr.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"m","stream":true}`)
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), ": keep-alive\n\n") ||
		!strings.HasSuffix(string(body), "data: good-0\n\ndata: good-1\n\n") || strings.Contains(string(body), "error") {
		t.Fatalf("status %d body %q: want heartbeats, then the good worker's events", resp.StatusCode, body)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the timed-out worker's connection stayed open")
	}
	if got := metric(t, tr, `infera_router_timeouts_total{kind="ttft"}`); got != 1 {
		t.Fatalf("timeouts{ttft} = %v", got)
	}
}

// TestStreamIdleTimeoutEndsWithErrorEvent: after the first event no retry
// is possible; a silent worker ends the stream with one error event.
func TestStreamIdleTimeoutEndsWithErrorEvent(t *testing.T) {
	up := rawUpstream(t, func(c net.Conn, stop <-chan struct{}) {
		readRequest(c)
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n")
		var b [1]byte
		_, _ = c.Read(b[:])
	})
	tr := startRouter(t, router.RoundRobin{}, withConfig(func(c *router.Config) {
		c.StreamIdleTimeout = 300 * time.Millisecond
		c.HeartbeatInterval = 50 * time.Millisecond
	}),
		record(up, "m", discovery.StatusActive))
	resp, body := tr.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"m","stream":true}`)
	s := string(body)
	if resp.StatusCode != 200 || !strings.HasPrefix(s, "data: 1\n\n") || !strings.HasSuffix(s, "\n\n") ||
		strings.Count(s, `data: {"error":`) != 1 || !strings.Contains(s, `"code":"upstream_timeout"`) {
		t.Fatalf("body %q: want the event, heartbeats, then one upstream_timeout error event", s)
	}
	if got := metric(t, tr, `infera_router_timeouts_total{kind="idle"}`); got != 1 {
		t.Fatalf("timeouts{idle} = %v", got)
	}
}

// TestAdmissionQueueAnd429: with every worker at its in-flight limit a
// request waits for the queue timeout, then gets 429 with Retry-After; a
// queued request is woken as soon as a slot frees.
func TestAdmissionQueueAnd429(t *testing.T) {
	release := make(chan struct{})
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if strings.Contains(string(ctx.PostBody()), `"stream":true`) {
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				_, _ = w.WriteString("data: 1\n\n")
				_ = w.Flush()
				<-release
			})
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"ok":true}`)
	})
	tr := startRouter(t, router.RoundRobin{}, withConfig(func(c *router.Config) { c.MaxInflightPerWorker = 1; c.QueueTimeout = 200 * time.Millisecond }),
		record(up, "m", discovery.StatusActive))
	resp, br := tr.stream(t, `{"model":"m","stream":true}`)
	defer resp.Body.Close()
	readEvent(t, br)
	r2, body := tr.chat(t, "m")
	wantError(t, r2, body, http.StatusTooManyRequests, "too_many_requests")
	if r2.Header.Get("Retry-After") != "1" {
		t.Fatalf("Retry-After %q", r2.Header.Get("Retry-After"))
	}
	if got := metric(t, tr, `infera_router_rejected_total{reason="429"}`); got != 1 {
		t.Fatalf("rejected{429} = %v", got)
	}

	slow := startRouter(t, router.RoundRobin{}, withConfig(func(c *router.Config) { c.MaxInflightPerWorker = 1; c.QueueTimeout = time.Minute }),
		record(up, "m", discovery.StatusActive))
	resp3, br3 := slow.stream(t, `{"model":"m","stream":true}`)
	defer resp3.Body.Close()
	readEvent(t, br3)
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, slow.url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		r, err := slow.client.Do(req)
		if err != nil {
			done <- -1
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
		done <- r.StatusCode
	}()
	close(release) // both streams end: their slots free, the queued request goes
	select {
	case code := <-done:
		if code != 200 {
			t.Fatalf("queued request got %d", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the queued request was not woken by the freed slot")
	}
}

// TestSimHangClientGoneFreesSequence: a stream waiting on an engine that
// never produces a token still notices its client leaving (heartbeats), and
// closing the upstream frees the engine's sequence.
func TestSimHangClientGoneFreesSequence(t *testing.T) {
	s := startSim(t, func(c *config.Sim) { c.HangBeforeFirstToken = 1 })
	tr := startRouter(t, router.RoundRobin{}, withConfig(func(c *router.Config) { c.HeartbeatInterval = 50 * time.Millisecond }), simRecord(s))
	resp, br := tr.stream(t, `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"stream":true}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if ev := readEvent(t, br); ev != ": keep-alive\n\n" {
		t.Fatalf("first bytes %q, want a heartbeat", ev)
	}
	testkit.Eventually(t, "the engine to run the request", func() bool { return simGauge(t, s, "vllm:num_requests_running") == 1 })
	resp.Body.Close()
	testkit.Eventually(t, "the engine's running count to drop", func() bool { return simGauge(t, s, "vllm:num_requests_running") == 0 })
	testkit.Eventually(t, "the disconnect to be counted", func() bool { return metric(t, tr, "infera_router_client_disconnects_total") == 1 })
}

func TestAPIKeys(t *testing.T) {
	up := jsonUpstream(t)
	tr := startRouter(t, router.RoundRobin{}, withConfig(func(c *router.Config) { c.APIKeys = []string{"k1", "k2"} }), record(up, "m", discovery.StatusActive))
	body := `{"model":"m","messages":[]}`
	for _, auth := range []string{"", "Bearer nope", "Basic azE=", "Bearer k1x"} {
		resp, b := tr.do(t, http.MethodPost, "/v1/chat/completions", body, "Authorization", auth)
		wantError(t, resp, b, http.StatusUnauthorized, "invalid_api_key")
		if resp.Header.Get("WWW-Authenticate") == "" {
			t.Fatal("401 without WWW-Authenticate")
		}
	}
	resp, b := tr.do(t, http.MethodGet, "/v1/models", "")
	wantError(t, resp, b, http.StatusUnauthorized, "invalid_api_key")
	if resp, _ := tr.do(t, http.MethodGet, "/health", ""); resp.StatusCode != 200 {
		t.Fatal("/health needs no key")
	}
	resp, b = tr.do(t, http.MethodPost, "/v1/chat/completions", body, "Authorization", "Bearer k2")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d body %s with a good key", resp.StatusCode, b)
	}
	if seen := up.seen(); len(seen) != 1 || seen[0].Headers["Authorization"] != "" {
		t.Fatalf("the client's router key reached the worker: %+v", seen)
	}
	if got := metric(t, tr, `infera_router_rejected_total{reason="401"}`); got != 5 {
		t.Fatalf("rejected{401} = %v", got)
	}
}

// TestAdminAddressAndToken: with a separate admin address the admin
// endpoints are gone from the client address, and need the token there.
func TestAdminAddressAndToken(t *testing.T) {
	up := jsonUpstream(t)
	r, err := router.New(withConfig(func(c *router.Config) {
		c.AdminSeparate = true
		c.AdminToken = "adm"
		c.IdleConnTimeout = 50 * time.Millisecond
	}), router.RoundRobin{}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: []discovery.Record{record(up, "m", discovery.StatusActive)}})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	aln, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.ServeAll(ctx, ln, aln) }()
	tr := &http.Transport{}
	defer func() {
		tr.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	main := &testRouter{url: "http://" + ln.Addr().String(), client: &http.Client{Transport: tr}}
	admin := &testRouter{url: "http://" + aln.Addr().String(), client: &http.Client{Transport: tr}}
	for _, p := range []string{"/v1/workers", "/metrics", "/v1/admin/cache-view/x"} {
		resp, b := main.do(t, http.MethodGet, p, "", "Authorization", "Bearer adm")
		wantError(t, resp, b, http.StatusNotFound, "not_found")
		resp, b = admin.do(t, http.MethodGet, p, "")
		wantError(t, resp, b, http.StatusUnauthorized, "invalid_api_key")
	}
	if resp, b := admin.do(t, http.MethodGet, "/v1/workers", "", "Authorization", "Bearer adm"); resp.StatusCode != 200 || !strings.Contains(string(b), up.addr) {
		t.Fatalf("admin /v1/workers: %d %s", resp.StatusCode, b)
	}
	if resp, _ := admin.do(t, http.MethodGet, "/metrics", "", "Authorization", "Bearer adm"); resp.StatusCode != 200 {
		t.Fatal("admin /metrics with the token")
	}
	if resp, b := admin.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"m"}`); resp.StatusCode != 404 {
		t.Fatalf("inference on the admin address: %d %s", resp.StatusCode, b)
	}
	if resp, _ := main.chat(t, "m"); resp.StatusCode != 200 {
		t.Fatal("inference on the client address")
	}
}

func TestHeaderTooLarge(t *testing.T) {
	up := jsonUpstream(t)
	tr := startRouter(t, router.RoundRobin{}, withConfig(func(c *router.Config) { c.MaxHeaderBytes = 4096 }), record(up, "m", discovery.StatusActive))
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, tr.url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
	req.Header.Set("X-Big", strings.Repeat("x", 8192))
	resp, err := tr.client.Do(req)
	if err != nil {
		return // a closed connection is an acceptable answer
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("status %d, want 431", resp.StatusCode)
	}
	if resp, _ := tr.chat(t, "m"); resp.StatusCode != 200 {
		t.Fatal("the server stopped serving after a huge header")
	}
}

// TestProfiling: --enable-profiling serves pprof on the admin address only,
// behind the admin token; without it /debug/pprof/ is an unknown path.
func TestProfiling(t *testing.T) {
	for _, tc := range []struct {
		name    string
		enabled bool
		token   string
	}{{"on with token", true, "adm"}, {"on without token", true, ""}, {"off", false, "adm"}, {"off without token", false, ""}} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := router.New(withConfig(func(c *router.Config) {
				c.AdminSeparate = true
				c.AdminToken = tc.token
				c.EnableProfiling = tc.enabled
			}), router.RoundRobin{}, testLog(t))
			if err != nil {
				t.Fatal(err)
			}
			ln, _ := net.Listen("tcp", "127.0.0.1:0")
			aln, _ := net.Listen("tcp", "127.0.0.1:0")
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.ServeAll(ctx, ln, aln) }()
			tr := &http.Transport{}
			defer func() {
				tr.CloseIdleConnections()
				cancel()
				if err := <-done; err != nil {
					t.Error(err)
				}
			}()
			main := &testRouter{url: "http://" + ln.Addr().String(), client: &http.Client{Transport: tr}}
			admin := &testRouter{url: "http://" + aln.Addr().String(), client: &http.Client{Transport: tr}}
			auth := []string{}
			if tc.token != "" {
				auth = []string{"Authorization", "Bearer " + tc.token}
			}
			for _, p := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/heap?debug=1", "/debug/pprof/cmdline"} {
				resp, b := main.do(t, http.MethodGet, p, "", auth...)
				wantError(t, resp, b, http.StatusNotFound, "not_found")
				resp, b = admin.do(t, http.MethodGet, p, "", auth...)
				if !tc.enabled {
					wantError(t, resp, b, http.StatusNotFound, "not_found")
					continue
				}
				if resp.StatusCode != 200 || len(b) == 0 {
					t.Fatalf("admin %s: %d %.200s", p, resp.StatusCode, b)
				}
				if p == "/debug/pprof/goroutine?debug=1" && !strings.Contains(string(b), "goroutine profile:") {
					t.Fatalf("admin %s is not a goroutine profile: %.200s", p, b)
				}
				if tc.token != "" {
					resp, b = admin.do(t, http.MethodGet, p, "")
					wantError(t, resp, b, http.StatusUnauthorized, "invalid_api_key")
					resp, b = admin.do(t, http.MethodGet, p, "", "Authorization", "Bearer wrong")
					wantError(t, resp, b, http.StatusUnauthorized, "invalid_api_key")
				}
			}
		})
	}
}

// TestBreakerFollowsConfigClock: the breakers read Config.Now where one is
// given, not the request's own clock reads (relay.now): an hour's cooldown
// ends when that clock says so, at once in real time.
func TestBreakerFollowsConfigClock(t *testing.T) {
	var offset atomic.Int64 // how far the test's clock is ahead of real time
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	bad := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.Error(`{"error":"boom"}`, 500) })
	good := jsonUpstream(t)
	tr := startRouter(t, prefer{bad.addr}, withConfig(func(c *router.Config) {
		c.BreakerThreshold, c.BreakerCooldown, c.BreakerMaxCool, c.Now = 1, time.Hour, time.Hour, clock
	}), record(bad, "m", discovery.StatusActive), record(good, "m", discovery.StatusActive))
	for range 3 {
		if resp, body := tr.chat(t, "m"); resp.StatusCode != 200 {
			t.Fatalf("status %d body %s", resp.StatusCode, body)
		}
	}
	if n := len(bad.seen()); n != 1 {
		t.Fatalf("the failing worker got %d requests, want 1 (then its breaker is open)", n)
	}
	offset.Store(int64(2 * time.Hour))
	if resp, body := tr.chat(t, "m"); resp.StatusCode != 200 {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	if n := len(bad.seen()); n != 2 {
		t.Fatalf("the failing worker got %d requests, want 2: its cooldown is over by Config.Now, so it gets a probe", n)
	}
}
