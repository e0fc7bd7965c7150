package router

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/lifecycle"
	"github.com/infera/infera/openai"
)

// legWorker is a real HTTP worker for the leg tests: it answers status
// and records the bodies it got.
type legWorker struct {
	addr   string
	status int
	mu     sync.Mutex
	bodies []string
}

func startLegWorker(t *testing.T, status int, handler fasthttp.RequestHandler) *legWorker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lw := &legWorker{addr: ln.Addr().String(), status: status}
	srv := &fasthttp.Server{CloseOnShutdown: true, Handler: func(ctx *fasthttp.RequestCtx) {
		lw.mu.Lock()
		lw.bodies = append(lw.bodies, string(ctx.PostBody()))
		lw.mu.Unlock()
		if handler != nil {
			handler(ctx)
			return
		}
		ctx.SetStatusCode(lw.status)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"ok":true}`)
	}}
	servetest.Run(t, "worker", ln, func(ctx context.Context, ln net.Listener) error {
		return lifecycle.Serve(ctx, srv, ln, lifecycle.Options{Grace: 5 * time.Second})
	})
	return lw
}

func (lw *legWorker) record() discovery.Record {
	return discovery.Record{WorkerID: lw.addr, URL: "http://" + lw.addr, ModelName: "m", Engine: "sim",
		DisaggMode: discovery.DisaggMixed, DPSize: 1, RequestTransport: "http", Status: discovery.StatusActive}
}

func (lw *legWorker) got() []string {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return append([]string(nil), lw.bodies...)
}

// releaseLog is a policy recording every released ticket.
type releaseLog struct {
	RoundRobin
	mu       sync.Mutex
	released map[string]Result // by worker id
}

func (p *releaseLog) Release(t Ticket, res Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.released[t.Worker.id] = res
}

// legsRequest builds a router over a 200 worker and a 500 worker and a
// request to drive attempts by hand.
func legsRequest(t *testing.T) (*relay, *releaseLog, map[string]*legWorker) {
	t.Helper()
	ok, bad := startLegWorker(t, 200, nil), startLegWorker(t, 500, nil)
	pol := &releaseLog{released: map[string]Result{}}
	r, err := New(withConfig(func(c *Config) { c.IdleConnTimeout = 50e6 }), pol, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.shutdownPools)
	r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: []discovery.Record{ok.record(), bad.record()}})
	var req fasthttp.Request
	req.SetBodyString(`{"model":"m","prompt":"p"}`)
	ctx := &fasthttp.RequestCtx{}
	ctx.Init(&req, nil, nil)
	rel := acquireRelay(r, RouteCompletions)
	rel.ctx, rel.body = ctx, ctx.PostBody()
	if err := openai.Scan(rel.body, &rel.scan); err != nil {
		t.Fatal(err)
	}
	rel.model = r.view.Load().models["m"]
	t.Cleanup(func() { r.finish(rel, outcomeOK, 200) })
	return rel, pol, map[string]*legWorker{ok.addr: ok, bad.addr: bad}
}

// runLeg sends attempt a and ends it with its worker's answer: success on
// a 2xx, a noted 5xx fault otherwise.
func runLeg(t *testing.T, rel *relay, a *attempt) {
	t.Helper()
	resp, err := rel.send(a)
	if err != nil {
		t.Fatalf("send to %s: %v", a.ticket.Worker.id, err)
	}
	a.status = resp.StatusCode()
	_ = resp.CloseBodyStream()
	fasthttp.ReleaseResponse(resp)
	endLeg(rel, a)
}

func endLeg(rel *relay, a *attempt) {
	if a.status >= 500 {
		a.fail(reasonStatus5xx, errStatus5xx)
		rel.endAttempt(a, a.status, errStatus5xx, verdictFault)
		return
	}
	rel.endAttempt(a, a.status, nil, verdictSuccess)
}

// checkLegs: each worker got its leg's own body, its own ticket back with
// its own status, and its own breaker verdict; no slot is left taken.
func checkLegs(t *testing.T, rel *relay, pol *releaseLog, workers map[string]*legWorker, bodies map[string]string) {
	t.Helper()
	if len(pol.released) != 2 {
		t.Fatalf("released tickets %v, want one per worker", pol.released)
	}
	for _, w := range rel.model.Workers {
		lw := workers[w.id]
		if got := lw.got(); len(got) != 1 || got[0] != bodies[w.id] {
			t.Errorf("worker %s (status %d) got bodies %q, want [%q]", w.id, lw.status, got, bodies[w.id])
		}
		if res := pol.released[w.id]; res.Status != lw.status {
			t.Errorf("worker %s ticket released with status %d, want %d", w.id, res.Status, lw.status)
		}
		wantFails := int32(0)
		if lw.status >= 500 {
			wantFails = 1
		}
		if f := w.breaker.fails.Load(); f != wantFails {
			t.Errorf("worker %s breaker faults %d, want %d", w.id, f, wantFails)
		}
		if n := w.InFlight(); n != 0 {
			t.Errorf("worker %s still holds %d admission slots", w.id, n)
		}
	}
	if rel.lastWhy != reasonStatus5xx || rel.lastErr != errStatus5xx {
		t.Errorf("request's last failure %v %v, want the 5xx leg's", rel.lastWhy, rel.lastErr)
	}
}

// TestRequestConcurrentLegs: one request holds two attempts at once (PD's
// concurrent legs), on two workers, each with its own body and ticket, and
// ends each with its own outcome.
func TestRequestConcurrentLegs(t *testing.T) {
	rel, pol, workers := legsRequest(t)
	a, b := &rel.att, &attempt{rel: rel, body: []byte(`{"model":"m","prompt":"p","max_tokens":1}`)}
	if err := rel.begin(a, false); err != nil {
		t.Fatal(err)
	}
	if err := rel.begin(b, false); err != nil {
		t.Fatal(err)
	}
	if a.ticket.Worker == b.ticket.Worker || a.ticket.Worker == nil || b.ticket.Worker == nil {
		t.Fatalf("legs on workers %v and %v, want two different ones", a.ticket.Worker, b.ticket.Worker)
	}
	bodies := map[string]string{a.ticket.Worker.id: string(rel.body), b.ticket.Worker.id: string(b.body)}
	var wg sync.WaitGroup
	resps := make([]*fasthttp.Response, 2)
	errs := make([]error, 2)
	for i, leg := range []*attempt{a, b} {
		req := rel.upstreamRequest(leg)
		wg.Go(func() {
			defer fasthttp.ReleaseRequest(req)
			resps[i], errs[i] = leg.do(req)
		})
	}
	wg.Wait()
	for i, leg := range []*attempt{a, b} {
		if errs[i] != nil {
			t.Fatalf("leg %d: %v", i, errs[i])
		}
		leg.status = resps[i].StatusCode()
		fasthttp.ReleaseResponse(resps[i])
		endLeg(rel, leg)
	}
	checkLegs(t, rel, pol, workers, bodies)
}

// TestRequestSerialLegs: one request chains two attempts (PD's serial
// legs): the second begins after the first ended, on the other worker.
func TestRequestSerialLegs(t *testing.T) {
	rel, pol, workers := legsRequest(t)
	first := &attempt{rel: rel, body: []byte(`{"model":"m","prompt":"p","max_tokens":1}`)}
	if err := rel.begin(first, false); err != nil {
		t.Fatal(err)
	}
	runLeg(t, rel, first)
	if first.ticket.Worker != nil {
		t.Fatal("an ended attempt keeps its ticket")
	}
	second := &rel.att
	if err := rel.begin(second, false); err != nil {
		t.Fatal(err)
	}
	w1 := rel.tried[0]
	if second.ticket.Worker == w1 {
		t.Fatalf("second leg on the first leg's worker %s", w1.id)
	}
	bodies := map[string]string{w1.id: string(first.body), second.ticket.Worker.id: string(rel.body)}
	runLeg(t, rel, second)
	checkLegs(t, rel, pol, workers, bodies)
}

// upperEvents is a test event translation: "data: x" becomes "data: X…"
// (payload upper-cased), appended to dst without allocating.
func upperEvents(dst, ev []byte) []byte {
	payload, ok := bytes.CutPrefix(ev, []byte("data: "))
	if !ok {
		return append(dst, ev...)
	}
	dst = append(dst, "data: "...)
	for _, c := range payload {
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

// TestStreamRouteEventHook: a route whose dialect translates events gets
// every streamed event through the hook, the last one without its blank
// line too, over real HTTP.
func TestStreamRouteEventHook(t *testing.T) {
	up := startLegWorker(t, 200, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for _, ev := range []string{"data: one\n\n", "data: two\n\n", "data: [done]"} {
				_, _ = w.WriteString(ev)
				_ = w.Flush()
			}
		})
	})
	r, err := New(withConfig(func(c *Config) { c.IdleConnTimeout = 50e6 }), RoundRobin{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	d := *openAIDialect
	d.name, d.event = "test-upper", upperEvents
	r.dialects[RouteChatCompletions] = &d
	r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: []discovery.Record{up.record()}})
	addr := servetest.Loopback(t, "router", r.Serve)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if want := "data: ONE\n\ndata: TWO\n\ndata: [DONE]"; string(body) != want {
		t.Fatalf("client got %q, want %q", body, want)
	}
	// Completions keeps the OpenAI dialect: events as they are.
	resp, err = (&http.Client{Transport: tr}).Post("http://"+addr+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := "data: one\n\ndata: two\n\ndata: [done]"; string(body) != want {
		t.Fatalf("completions got %q, want %q", body, want)
	}
}

// TestRelayWriteToTransformAllocs: a route event hook costs no allocation
// per event once the pump's output buffer has grown.
func TestRelayWriteToTransformAllocs(t *testing.T) {
	r, err := New(DefaultConfig(), RoundRobin{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ev := []byte(testEvent)
	const events = 1000
	stream := bytes.Repeat(ev, events)
	dst := &countWriter{}
	src := &eofReader{}
	rel := testRelay(r, relayBufSize)
	rel.pump.transform = upperEvents
	run := func() {
		src.data, src.size = stream, len(ev)
		rel.att.src, rel.done, rel.firstByte = src, false, false
		if _, err := rel.WriteTo(dst); err != nil {
			t.Fatal(err)
		}
	}
	run()
	if n := testing.AllocsPerRun(20, run); n != 0 {
		t.Fatalf("relaying %d transformed events allocates %.1f times, want 0", events, n)
	}
	if dst.bytes != 22*len(stream) {
		t.Fatalf("%d bytes relayed, want %d", dst.bytes, 22*len(stream))
	}
}
