package router

import (
	"bufio"
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/openai"
)

// TestOwnRequestBytes: a request that writes itself (ownRequest), a
// stream's or the same request unary, puts on the wire the bytes
// fasthttp's Request.Write puts there for upstreamRequest's request, as
// Exchange.Do completes it (its User-Agent), whatever the client sent, the
// engine, the route, the keys and the DP rank.
func TestOwnRequestBytes(t *testing.T) {
	const chat = `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`
	cases := []struct {
		name, engine, body, headers string
		route                       Route
		keys                        bool
		pin                         bool
	}{
		{name: "vllm chat, bare client", engine: "vllm", body: chat, route: RouteChatCompletions},
		{name: "vllm chat, every forwarded header", engine: "vllm", body: chat, route: RouteChatCompletions,
			headers: "User-Agent: OpenAI/Python 1.0\r\nAccept: text/event-stream\r\nAuthorization: Bearer k\r\nOpenai-Organization: o\r\nOpenai-Project: p\r\nX-Request-Id: client-id-1\r\nContent-Type: application/json; charset=utf-8\r\n"},
		{name: "the client's trace context, tracing off", engine: "vllm", body: chat, route: RouteChatCompletions,
			headers: "Traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nTracestate: a=b\r\n", pin: true},
		{name: "keys: Authorization stays", engine: "vllm", body: chat, route: RouteChatCompletions, keys: true,
			headers: "Authorization: Bearer k\r\nAccept: */*\r\n"},
		{name: "spaces before members", engine: "vllm", body: " {  \"model\":\"m\",\"prompt\":\"p\",\"stream\":true}", route: RouteCompletions},
		{name: "client asked for ids", engine: "vllm", body: `{"return_token_ids":true,"model":"m","prompt":"p","stream":true}`, route: RouteCompletions},
		{name: "sglang chat: no ids", engine: "sglang", body: chat, route: RouteChatCompletions},
		{name: "other engine, pinned rank", engine: "sim", body: chat, route: RouteChatCompletions, pin: true},
		{name: "vllm, the client's kv_transfer_params: hints inside", engine: "vllm", route: RouteCompletions,
			body: `{"model":"m","prompt":"p","kv_transfer_params":{"a":1},"stream":true} ` + "\n"},
		{name: "vllm, the client's retention: legacy hint only", engine: "vllm", route: RouteCompletions,
			body: `{"model":"m","prompt":"p","kv_transfer_params":{"infera_retention":"none"},"stream":true}`},
		{name: "vllm, every hint the client's", engine: "vllm", route: RouteCompletions,
			body: `{"model":"m","prompt":"p","kv_transfer_params":{"infera_retention":"none"},"_infera_retention":"none","stream":true}`},
		{name: "sglang completions, the client's priority", engine: "sglang", route: RouteCompletions,
			body: `{"model":"m","prompt":"p","priority":1,"stream":true }`},
	}
	for _, c := range cases {
		for _, mode := range []struct{ name, stream string }{{"stream", `"stream":true`}, {"unary", `"stream":false`}} {
			body := strings.Replace(c.body, `"stream":true`, mode.stream, 1)
			t.Run(mode.name+"/"+c.name, func(t *testing.T) {
				rel, a := ownRequestRelay(t, c.engine, c.route, body, c.headers, c.keys)
				a.ticket.PinRank, a.ticket.DPRank = c.pin, 3
				req := rel.upstreamRequest(a)
				defer fasthttp.ReleaseRequest(req)
				want := fasthttpRequestBytes(t, req)
				strip := rel.mig.track.Strip
				rel.mig.track.Strip = false
				if got := ownRequestBytes(t, rel.ownRequest(a)); got != want {
					t.Errorf("request\n%q\nwant fasthttp's\n%q", got, want)
				}
				if rel.mig.track.Strip != strip {
					t.Errorf("ids stripped from the client's stream: %v, want %v", rel.mig.track.Strip, strip)
				}
			})
		}
	}
}

