package router_test

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/router"
)

const int64Max = "9223372036854775807"

// TestMaxTokensCeiling: an absurd max_tokens (or max_completion_tokens) is
// refused with 400 before any engine sees it; one at the ceiling passes.
func TestMaxTokensCeiling(t *testing.T) {
	s := startSim(t, nil)
	tr := startRouter(t, router.RoundRobin{}, withConfig(func(c *router.Config) { c.MaxTokensCeiling = 4096 }), simRecord(s))
	defer http.DefaultClient.CloseIdleConnections()
	for _, field := range []string{"max_tokens", "max_completion_tokens"} {
		for _, v := range []string{int64Max, "4097"} {
			resp, body := tr.do(t, "POST", "/v1/chat/completions",
				`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"`+field+`":`+v+`}`)
			wantError(t, resp, body, http.StatusBadRequest, "max_tokens_too_large")
		}
	}
	resp, body := tr.do(t, "POST", "/v1/messages",
		`{"model":"sim-model","max_tokens":`+int64Max+`,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("anthropic route: status %d %s, want 400", resp.StatusCode, body)
	}
	if got := simGauge(t, s, "vllm:request_success_total"); got != 0 {
		t.Fatalf("the engine finished %v requests: a refused one reached it", got)
	}
	resp, body = tr.do(t, "POST", "/v1/chat/completions",
		`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":`+strconv.Itoa(8)+`}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a request under the ceiling: %d %s", resp.StatusCode, body)
	}
}

// TestSimHugeMaxTokens: sent straight to the simulator, max_tokens = int64
// max is a 400 (the context check does not overflow), not a generation.
func TestSimHugeMaxTokens(t *testing.T) {
	s := startSim(t, nil)
	defer http.DefaultClient.CloseIdleConnections()
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":` + int64Max + `}`},
		{"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":` + int64Max + `,"stream":true}`},
		{"/v1/completions", `{"model":"sim-model","prompt":"hi","max_tokens":` + int64Max + `}`},
	} {
		body := c.body
		res, err := http.Post("http://"+s.addr+c.path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: status %d, want 400", body, res.StatusCode)
		}
	}
}

// TestBareLFRequestLine: a request whose lines end with a bare LF is
// answered 400 at once (fasthttp alone waits for a CRLF until the read
// timeout), in the OpenAI envelope; a CRLF request on the same router works.
func TestBareLFRequestLine(t *testing.T) {
	s := startSim(t, nil)
	tr := startRouter(t, router.RoundRobin{}, withConfig(func(c *router.Config) { c.ClientReadTimeout = time.Minute }), simRecord(s))
	addr := strings.TrimPrefix(tr.url, "http://")
	body := `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	for _, c := range []struct {
		req  string
		want string
	}{
		{"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: " + strconv.Itoa(len(body)) + "\n\n" + body, "HTTP/1.1 400"},
		{"GET /health HTTP/1.1\nHost: x\n\n", "HTTP/1.1 400"},
		{"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body, "HTTP/1.1 200"},
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		// Sent in two writes: the line end straddles reads.
		half := strings.Index(c.req, "HTTP/1.1") + 8
		if _, err := conn.Write([]byte(c.req[:half])); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if _, err := conn.Write([]byte(c.req[half:])); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		start := time.Now()
		got, err := io.ReadAll(conn)
		conn.Close()
		if err != nil {
			t.Fatalf("%q: no answer within 10s (%v) after %v; got %q", c.req, err, time.Since(start), got)
		}
		if !strings.HasPrefix(string(got), c.want) {
			t.Fatalf("%q: answer %q, want %s", c.req, got, c.want)
		}
		if c.want == "HTTP/1.1 400" && !strings.Contains(string(got), `"error":{`) {
			t.Fatalf("%q: the 400 is not an OpenAI envelope: %q", c.req, got)
		}
	}
}

// TestUnaryClientGoneFreesEngine: a unary client that leaves after 1 s of an
// ~8 s generation frees the engine's slot within 2 s (the router closes the
// upstream connection, the engine aborts), counted as a disconnect.
func TestUnaryClientGoneFreesEngine(t *testing.T) {
	s := startSim(t, nil)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), simRecord(s))
	addr := strings.TrimPrefix(tr.url, "http://")
	body := `{"model":"sim-model","messages":[{"role":"user","content":"a long story"}],"max_tokens":1600}`
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if got := simGauge(t, s, "vllm:num_requests_running"); got != 1 {
		t.Fatalf("running = %v after 1s of the generation, want 1", got)
	}
	conn.Close()
	left := time.Now()
	for simGauge(t, s, "vllm:num_requests_running") != 0 {
		if time.Since(left) > 2*time.Second {
			t.Fatalf("the engine still runs the request 2s after its unary client left")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := simGauge(t, s, "vllm:generation_tokens_total"); got >= 1600 {
		t.Fatalf("the engine generated all %v tokens for a client that left", got)
	}
	testkit.Eventually(t, "the disconnect to be counted", func() bool {
		return metric(t, tr, "infera_router_client_disconnects_total") == 1
	})
	if got := metric(t, tr, `infera_router_upstream_failures_total{reason="upstream_error"}`); got != 0 {
		t.Fatalf("the closed upstream counted as %v worker failures", got)
	}
}

// TestUnaryClientGoneAtOnceFreesEngine: a unary client that leaves right
// after its request, before the client watch starts (clientWatchDelay),
// still frees the engine: the watch starts late, finds the connection
// closed and closes the upstream request.
func TestUnaryClientGoneAtOnceFreesEngine(t *testing.T) {
	s := startSim(t, nil)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), simRecord(s))
	addr := strings.TrimPrefix(tr.url, "http://")
	body := `{"model":"sim-model","messages":[{"role":"user","content":"a long story"}],"max_tokens":1600}`
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	testkit.Eventually(t, "the disconnect to be counted", func() bool {
		return metric(t, tr, "infera_router_client_disconnects_total") == 1
	})
	testkit.Eventually(t, "the engine to drop the request", func() bool {
		return simGauge(t, s, "vllm:num_requests_running") == 0
	})
	if got := simGauge(t, s, "vllm:generation_tokens_total"); got >= 1600 {
		t.Fatalf("the engine generated all %v tokens for a client that left", got)
	}
}

