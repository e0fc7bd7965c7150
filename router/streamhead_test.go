package router_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/router"
)

// headCase is one exchange of TestStreamHeadAsFasthttp: the requests a
// client sends in one write, and how the engine answers a stream.
type headCase struct {
	name string
	reqs []string
	// engine: how the engine answers a streamed request: "stream" (a
	// short stream), "400" (an error of its own), "500" (a failure:
	// the router answers 502), "cut" (its head, then the connection
	// drops before the first event); "unary 400" and "unary 500": the
	// same for a unary request (which otherwise gets a small completion),
	// "unary large": a completion over maxOwnUnaryBody.
	engine string
}

const (
	headStreamBody = `{"model":"m","stream":true}`
	headUnaryBody  = `{"model":"m","max_tokens":4}`
)

// headRequest is a POST of body to path; extra are header lines.
func headRequest(proto, path, body string, extra ...string) string {
	var b strings.Builder
	b.WriteString("POST " + path + " " + proto + "\r\nHost: x\r\nContent-Type: application/json\r\nanthropic-version: 2023-06-01\r\n")
	for _, h := range extra {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	return b.String()
}

// TestStreamHeadAsFasthttp: a stream's head, and a unary answer's, with
// the relay's lines written into fasthttp's (relayhead.go) is, byte for
// byte, the head fasthttp wrote with every header set on it, on both
// front doors:
// HTTP/1.1 kept alive or closed by the client, HTTP/1.0 with and without
// keep-alive, pipelined requests before and after a stream, a stream
// answered with an error before its first chunk, an id of the router's
// own, an Anthropic stream; the same for unary answers, with a worker's
// 400 passed through and a 500 retried into the router's 502.
func TestStreamHeadAsFasthttp(t *testing.T) {
	const id = "X-Request-Id: req-head-1"
	stream := headRequest("HTTP/1.1", "/v1/chat/completions", headStreamBody, id)
	unary := headRequest("HTTP/1.1", "/v1/chat/completions", headUnaryBody, id)
	unary10 := headRequest("HTTP/1.0", "/v1/chat/completions", headUnaryBody, id)
	anthropicUnary := headRequest("HTTP/1.1", "/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hello"}]}`, id)
	cases := []headCase{
		{name: "keep-alive", reqs: []string{stream}},
		{name: "client close", reqs: []string{headRequest("HTTP/1.1", "/v1/chat/completions", headStreamBody, id, "Connection: close")}},
		{name: "http/1.0 keep-alive", reqs: []string{headRequest("HTTP/1.0", "/v1/chat/completions", headStreamBody, id, "Connection: keep-alive")}},
		{name: "http/1.0", reqs: []string{headRequest("HTTP/1.0", "/v1/chat/completions", headStreamBody, id)}},
		{name: "pipelined", reqs: []string{
			headRequest("HTTP/1.1", "/v1/chat/completions", `{"model":"m"}`, "X-Request-Id: req-unary"),
			stream,
			"GET /nowhere HTTP/1.1\r\nHost: x\r\nX-Request-Id: req-404\r\n\r\n",
			headRequest("HTTP/1.1", "/v1/chat/completions", headStreamBody, "X-Infera-Request-Id: req-head-2"),
			headRequest("HTTP/1.1", "/v1/chat/completions", `{"model":"m"}`, "X-Request-Id: req-unary-2"),
		}},
		{name: "pipelined, closed", reqs: []string{
			"GET /nowhere HTTP/1.1\r\nHost: x\r\nX-Request-Id: req-404\r\n\r\n",
			headRequest("HTTP/1.1", "/v1/chat/completions", headStreamBody, id, "Connection: close"),
		}},
		{name: "engine error", reqs: []string{stream, stream}, engine: "400"},
		{name: "engine failure", reqs: []string{stream}, engine: "500"},
		{name: "cut before the first event", reqs: []string{stream}, engine: "cut"},
		{name: "router's id", reqs: []string{headRequest("HTTP/1.1", "/v1/chat/completions", headStreamBody)}},
		{name: "anthropic", reqs: []string{headRequest("HTTP/1.1", "/v1/messages",
			`{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hello"}]}`, id)}},
		{name: "wrong method", reqs: []string{"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: req-get\r\n\r\n", stream}},
		{name: "bad body", reqs: []string{headRequest("HTTP/1.1", "/v1/chat/completions", `{"model":`, id), stream}},
		{name: "unknown model", reqs: []string{headRequest("HTTP/1.1", "/v1/chat/completions", `{"model":"x","stream":true}`, id), stream}},
		// Unary answers, whose head lines the relay writes too.
		{name: "unary keep-alive", reqs: []string{unary, unary}},
		{name: "unary client close", reqs: []string{headRequest("HTTP/1.1", "/v1/chat/completions", headUnaryBody, id, "Connection: close")}},
		{name: "unary http/1.0 keep-alive", reqs: []string{headRequest("HTTP/1.0", "/v1/chat/completions", headUnaryBody, id, "Connection: keep-alive"), unary10}},
		{name: "unary http/1.0", reqs: []string{unary10}},
		{name: "unary pipelined", reqs: []string{unary, headRequest("HTTP/1.1", "/v1/completions", headUnaryBody), unary, stream, unary,
			"GET /nowhere HTTP/1.1\r\nHost: x\r\nX-Request-Id: req-404\r\n\r\n", unary}},
		{name: "unary pipelined before a stream", reqs: []string{unary, stream}},
		{name: "unary pipelined, closed", reqs: []string{unary, headRequest("HTTP/1.1", "/v1/chat/completions", headUnaryBody, id, "Connection: close")}},
		{name: "unary engine error", reqs: []string{unary, unary}, engine: "unary 400"},
		{name: "unary engine failure", reqs: []string{unary, unary}, engine: "unary 500"},
		{name: "unary larger than the relay writes", reqs: []string{unary, unary}, engine: "unary large"},
		{name: "unary router's id", reqs: []string{headRequest("HTTP/1.1", "/v1/chat/completions", headUnaryBody)}},
		{name: "unary anthropic", reqs: []string{anthropicUnary, anthropicUnary}},
		{name: "unary after wrong method", reqs: []string{"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: req-get\r\n\r\n", unary}},
		{name: "unary after bad body", reqs: []string{headRequest("HTTP/1.1", "/v1/chat/completions", `{"model":`, id), unary}},
		{name: "unary after unknown model", reqs: []string{headRequest("HTTP/1.1", "/v1/chat/completions", `{"model":"x"}`, id), unary}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got [2][2]string // [fasthttp's head, the relay's][goroutine door, loop door]
			engine := headEngine(t, tc.engine)
			for i, direct := range []bool{false, true} {
				t.Run(map[bool]string{false: "fasthttp", true: "relay"}[direct], func(t *testing.T) {
					was, wasUnary := router.SetStreamHeadDirect(direct), router.SetUnaryHeadDirect(direct)
					t.Cleanup(func() { router.SetStreamHeadDirect(was); router.SetUnaryHeadDirect(wasUnary) }) // after the routers are stopped
					cfg := router.DefaultConfig()
					cfg.MaxRetries = 0
					fd := startFrontDoorsOver(t, cfg, engine)
					got[i][0] = headExchange(t, fd.goroutine, tc)
					got[i][1] = headExchange(t, fd.loop, tc)
				})
			}
			for door, name := range []string{"goroutine", "loop"} {
				before, after := got[0][door], got[1][door]
				if before == "" {
					t.Fatalf("%s door: no answer", name)
				}
				if before != after {
					t.Errorf("%s door: differs from byte %d:\nfasthttp's head %q\nthe relay's     %q", name, firstDiff(before, after), before, after)
				}
			}
		})
	}
}