// fasthttpRequestBytes is what Exchange.Do puts on the wire for req (its
// User-Agent set when the client sent none).
func fasthttpRequestBytes(t *testing.T, req *fasthttp.Request) string {
	t.Helper()
	if len(req.Header.UserAgent()) == 0 {
		req.Header.SetUserAgent(upstreamUserAgent) // as Exchange.Do sets it
	}
	var b bytes.Buffer
	bw := bufio.NewWriter(&b)
	if err := req.Write(bw); err != nil {
		t.Fatal(err)
	}
	_ = bw.Flush()
	return b.String()
}

// ownRequestBytes is what s writes, through a writer smaller than the
// request (written in pieces). It fails t unless s appends the same bytes
// (AppendRequest, after bytes already held), within its MaxRequestLen.
func ownRequestBytes(t *testing.T, s *ownRequest) string {
	t.Helper()
	var b bytes.Buffer
	bw := bufio.NewWriterSize(&b, 64)
	if err := s.WriteRequest(bw); err != nil {
		t.Fatal(err)
	}
	_ = bw.Flush()
	const before = "held before "
	appended := s.AppendRequest([]byte(before))
	if string(appended) != before+b.String() {
		t.Errorf("appended request:\n%q\nwritten:\n%q", appended[len(before):], b.String())
	}
	if n, most := len(appended)-len(before), s.MaxRequestLen(); n > most {
		t.Errorf("appended %d bytes, over MaxRequestLen %d", n, most)
	}
	return b.String()
}

// ownRequestRelay is a relay of a request (its route, body and client
// headers) whose attempt has begun on a worker of engine, and whose
// request writes itself.
func ownRequestRelay(t *testing.T, engine string, route Route, body, headers string, keys bool) (*relay, *attempt) {
	t.Helper()
	lw := startLegWorker(t, 200, nil)
	rec := lw.record()
	rec.Engine = engine
	r, err := New(withConfig(func(cfg *Config) {
		if keys {
			cfg.APIKeys = []string{"k"}
		}
	}), RoundRobin{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.shutdownPools)
	r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: []discovery.Record{rec}})
	ctx := &fasthttp.RequestCtx{}
	raw := "POST " + route.Path() + " HTTP/1.1\r\nHost: router\r\n" + headers + "Content-Length: " + itoa(len(body)) + "\r\n\r\n" + body
	if err := ctx.Request.Read(bufio.NewReader(bytes.NewBufferString(raw))); err != nil {
		t.Fatal(err)
	}
	rel := acquireRelay(r, route)
	rel.ctx, rel.body = ctx, ctx.PostBody()
	rel.id = r.setRequestID(ctx, rel.id[:0])
	if err := openai.Scan(rel.body, &rel.scan); err != nil {
		t.Fatal(err)
	}
	rel.model = r.view.Load().models["m"]
	rel.startMigration()
	t.Cleanup(func() { r.finish(rel, outcomeOK, 200) })
	a := &rel.att
	if err := rel.begin(a, false); err != nil {
		t.Fatal(err)
	}
	if !rel.writesRequest(a) {
		t.Fatal("the request does not write itself")
	}
	return rel, a
}

// TestOwnRequestWriteAllocs: a request, a stream's or a unary one's,
// writes itself into its connection's writer without allocating.
func TestOwnRequestWriteAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are checked without the race detector")
	}
	for _, stream := range []string{"true", "false"} {
		rel, a := ownRequestRelay(t, "vllm", RouteChatCompletions,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":`+stream+`}`,
			"User-Agent: OpenAI/Python 1.0\r\nAccept: text/event-stream\r\nAuthorization: Bearer k\r\n", false)
		bw := bufio.NewWriterSize(io.Discard, 4096)
		if n := testing.AllocsPerRun(100, func() {
			if err := rel.ownRequest(a).WriteRequest(bw); err != nil {
				t.Fatal(err)
			}
			_ = bw.Flush()
		}); n != 0 {
			t.Errorf("stream %s: %v allocations a request, want 0", stream, n)
		}
		held := make([]byte, 0, 4096)
		if n := testing.AllocsPerRun(100, func() {
			held = rel.ownRequest(a).AppendRequest(held[:0])
		}); n != 0 {
			t.Errorf("stream %s: %v allocations a request appended, want 0", stream, n)
		}
	}
}
