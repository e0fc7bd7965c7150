package sim

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/config"
)

const benchChat = `{"model":"sim-model","max_tokens":16,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Explain prefix caching in one paragraph."}]}`

// BenchmarkUnaryZeroLatency measures the zero-latency sim over real HTTP
// (keep-alive connections, parallel clients): the baseline the router's
// overhead is measured against.
func BenchmarkUnaryZeroLatency(b *testing.B) {
	benchHTTP(b, `/v1/chat/completions`, benchChat)
}

// BenchmarkStreamZeroLatency is the same for a 16-token SSE stream.
func BenchmarkStreamZeroLatency(b *testing.B) {
	benchHTTP(b, `/v1/chat/completions`, `{"model":"sim-model","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"Explain prefix caching in one paragraph."}]}`)
}

func benchHTTP(b *testing.B, path, body string) {
	ts := startSim(b, nil)
	// A short idle time lets the client's connection cleaner goroutine
	// exit soon after the benchmark (goleak checks for it).
	hc := &fasthttp.HostClient{Addr: ts.srv.Addr(), MaxConns: 512, MaxIdleConnDuration: 50 * time.Millisecond,
		// A plain dialer: fasthttp's default one starts a process-wide
		// DNS-cache goroutine that never ends.
		Dial: func(addr string) (net.Conn, error) { return net.Dial("tcp", addr) }}
	defer hc.CloseIdleConnections()
	url := ts.url + path
	b.ReportAllocs()
	b.SetParallelism(16) // many requests in flight, as behind a router
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI(url)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.Header.SetContentType("application/json")
		req.SetBodyString(body)
		for pb.Next() {
			if err := hc.Do(req, resp); err != nil {
				b.Error(err)
				return
			}
			if resp.StatusCode() != fasthttp.StatusOK {
				b.Errorf("status %d: %s", resp.StatusCode(), resp.Body())
				return
			}
		}
	})
}

// handlerSim runs a zero-latency server's engine without HTTP, so the
// handler can be driven directly.
func handlerSim(tb testing.TB, edits ...func(*config.Sim)) *Server {
	cfg := config.DefaultSim()
	cfg.TimeScale = 0
	for _, e := range edits {
		e(&cfg)
	}
	s, err := New(cfg, zerolog.Nop())
	if err != nil {
		tb.Fatal(err)
	}
	s.readyAt.Store(1)
	if cfg.ModelTTFTLog != "" { // Serve's work, which is not called
		if s.ttftLog, err = openModelTTFTLog(cfg.ModelTTFTLog, cfg.TimeScale); err != nil {
			tb.Fatal(err)
		}
		s.sched.ttftLog = s.ttftLog
		s.ttftLog.start()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.sched.run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		<-done
		if err := s.ttftLog.close(); err != nil {
			tb.Error(err)
		}
	})
	return s
}

func newCtx(body string) *fasthttp.RequestCtx {
	var req fasthttp.Request
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI("/v1/chat/completions")
	req.SetBodyString(body)
	ctx := &fasthttp.RequestCtx{}
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, nil)
	return ctx
}

// BenchmarkHandleUnary is the sim's own cost per unary request: parse,
// render, tokenize, hash, generate, one scheduler round trip, response.
func BenchmarkHandleUnary(b *testing.B) {
	s := handlerSim(b)
	ctx := newCtx(benchChat)
	b.ReportAllocs()
	for b.Loop() {
		ctx.Response.Reset()
		s.handle(ctx)
		if ctx.Response.StatusCode() != fasthttp.StatusOK {
			b.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
}

func TestHandleUnaryAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race")
	}
	s := handlerSim(t)
	ctx := newCtx(benchChat)
	allocs := testing.AllocsPerRun(200, func() {
		ctx.Response.Reset()
		s.handle(ctx)
	})
	if ctx.Response.StatusCode() != fasthttp.StatusOK {
		t.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if allocs > 0 {
		t.Errorf("unary zero-latency handler allocates %v times per request", allocs)
	}
}

// kvChurn configures a zero-latency sim publishing KV events whose cache is
// small enough that rotating through kvChurnBodies stores and evicts blocks
// on every request.
func kvChurn(c *config.Sim) {
	c.KVEventsEndpoint = "tcp://127.0.0.1:0" // never bound: Serve is not called
	c.KVEventsBuffer = 4
	c.MaxModelLen = 1024
	c.KVBlocks = 64
}

func kvChurnBodies() []*fasthttp.RequestCtx {
	var ctxs []*fasthttp.RequestCtx
	for i := range 16 {
		ctxs = append(ctxs, newCtx(`{"model":"sim-model","max_tokens":16,"messages":[{"role":"user","content":"`+
			strings.Repeat(string(rune('a'+i)), 200)+`"}]}`))
	}
	return ctxs
}

// BenchmarkHandleUnaryKVEvents is BenchmarkHandleUnary with KV events on and
// a cache churning on every request (about 15 blocks stored and 15 evicted).
func BenchmarkHandleUnaryKVEvents(b *testing.B) {
	s := handlerSim(b, kvChurn)
	ctxs := kvChurnBodies()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		ctx := ctxs[i%len(ctxs)]
		i++
		ctx.Response.Reset()
		s.handle(ctx)
		if ctx.Response.StatusCode() != fasthttp.StatusOK {
			b.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
}

func TestHandleUnaryKVEventsAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race")
	}
	s := handlerSim(t, kvChurn)
	ctxs := kvChurnBodies()
	i := 0
	run := func() {
		ctx := ctxs[i%len(ctxs)]
		i++
		ctx.Response.Reset()
		s.handle(ctx)
	}
	for range 64 { // grow the arenas and every ring slot
		run()
	}
	allocs := testing.AllocsPerRun(200, run)
	if allocs > 0 {
		t.Errorf("unary handler with KV events allocates %v times per request", allocs)
	}
	s.sched.events.ring.mu.Lock()
	head := s.sched.events.ring.head
	s.sched.events.ring.mu.Unlock()
	if head < 200 {
		t.Errorf("only %d batches published for 264 churning requests", head)
	}
}
