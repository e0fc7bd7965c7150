package router_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/router"
)

// testLog writes through t.Log so that failures show the router's lines.
func testLog(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
}

// upstream is a fake worker: a real fasthttp server on a free port.
type upstream struct {
	addr string
	// kvEvents and kvReplay are a simulator's bound KV-event endpoints.
	kvEvents, kvReplay string

	mu       sync.Mutex
	requests []seenRequest
}

type seenRequest struct {
	Path    string
	Body    []byte
	Headers map[string]string
}

func (u *upstream) seen() []seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seenRequest(nil), u.requests...)
}

// startUpstream serves handler on 127.0.0.1:0 until the test ends, recording
// every request first.
func startUpstream(t testing.TB, handler fasthttp.RequestHandler) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{addr: ln.Addr().String()}
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			sr := seenRequest{Path: string(ctx.Path()), Body: append([]byte(nil), ctx.PostBody()...), Headers: map[string]string{}}
			for k, v := range ctx.Request.Header.All() {
				sr.Headers[string(k)] = string(v)
			}
			u.mu.Lock()
			u.requests = append(u.requests, sr)
			u.mu.Unlock()
			handler(ctx)
		},
		CloseOnShutdown: true,
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.ShutdownWithContext(ctx)
		<-done
	})
	return u
}

// jsonUpstream answers every request with a fixed JSON body naming itself.
func jsonUpstream(t *testing.T) *upstream {
	var u *upstream
	u = startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"cmpl-1","object":"chat.completion","worker":"` + u.addr + `"}`)
	})
	return u
}

func record(u *upstream, model string, status discovery.Status) discovery.Record {
	return discovery.Record{
		WorkerID: u.addr, URL: "http://" + u.addr, ModelName: model, Engine: "sim",
		DisaggMode: discovery.DisaggMixed, DPSize: 1, RequestTransport: "http", Status: status,
	}
}

// testRouter is a router serving on a free port.
type testRouter struct {
	*router.Router
	url    string
	client *http.Client
}

func startRouter(t testing.TB, policy router.Policy, cfg router.Config, workers ...discovery.Record) *testRouter {
	t.Helper()
	return startRouterLog(t, policy, cfg, testLog(t), workers...)
}

// startRouterLog is startRouter with the router's logger given.
func startRouterLog(t testing.TB, policy router.Policy, cfg router.Config, log zerolog.Logger, workers ...discovery.Record) *testRouter {
	t.Helper()
	// Short, so fasthttp's pool cleaners are gone before goleak looks.
	cfg.IdleConnTimeout = 50 * time.Millisecond
	r, err := router.New(cfg, policy, log)
	if err != nil {
		t.Fatal(err)
	}
	if workers != nil {
		r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: workers})
	}
	addr := servetest.Loopback(t, "router", testServe(r))
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections) // before the router stops: cleanups run last-in first-out
	return &testRouter{Router: r, url: "http://" + addr, client: &http.Client{Transport: tr}}
}

// do sends a request and returns the response with its body read.
func (tr *testRouter) do(t *testing.T, method, path, body string, headers ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, tr.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := tr.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func (tr *testRouter) chat(t *testing.T, model string) (*http.Response, []byte) {
	t.Helper()
	return tr.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`)
}

// stream opens a streaming request and returns the response and a reader of
// its body; the caller closes the body.
func (tr *testRouter) stream(t *testing.T, body string, headers ...string) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, tr.url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := tr.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp, bufio.NewReader(resp.Body)
}

type envelope struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// wantError checks an OpenAI error envelope response.
func wantError(t *testing.T, resp *http.Response, body []byte, status int, code string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d (body %s)", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content-type %q, want application/json", ct)
	}
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil || env.Error.Message == "" || env.Error.Type == "" {
		t.Fatalf("body %s is not an OpenAI error envelope (%v)", body, err)
	}
	if env.Error.Code == nil || *env.Error.Code != code {
		t.Fatalf("error code %v, want %q (body %s)", env.Error.Code, code, body)
	}
}

// readEvent reads one SSE event (up to its blank line) from r.
func readEvent(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	var ev bytes.Buffer
	for {
		line, err := r.ReadString('\n')
		ev.WriteString(line)
		if err != nil {
			t.Fatalf("reading event: %v (got %q)", err, ev.String())
		}
		if line == "\n" || line == "\r\n" {
			return ev.String()
		}
	}
}

// withConfig returns router.DefaultConfig changed by set.
func withConfig(set func(*router.Config)) router.Config {
	c := router.DefaultConfig()
	set(&c)
	return c
}

// kvConfig returns router.DefaultKVAwareConfig changed by set.
func kvConfig(set func(*router.KVAwareConfig)) router.KVAwareConfig {
	c := router.DefaultKVAwareConfig()
	set(&c)
	return c
}

// testServe is the serve function the tests' routers run: the goroutine
// front door, or the loop one with INFERA_FRONT_DOOR=loop (the front-door
// tests run unchanged against both).
func testServe(r *router.Router) func(context.Context, net.Listener) error {
	if os.Getenv("INFERA_FRONT_DOOR") == "loop" {
		return func(ctx context.Context, ln net.Listener) error { return r.ServeLoop(ctx, ln, nil) }
	}
	return r.Serve
}

// askHealth sends GET /health on c and reads its answer through br (a
// reader of c), failing the test unless it is 200.
func askHealth(t *testing.T, c net.Conn, br *bufio.Reader) {
	t.Helper()
	if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /health: %s", resp.Status)
	}
}
