package router_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/openai"
	"github.com/infera/infera/router"
)

const benchEvent = "data: {\"id\":\"chatcmpl-8c1f\",\"object\":\"chat.completion.chunk\",\"created\":1730000000,\"model\":\"Qwen/Qwen3-8B\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"

// eventUpstream streams max_tokens events as fast as it can, flushing each,
// then the end marker, as an engine does; it answers a small JSON body to
// non-streaming requests.
func eventUpstream(b *testing.B) *upstream {
	ev := []byte(benchEvent)
	return startUpstream(b, func(ctx *fasthttp.RequestCtx) {
		var req openai.Request
		if err := openai.Scan(ctx.PostBody(), &req); err != nil {
			ctx.Error(err.Error(), 400)
			return
		}
		if !req.Stream {
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"id":"cmpl-1","object":"text_completion","choices":[{"text":"ok"}]}`)
			return
		}
		n := req.MaxTokens
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for range n {
				_, _ = w.Write(ev)
				if err := w.Flush(); err != nil {
					return
				}
			}
			_, _ = w.WriteString(doneEvent)
			_ = w.Flush()
		})
	})
}

// doneEvent ends a stream (a stream without it is one that broke).
const doneEvent = "data: [DONE]\n\n"

// streamEvents sends one streaming request for n events to url and reads the
// whole response.
func streamEvents(b *testing.B, client *fasthttp.HostClient, url string, n int, buf []byte) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod("POST")
	req.SetBodyString(`{"model":"m","stream":true,"max_tokens":` + itoa(n) + `}`)
	if err := client.Do(req, resp); err != nil {
		b.Fatal(err)
	}
	total := 0
	for {
		k, err := resp.BodyStream().Read(buf)
		total += k
		if err == io.EOF {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	_ = resp.CloseBodyStream()
	if resp.StatusCode() != 200 || total != n*len(benchEvent)+len(doneEvent) {
		b.Fatalf("status %d, %d bytes for %d events", resp.StatusCode(), total, n)
	}
}

// benchClient is a client for one address whose goroutines end with the
// benchmark (plain net.Dial, short idle time).
func benchClient(addr string) *fasthttp.HostClient {
	return &fasthttp.HostClient{
		Addr:                addr,
		MaxIdleConnDuration: 50 * time.Millisecond,
		Dial:                func(a string) (net.Conn, error) { return net.Dial("tcp", a) },
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for ; n > 0; n /= 10 {
		i--
		b[i] = byte('0' + n%10)
	}
	return string(b[i:])
}

// BenchmarkStreamRelay measures relayed SSE events per second through a real
// router over loopback (one op = one event), against the same stream read
// from the worker directly.
//
// router tracks the stream for continuation (the default: every event read
// by the continuation Tracker); router-untracked runs with
// --migration-limit 0, the relay alone.
func BenchmarkStreamRelay(b *testing.B) {
	up := eventUpstream(b)
	tr := startRouter(b, router.RoundRobin{}, router.DefaultConfig(), record(up, "m", discovery.StatusActive))
	untracked := router.DefaultConfig()
	untracked.MigrationLimit = 0
	tu := startRouter(b, router.RoundRobin{}, untracked, record(up, "m", discovery.StatusActive))
	const perRequest = 10000
	for _, bc := range []struct{ name, addr string }{
		{"direct", up.addr},
		{"router", strings.TrimPrefix(tr.url, "http://")},
		{"router-untracked", strings.TrimPrefix(tu.url, "http://")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			client := benchClient(bc.addr)
			client.StreamResponseBody = true
			defer client.CloseIdleConnections()
			url := "http://" + bc.addr + "/v1/chat/completions"
			buf := make([]byte, 32<<10)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for left := b.N; left > 0; left -= perRequest {
				streamEvents(b, client, url, min(left, perRequest), buf)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
		})
	}
}

// BenchmarkUnary measures a small non-streaming request through the router
// against the worker directly (one op = one request).
func BenchmarkUnary(b *testing.B) {
	up := eventUpstream(b)
	tr := startRouter(b, router.RoundRobin{}, router.DefaultConfig(), record(up, "m", discovery.StatusActive))
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":16}`)
	for _, bc := range []struct{ name, addr string }{
		{"direct", up.addr},
		{"router", strings.TrimPrefix(tr.url, "http://")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			client := benchClient(bc.addr)
			defer client.CloseIdleConnections()
			url := "http://" + bc.addr + "/v1/chat/completions"
			req := fasthttp.AcquireRequest()
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			b.ReportAllocs()
			for b.Loop() {
				req.SetRequestURI(url)
				req.Header.SetMethod("POST")
				req.SetBodyRaw(body)
				if err := client.Do(req, resp); err != nil || resp.StatusCode() != http.StatusOK {
					b.Fatal(err, resp.StatusCode())
				}
			}
		})
	}
}
