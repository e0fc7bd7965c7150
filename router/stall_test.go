package router_test

import (
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/router"
)

// frozenUpstream answers nothing — completions and /health alike — until
// thaw: a SIGSTOPped engine, whose kernel still accepts connections.
func frozenUpstream(t *testing.T) (*upstream, func()) {
	frozen := make(chan struct{})
	var once sync.Once
	thaw := func() { once.Do(func() { close(frozen) }) }
	u := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		<-frozen
		if string(ctx.Path()) == "/health" {
			return
		}
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyString("data: thawed\n\ndata: [DONE]\n\n")
	})
	t.Cleanup(thaw) // before the server's shutdown, which waits for the handlers
	return u, thaw
}

// workerStalled reads the stalled field of a worker in /v1/workers.
func workerStalled(t *testing.T, tr *testRouter, id string) bool {
	t.Helper()
	_, body := tr.do(t, "GET", "/v1/workers", "")
	var list struct {
		Workers []struct {
			WorkerID string `json:"worker_id"`
			Stalled  bool   `json:"stalled"`
			InFlight int    `json:"in_flight"`
		} `json:"workers"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatalf("decode /v1/workers %s: %v", body, err)
	}
	for _, w := range list.Workers {
		if w.WorkerID == id {
			return w.Stalled
		}
	}
	t.Fatalf("worker %s not in /v1/workers %s", id, body)
	return false
}

// TestStallFrozenWorker: a stream stuck on a worker that answers nothing
// moves to another one once the stall is confirmed by a failed probe; the
// stalled worker is reported, skipped by the policy's next picks, and back
// once it answers again.
func TestStallFrozenWorker(t *testing.T) {
	frozen, thaw := frozenUpstream(t)
	healthy := namedSSE(t, "healthy", 3)
	tr := startRouter(t, prefer{frozen.addr}, withConfig(func(c *router.Config) {
		c.StallWindow = 300 * time.Millisecond
		c.StallProbeInterval = 100 * time.Millisecond
		c.MaxRetries = 1
	}), record(frozen, "m", discovery.StatusActive), record(healthy, "m", discovery.StatusActive))
	defer http.DefaultClient.CloseIdleConnections()

	start := time.Now()
	resp, body := tr.do(t, "POST", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[]}`)
	if resp.StatusCode != 200 || string(body) != "data: healthy-0\n\ndata: healthy-1\n\ndata: healthy-2\n\n" {
		t.Fatalf("status %d body %q: want the healthy worker's stream", resp.StatusCode, body)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the stuck stream moved after %v", d)
	}
	if !workerStalled(t, tr, frozen.addr) || metric(t, tr, `infera_router_worker_stalled{worker_id="`+frozen.addr+`"}`) != 1 {
		t.Fatal("the frozen worker is not reported stalled")
	}
	if got := metric(t, tr, `infera_router_worker_stalls_total{worker_id="`+frozen.addr+`"}`); got != 1 {
		t.Fatalf("stalls_total = %v, want 1", got)
	}
	if got := metric(t, tr, `infera_router_upstream_failures_total{reason="stalled"}`); got != 1 {
		t.Fatalf("stalled attempts = %v, want 1", got)
	}
	// While stalled it gets no new request, though the policy prefers it.
	start = time.Now()
	resp, _ = tr.do(t, "POST", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[]}`)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Worker") != healthy.addr || time.Since(start) > time.Second {
		t.Fatalf("a new request went to %s (status %d, %v): want the healthy worker at once",
			resp.Header.Get("X-Infera-Worker"), resp.StatusCode, time.Since(start))
	}
	thaw()
	testkit.Eventually(t, "the thawed worker back", func() bool { return !workerStalled(t, tr, frozen.addr) })
	if got := metric(t, tr, `infera_router_worker_stalled{worker_id="`+frozen.addr+`"}`); got != 0 {
		t.Fatalf("stalled gauge %v after the thaw", got)
	}
	resp, body = tr.do(t, "POST", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[]}`)
	if resp.Header.Get("X-Infera-Worker") != frozen.addr || string(body) != "data: thawed\n\ndata: [DONE]\n\n" {
		t.Fatalf("after the thaw: worker %s body %q, want the preferred worker again", resp.Header.Get("X-Infera-Worker"), body)
	}
}

// TestStallOff: with no stall window the same stream waits on its worker
// (here until the first-byte timeout), and nothing is reported stalled.
func TestStallOff(t *testing.T) {
	frozen, _ := frozenUpstream(t)
	healthy := namedSSE(t, "healthy", 1)
	tr := startRouter(t, prefer{frozen.addr}, withConfig(func(c *router.Config) {
		c.StallWindow = 0
		c.TTFTTimeout = 1500 * time.Millisecond
		c.MaxRetries = 1
	}), record(frozen, "m", discovery.StatusActive), record(healthy, "m", discovery.StatusActive))
	defer http.DefaultClient.CloseIdleConnections()
	start := time.Now()
	resp, _ := tr.do(t, "POST", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[]}`)
	if resp.StatusCode != 200 || time.Since(start) < 1500*time.Millisecond {
		t.Fatalf("status %d after %v: want the failover at the first-byte timeout", resp.StatusCode, time.Since(start))
	}
	if workerStalled(t, tr, frozen.addr) {
		t.Fatal("a worker is reported stalled with stall detection off")
	}
}
