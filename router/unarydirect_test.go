package router_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/router"
)

// unaryEngine answers every chat completion with the status and the
// content size its User-Agent asks for ("status=404 size=5000"; the
// User-Agent is one of the headers the router forwards): a completion
// whose content is that many bytes, or an error.
func unaryEngine(t *testing.T) discovery.Record {
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		status, size := 200, 16
		for _, f := range strings.Fields(string(ctx.UserAgent())) {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.Atoi(v)
			switch k {
			case "status":
				status = n
			case "size":
				size = n
			}
		}
		ctx.SetStatusCode(status)
		ctx.SetContentType("application/json")
		if status != 200 {
			ctx.SetBodyString(`{"error":{"message":"no","type":"invalid_request_error","code":"x"}}`)
			return
		}
		ctx.SetBodyString(`{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` +
			strings.Repeat("a", size) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	})
	return record(up, "m", discovery.StatusActive)
}

// unaryReq is one request of a TestUnaryAsFasthttp case.
type unaryReq struct {
	method, path, proto, agent, extra, body string
}

func (r unaryReq) bytes() string {
	method, path, proto, body := r.method, r.path, r.proto, r.body
	if method == "" {
		method = "POST"
	}
	if path == "" {
		path = "/v1/chat/completions"
	}
	if proto == "" {
		proto = "HTTP/1.1"
	}
	if body == "" && method == "POST" {
		body = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	}
	return method + " " + path + " " + proto + "\r\nHost: x\r\nContent-Type: application/json\r\nanthropic-version: 2023-06-01\r\n" +
		"User-Agent: " + r.agent + "\r\n" + r.extra + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// unaryVarying are the headers that differ from one answer to the next.
var unaryVarying = regexp.MustCompile(`\r\n(Date|X-Request-Id|X-Infera-Request-Id): [^\r]*`)

// unaryExchange sends reqs on a new connection in one write (pipelined
// when several) and returns the answers' bytes, their varying headers
// blanked, and "<EOF>" when the router closed the connection after them.
func unaryExchange(t *testing.T, addr string, reqs []unaryReq) string {
	t.Helper()
	c := dialClient(t, addr)
	defer c.Close()
	var all strings.Builder
	for _, r := range reqs {
		all.WriteString(r.bytes())
	}
	if _, err := io.WriteString(c, all.String()); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	br := bufio.NewReader(io.TeeReader(c, &got))
	for i, r := range reqs {
		resp, err := http.ReadResponse(br, &http.Request{Method: r.method})
		if err != nil {
			t.Fatalf("answer %d: %v (got %q)", i, err, got.String())
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("answer %d's body: %v", i, err)
		}
		if resp.Close {
			break
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := br.ReadByte(); errors.Is(err, io.EOF) {
		got.WriteString("<EOF>")
	}
	return unaryVarying.ReplaceAllString(got.String(), "\r\n$1: -")
}

// TestUnaryAsFasthttp: a unary answer whose body the front door's
// connection writes after fasthttp's head (frontheld.go) reaches the client
// as fasthttp's writer sent it, byte for byte, on both front doors: bodies
// of many sizes (beyond the held write's limit and the direct answer's),
// errors of the engine and of the router, HTTP/1.0 clients, Connection:
// close, HEAD, Anthropic's translation, pipelined requests.
func TestUnaryAsFasthttp(t *testing.T) {
	one := func(agent string) []unaryReq { return []unaryReq{{agent: agent}} }
	cases := []struct {
		name string
		reqs []unaryReq
	}{
		{"1 B", one("size=1")},
		{"600 B", one("size=600")},
		{"4 KiB", one("size=3900")},
		{"5 KB", one("size=5000")},
		{"20 KB", one("size=20000")},
		{"above the held limit", one("size=65300")},
		{"above the direct limit", one("size=70000")},
		{"200 KB", one("size=200000")},
		{"engine 404", one("status=404")},
		{"engine 500", one("status=500")},
		{"unknown model", []unaryReq{{body: `{"model":"nope","messages":[]}`}}},
		{"HEAD", []unaryReq{{method: "HEAD"}}},
		{"HTTP/1.0", []unaryReq{{proto: "HTTP/1.0", agent: "size=700"}}},
		{"HTTP/1.0 keep-alive", []unaryReq{{proto: "HTTP/1.0", agent: "size=700", extra: "Connection: keep-alive\r\n"}, {agent: "size=10"}}},
		{"Connection: close", []unaryReq{{agent: "size=700", extra: "Connection: close\r\n"}}},
		{"anthropic", []unaryReq{{path: "/v1/messages", agent: "size=900",
			body: `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hello"}]}`}}},
		{"pipelined", []unaryReq{{agent: "size=100"}, {agent: "size=5000"}, {agent: "size=100"}}},
		{"pipelined with errors", []unaryReq{{agent: "size=100"}, {body: `{"model":"nope","messages":[]}`}, {agent: "size=300"}, {agent: "status=404"}, {agent: "size=50"}}},
		{"pipelined large", []unaryReq{{agent: "size=3000"}, {agent: "size=60000"}, {agent: "size=2000"}, {agent: "size=4000"}}},
		{"pipelined, the last closing", []unaryReq{{agent: "size=100"}, {agent: "size=200", extra: "Connection: close\r\n"}}},
	}
	engine := unaryEngine(t)
	var got [2][]string // [fasthttp's writer, the connection's][case]
	for i, direct := range []bool{false, true} {
		t.Run(map[bool]string{false: "fasthttp", true: "direct"}[direct], func(t *testing.T) {
			was := router.SetUnaryDirect(direct)
			t.Cleanup(func() { router.SetUnaryDirect(was) }) // after the routers are stopped
			fd := startFrontDoorsOver(t, router.DefaultConfig(), engine)
			for _, tc := range cases {
				got[i] = append(got[i], unaryExchange(t, fd.goroutine, tc.reqs), unaryExchange(t, fd.loop, tc.reqs))
			}
		})
	}
	if len(got[0]) != 2*len(cases) || len(got[1]) != 2*len(cases) {
		t.Fatal("not every case ran")
	}
	for k, tc := range cases {
		for door, name := range []string{"goroutine", "loop"} {
			before, after := got[0][2*k+door], got[1][2*k+door]
			if before != after {
				t.Errorf("%s, %s door: differs from byte %d:\nfasthttp's writer %q\nthe connection's  %q", tc.name, name, firstDiff(before, after), clipped(before), clipped(after))
			}
		}
	}
}

// clipped is s shortened for a failure message.
func clipped(s string) string {
	if len(s) <= 2000 {
		return s
	}
	return s[:1000] + "…" + s[len(s)-1000:]
}
