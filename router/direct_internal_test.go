package router

import (
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

func directFleet() *Candidates {
	return &Candidates{
		Model:   "m",
		Workers: []*Worker{{id: "10.0.0.1:8000"}, {id: "10.0.0.2:8000"}},
		Prefill: []*Worker{{id: "10.0.1.1:8000"}},
		Decode:  []*Worker{{id: "10.0.2.1:8000"}, {id: "10.0.2.2:8000"}},
	}
}

func directHeaders(kv ...string) *fasthttp.RequestHeader {
	var h fasthttp.RequestHeader
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return &h
}

// The endpoint picker's headers name exactly the worker (or PD pair)
// taken; an unknown, draining or other-role name is a 503 refusal with the
// reference's message; no header routes as usual.
func TestPickDirect(t *testing.T) {
	c := directFleet()
	for _, tc := range []struct {
		name            string
		headers         []string
		present         bool
		worker, prefill string
		refusal         string
	}{
		{name: "no header"},
		{name: "prefill header alone", headers: []string{"x-prefill-instance-id", "10.0.1.1:8000"}},
		{name: "mixed", headers: []string{"x-worker-instance-id", "10.0.0.2:8000"}, present: true, worker: "10.0.0.2:8000"},
		{name: "header case", headers: []string{"X-WORKER-INSTANCE-ID", "10.0.0.1:8000"}, present: true, worker: "10.0.0.1:8000"},
		{name: "decode alone", headers: []string{"x-worker-instance-id", "10.0.2.2:8000"}, present: true, worker: "10.0.2.2:8000"},
		{name: "pair", headers: []string{"x-worker-instance-id", "10.0.2.1:8000", "x-prefill-instance-id", "10.0.1.1:8000"},
			present: true, worker: "10.0.2.1:8000", prefill: "10.0.1.1:8000"},
		{name: "unknown", headers: []string{"x-worker-instance-id", "10.9.9.9:8000"}, present: true,
			refusal: "worker '10.9.9.9:8000' not found (stale gateway routing?)"},
		{name: "pair with a mixed decode", headers: []string{"x-worker-instance-id", "10.0.0.1:8000", "x-prefill-instance-id", "10.0.1.1:8000"},
			present: true, refusal: "worker '10.0.0.1:8000' not found (stale gateway routing?)"},
		{name: "pair with an unknown prefill", headers: []string{"x-worker-instance-id", "10.0.2.1:8000", "x-prefill-instance-id", "it's"},
			present: true, refusal: `worker "it's" not found (stale gateway routing?)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pickDirect(directHeaders(tc.headers...), c)
			id := func(w *Worker) string {
				if w == nil {
					return ""
				}
				return w.id
			}
			if p.Present != tc.present || id(p.Worker) != tc.worker || id(p.Prefill) != tc.prefill || p.Refusal != tc.refusal {
				t.Fatalf("got %+v (%s, %s), want present %v worker %q prefill %q refusal %q",
					p, id(p.Worker), id(p.Prefill), tc.present, tc.worker, tc.prefill, tc.refusal)
			}
		})
	}
}

// Taking the named worker allocates nothing (request path).
func TestPickDirectAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are checked without -race")
	}
	c := directFleet()
	h := directHeaders("x-worker-instance-id", "10.0.2.1:8000", "x-prefill-instance-id", "10.0.1.1:8000")
	if n := testing.AllocsPerRun(100, func() {
		if p := pickDirect(h, c); p.Worker == nil {
			t.Fatal("no pick")
		}
	}); n != 0 {
		t.Fatalf("%v allocations per pick, want 0", n)
	}
}

// Header values come from clients: any value resolves without panicking,
// and a refusal is one line naming a quoted id.
func FuzzPickDirect(f *testing.F) {
	f.Add("10.0.0.1:8000", "")
	f.Add("10.0.2.1:8000", "10.0.1.1:8000")
	f.Add("it's \"x\"\\", "\x7f")
	f.Add(strings.Repeat("a", 600), "b")
	c := directFleet()
	f.Fuzz(func(t *testing.T, worker, prefill string) {
		var h fasthttp.RequestHeader
		h.SetBytesV(HeaderDirectWorker, []byte(worker))
		h.SetBytesV(HeaderDirectPrefill, []byte(prefill))
		p := pickDirect(&h, c)
		if p.Refusal != "" && (p.Worker != nil || strings.ContainsAny(p.Refusal, "\n\r")) {
			t.Fatalf("refusal %q with worker %v", p.Refusal, p.Worker)
		}
	})
}