// headEngine is an engine answering a streamed request as mode says
// (headCase.engine) and any other with a small chat completion, on as
// many connections as the router opens.
func headEngine(t *testing.T, mode string) discovery.Record {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	const unary = `{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`
	serve := func(c net.Conn) {
		defer wg.Done()
		defer c.Close()
		serveRequests(c, func(stream bool) bool {
			if !stream {
				switch mode {
				case "unary 400":
					const e = `{"error":{"message":"bad","type":"invalid_request_error"}}`
					_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(e))+"\r\n\r\n"+e)
					return true
				case "unary large":
					large := `{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("x", 20<<10) + `"},"finish_reason":"stop"}]}`
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(large))+"\r\n\r\n"+large)
					return true
				case "unary 500":
					_, _ = io.WriteString(c, "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\noops")
					return true
				}
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(unary))+"\r\n\r\n"+unary)
				return true
			}
			switch mode {
			case "400":
				const e = `{"error":{"message":"bad","type":"invalid_request_error"}}`
				_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(e))+"\r\n\r\n"+e)
			case "500":
				_, _ = io.WriteString(c, "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\noops")
			case "cut":
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
				return false
			default:
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+oneChunkStream(shortStream))
			}
			return true
		})
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go serve(c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return record(&upstream{addr: ln.Addr().String()}, "m", discovery.StatusActive)
}

// headVarying: the Date, and an id the router made up.
var headVarying = regexp.MustCompile(`\r\n(?:(Date): [^\r]*|(X-Request-Id|X-Infera-Request-Id): [0-9a-f]{16}-[0-9a-f]{16})`)

// headExchange sends tc's requests in one write on a new connection and
// returns all that came back for them (Date and the router's own ids
// blanked): every answer read whole, then, where the connection is to
// close, up to its end.
func headExchange(t *testing.T, addr string, tc headCase) string {
	t.Helper()
	c := dialClient(t, addr)
	defer c.Close()
	if _, err := io.WriteString(c, strings.Join(tc.reqs, "")); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	br := bufio.NewReader(io.TeeReader(c, &got))
	closes := false
	for _, raw := range tc.reqs {
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			t.Fatalf("reading an answer: %v (got %q)", err, got.String())
		}
		_, err = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("reading an answer's body: %v (got %q)", err, got.String())
		}
		if resp.Close {
			closes = true
			break
		}
	}
	if closes {
		_, _ = io.Copy(io.Discard, br)
	}
	return headVarying.ReplaceAllString(got.String(), "\r\n$1$2: -")
}

// serveRequests reads requests from c, an engine's connection, and has
// answer write each one's answer (stream: its body asks for a stream),
// until the connection ends or answer returns false.
func serveRequests(c net.Conn, answer func(stream bool) bool) {
	br := bufio.NewReader(c)
	for {
		var req fasthttp.Request
		if err := req.Read(br); err != nil {
			return
		}
		if !answer(bytes.Contains(req.Body(), []byte(`"stream":true`))) {
			return
		}
	}
}
