package router

import (
	"bufio"
	"bytes"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
)

// TestOriginFormWritesAsTheURI: a request given originForm's Host and
// target goes out byte for byte as one given the full URI (what the relay
// sent before it stopped parsing URIs per request), whatever the worker's
// URL looks like.
func TestOriginFormWritesAsTheURI(t *testing.T) {
	write := func(build func(*fasthttp.Request)) []byte {
		t.Helper()
		req := fasthttp.AcquireRequest()
		defer fasthttp.ReleaseRequest(req)
		build(req)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetBodyString("{}")
		var out bytes.Buffer
		bw := bufio.NewWriter(&out)
		if err := req.Write(bw); err != nil {
			t.Fatal(err)
		}
		if err := bw.Flush(); err != nil {
			t.Fatal(err)
		}
		return out.Bytes()
	}
	for _, uri := range []string{
		"http://127.0.0.1:8000/v1/chat/completions",
		"http://Engine-A.Example:8000/v1/chat/completions",
		"http://[::1]:8000/v1/completions",
		"http://engine/prefix/v1/chat/completions",
		"https://engine:443/a%20b/v1/chat/completions",
		"http://engine:8000/a//b/../v1/embeddings",
	} {
		for _, disable := range []bool{true, false} {
			host, target, err := originForm(uri, disable)
			if err != nil {
				t.Fatalf("%s: %v", uri, err)
			}
			want := write(func(req *fasthttp.Request) {
				req.SetRequestURI(uri)
				req.URI().DisablePathNormalizing = disable
			})
			got := write(func(req *fasthttp.Request) {
				req.Header.SetHost(host)
				req.Header.SetRequestURI(target)
			})
			if !bytes.Equal(got, want) {
				t.Errorf("%s (path normalizing off: %v): origin form writes\n%q\nthe URI\n%q", uri, disable, got, want)
			}
		}
	}
}

// TestWorkerLeavingClosesItsPool: a worker that leaves the fleet has its
// idle connections closed at once, and a request still sent to it (one
// that picked it before it left) has its connection closed at its end,
// not kept.
func TestWorkerLeavingClosesItsPool(t *testing.T) {
	stay, leave := startLegWorker(t, 200, nil), startLegWorker(t, 200, nil)
	r, err := New(withConfig(func(c *Config) { c.IdleConnTimeout = time.Hour }), &RoundRobin{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.shutdownPools)
	r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: []discovery.Record{stay.record(), leave.record()}})
	r.fleetMu.Lock()
	w := r.workers[leave.addr]
	r.fleetMu.Unlock()
	get := func() {
		t.Helper()
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI(w.health)
		if err := w.doUnary(req, resp, 5*time.Second); err != nil || resp.StatusCode() != 200 {
			t.Fatalf("request to the worker: %v, status %d", err, resp.StatusCode())
		}
	}
	get()
	if n := w.pool.Idle(); n != 1 || r.conns.Len() != 1 {
		t.Fatalf("%d idle connections (%d open), want 1 and 1", n, r.conns.Len())
	}
	r.UpdateFleet(&discovery.Snapshot{Revision: 2, Workers: []discovery.Record{stay.record()}})
	if n := w.pool.Open(); n != 0 || r.conns.Len() != 0 {
		t.Fatalf("%d connections of the worker that left (%d open), want none", n, r.conns.Len())
	}
	get()
	if n := w.pool.Open(); n != 0 || r.conns.Len() != 0 {
		t.Fatalf("%d connections kept after a request to the worker that left (%d open), want none", n, r.conns.Len())
	}
}