// TestUnaryTTFTTimeoutNotRunTwice: a unary request slower than
// --ttft-timeout fails over, but its first attempt is closed (and so aborted
// by the engine) before the next worker starts it: the two engines never
// generate it at the same time, and neither finishes it.
func TestUnaryTTFTTimeoutNotRunTwice(t *testing.T) {
	a, b := startSim(t, nil), startSim(t, nil)
	tr := startRouter(t, router.RoundRobin{}, withConfig(func(c *router.Config) {
		c.TTFTTimeout = time.Second
		c.MaxRetries = 1
	}), simRecord(a), simRecord(b))
	defer http.DefaultClient.CloseIdleConnections()
	done := make(chan int, 1)
	go func() {
		resp, err := http.Post(tr.url+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"sim-model","messages":[{"role":"user","content":"slow"}],"max_tokens":800}`))
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	var both time.Duration
	var status int
	last := time.Now()
	for status == 0 {
		select {
		case status = <-done:
		case <-time.After(10 * time.Millisecond):
		}
		now := time.Now()
		if simGauge(t, a, "vllm:num_requests_running") > 0 && simGauge(t, b, "vllm:num_requests_running") > 0 {
			both += now.Sub(last)
		}
		last = now
	}
	if status != http.StatusGatewayTimeout {
		t.Fatalf("status %d, want 504 after two first-byte timeouts", status)
	}
	if both > 200*time.Millisecond {
		t.Fatalf("both engines ran the request at once for %v", both)
	}
	testkit.Eventually(t, "both engines idle", func() bool {
		return simGauge(t, a, "vllm:num_requests_running") == 0 && simGauge(t, b, "vllm:num_requests_running") == 0
	})
	time.Sleep(time.Second)
	if got := simGauge(t, a, "vllm:generation_tokens_total") + simGauge(t, b, "vllm:generation_tokens_total"); got >= 800 {
		t.Fatalf("the engines generated %v tokens of a request they were told to drop", got)
	}
}
