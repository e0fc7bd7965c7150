package router_test

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/router"
)

// BenchmarkStreamRelayDialects compares relayed events per second of the
// OpenAI chat stream and the same engine stream translated to Anthropic
// events (/v1/messages), through one real router over loopback (one op =
// one engine event).
func BenchmarkStreamRelayDialects(b *testing.B) {
	up := eventUpstream(b)
	tr := startRouter(b, router.RoundRobin{}, router.DefaultConfig(), record(up, "m", discovery.StatusActive))
	addr := strings.TrimPrefix(tr.url, "http://")
	const perRequest = 10000
	for _, bc := range []struct{ name, path, body string }{
		{"openai", "/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":`},
		{"anthropic", "/v1/messages", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}],"max_tokens":`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			client := benchClient(addr)
			client.StreamResponseBody = true
			defer client.CloseIdleConnections()
			buf := make([]byte, 32<<10)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for left := b.N; left > 0; left -= perRequest {
				n := min(left, perRequest)
				streamAny(b, client, "http://"+addr+bc.path, bc.body+itoa(n)+"}", buf)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
		})
	}
}

// streamAny sends one streaming request and reads the whole response.
func streamAny(b *testing.B, client *fasthttp.HostClient, url, body string, buf []byte) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod("POST")
	req.SetBodyString(body)
	if err := client.Do(req, resp); err != nil {
		b.Fatal(err)
	}
	for {
		_, err := resp.BodyStream().Read(buf)
		if err == io.EOF {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	_ = resp.CloseBodyStream()
	if resp.StatusCode() != 200 {
		b.Fatalf("status %d", resp.StatusCode())
	}
}
