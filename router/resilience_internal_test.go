package router

import (
	"bytes"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
)

// TestBreakerTransitions walks every transition of the breaker with a fake
// clock: closed → open at the threshold, neutral verdicts ignored, success
// resetting the count, open → half-open after the cooldown with a single
// probe, probe failure re-opening with a doubled (capped) cooldown, a
// neutral probe freeing the probe slot, probe success closing and resetting
// the cooldown, and a routed-anyway success closing an open breaker.
func TestBreakerTransitions(t *testing.T) {
	cfg := breakerConfig{threshold: 3, cooldown: 5 * time.Second, maxCooldown: 12 * time.Second}
	var b breaker
	t0 := time.Unix(1000, 0)
	now := t0
	rec := func(v verdict, probe bool) breakerEvent { return b.record(v, probe, now, &cfg) }
	want := func(state uint32) {
		t.Helper()
		if got := b.State(); got != state {
			t.Fatalf("state %d, want %d", got, state)
		}
	}

	// Closed: faults below the threshold, neutral verdicts and a success
	// that resets the count keep it closed.
	rec(verdictFault, false)
	rec(verdictFault, false)
	rec(verdictNeutral, false) // 4xx / 429 / client gone: neutral
	rec(verdictSuccess, false) // resets
	rec(verdictFault, false)
	rec(verdictFault, false)
	want(breakerClosed)
	if !b.available(now) || b.admit(now) {
		t.Fatal("a closed breaker must be available and admit no probe")
	}
	// Third consecutive fault: open for the base cooldown.
	if ev := rec(verdictFault, false); ev != breakerTripped {
		t.Fatalf("event %d, want tripped", ev)
	}
	want(breakerOpen)
	if b.available(now.Add(4 * time.Second)) {
		t.Fatal("available during the cooldown")
	}
	// A request routed anyway during the cooldown is not a probe; its
	// fault changes nothing.
	if b.admit(now) {
		t.Fatal("admit during the cooldown made a probe")
	}
	rec(verdictFault, false)
	want(breakerOpen)

	// Cooldown over: available; the first admit is the single probe.
	now = t0.Add(5 * time.Second)
	if !b.available(now) || !b.admit(now) {
		t.Fatal("after the cooldown the next request must be the probe")
	}
	want(breakerHalfOpen)
	if b.available(now) || b.admit(now) {
		t.Fatal("a second request during the probe")
	}
	// A neutral probe frees the slot for another probe.
	rec(verdictNeutral, true)
	want(breakerHalfOpen)
	if !b.available(now) || !b.admit(now) {
		t.Fatal("after a neutral probe another request must probe")
	}
	// Probe fault: open again, cooldown doubled (10s).
	if ev := rec(verdictFault, true); ev != breakerTripped {
		t.Fatalf("event %d, want tripped", ev)
	}
	want(breakerOpen)
	if b.available(now.Add(9*time.Second)) || !b.available(now.Add(10*time.Second)) {
		t.Fatal("second cooldown should be 10s")
	}
	// Third trip: 20s capped at 12s.
	now = now.Add(10 * time.Second)
	b.admit(now)
	rec(verdictFault, true)
	if b.available(now.Add(11*time.Second)) || !b.available(now.Add(12*time.Second)) {
		t.Fatal("third cooldown should be capped at 12s")
	}
	// Probe success: closed, and the next trip starts from the base again.
	now = now.Add(12 * time.Second)
	if !b.admit(now) {
		t.Fatal("no probe after the capped cooldown")
	}
	if ev := rec(verdictSuccess, true); ev != breakerRecovered {
		t.Fatalf("event %d, want recovered", ev)
	}
	want(breakerClosed)
	for range 3 {
		rec(verdictFault, false)
	}
	want(breakerOpen)
	if !b.available(now.Add(5 * time.Second)) {
		t.Fatal("cooldown not reset to the base after recovery")
	}
	// A routed-anyway success while open closes it.
	if ev := rec(verdictSuccess, false); ev != breakerRecovered {
		t.Fatalf("event %d, want recovered", ev)
	}
	want(breakerClosed)
}

func TestCooldownFor(t *testing.T) {
	cfg := breakerConfig{cooldown: 5 * time.Second, maxCooldown: 60 * time.Second}
	for trips, want := range map[int]time.Duration{1: 5 * time.Second, 2: 10 * time.Second, 3: 20 * time.Second, 4: 40 * time.Second, 5: 60 * time.Second, 50: 60 * time.Second} {
		if got := cfg.cooldownFor(trips); got != want {
			t.Errorf("cooldownFor(%d) = %v, want %v", trips, got, want)
		}
	}
}

// TestAdmissionTransitions: free → full → skipped; a release wakes waiters
// without polling; no limit never saturates.
func TestAdmissionTransitions(t *testing.T) {
	a := admission{limit: 2}
	w := &Worker{id: "w"}
	if a.saturated(w) || !a.reserve(w) || !a.reserve(w) {
		t.Fatal("two slots should be free")
	}
	if !a.saturated(w) || a.reserve(w) {
		t.Fatal("a full worker must be saturated and refuse a slot")
	}
	a.waiting.Add(1)
	wake := a.waitChan()
	select {
	case <-wake:
		t.Fatal("woken before any release")
	default:
	}
	a.release(w)
	select {
	case <-wake:
	default:
		t.Fatal("a release did not wake the waiter")
	}
	if a.saturated(w) || !a.reserve(w) {
		t.Fatal("the freed slot should be free")
	}
	a.waiting.Add(-1)

	var unlimited admission
	for range 100 {
		if unlimited.saturated(w) || !unlimited.reserve(w) {
			t.Fatal("limit 0 means unlimited")
		}
	}
}

func TestParseBearer(t *testing.T) {
	for _, c := range []struct {
		in, tok string
		ok      bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer abc", "abc", true},
		{"BEARER \t abc  ", "abc", true},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"Bearerabc", "", false},
		{"Basic abc", "", false},
		{"Bearer a b", "", false},
		{"Bearer a\x00", "", false},
		{"Bearer é", "", false},
		{"", "", false},
	} {
		tok, ok := parseBearer([]byte(c.in))
		if ok != c.ok || string(tok) != c.tok {
			t.Errorf("parseBearer(%q) = %q, %v; want %q, %v", c.in, tok, ok, c.tok, c.ok)
		}
	}
	ks := newKeySet([]string{"k1", "a-much-longer-key-2"})
	if !ks.match([]byte("k1")) || !ks.match([]byte("a-much-longer-key-2")) || ks.match([]byte("k2")) || ks.match(nil) {
		t.Fatal("keySet.match is wrong")
	}
}

func TestKeySetMatchAllocs(t *testing.T) {
	ks := newKeySet([]string{"k1", "a-much-longer-key-2"})
	if n := testing.AllocsPerRun(100, func() { ks.match([]byte("k1")) }); n != 0 {
		t.Fatalf("key match allocates %v times", n)
	}
}

// FuzzAuthorization: the parser never panics, returns a token only when it
// is clean visible ASCII, and round-trips a clean token.
func FuzzAuthorization(f *testing.F) {
	for _, s := range []string{"Bearer abc", "bearer\tx", "Bearer  ", "Basic Zm9v", "Bearer \x80", "Bearer a b"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, h []byte) {
		tok, ok := parseBearer(h)
		if !ok {
			if tok != nil {
				t.Fatal("token with !ok")
			}
			return
		}
		if len(tok) == 0 || len(tok) > maxBearerBytes {
			t.Fatalf("token length %d", len(tok))
		}
		for _, c := range tok {
			if c <= ' ' || c > '~' {
				t.Fatalf("token %q has byte %#x", tok, c)
			}
		}
		again, ok := parseBearer(append([]byte("Bearer "), tok...))
		if !ok || !bytes.Equal(again, tok) {
			t.Fatalf("round trip of %q gave %q", tok, again)
		}
		ks := newKeySet([]string{string(tok)})
		if !ks.match(tok) {
			t.Fatal("a key does not match itself")
		}
	})
}

// FuzzHandleHeaders drives Handle with arbitrary header sets on a fake
// RequestCtx: it must never panic, and every answer it makes itself is a
// JSON error envelope or one of the info bodies.
func FuzzHandleHeaders(f *testing.F) {
	f.Add("/v1/chat/completions", "Authorization", "Bearer k1", "X-Request-Id", "abc", `{"model":"m","messages":[]}`)
	f.Add("/v1/workers", "Authorization", "Bearer admin", "Content-Type", "application/json", "")
	f.Add("/metrics", "Authorization", "bearer", "X-Request-Id", "\x00\xff", "{")
	f.Add("/v1/models", "Authorization", "Basic x", "Accept", "*/*", `{"model":"nope"}`)
	r, err := New(withConfig(func(c *Config) { c.APIKeys = []string{"k1"}; c.AdminToken = "admin" }), RoundRobin{}, zerolog.Nop())
	if err != nil {
		f.Fatal(err)
	}
	r.UpdateFleet(&discovery.Snapshot{Revision: 1, Workers: []discovery.Record{{
		WorkerID: "127.0.0.1:1", URL: "http://127.0.0.1:1", ModelName: "m", Engine: "sim",
		DisaggMode: discovery.DisaggMixed, DPSize: 1, RequestTransport: "http", Status: discovery.StatusDraining}}})
	f.Fuzz(func(t *testing.T, path, k1, v1, k2, v2, body string) {
		var req fasthttp.Request
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetRequestURI("http://infera" + "/")
		req.URI().SetPath(path)
		req.Header.Set(k1, v1)
		req.Header.Set(k2, v2)
		req.SetBodyString(body)
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, nil, nil)
		r.Handle(&ctx)
		status := ctx.Response.StatusCode()
		if status == fasthttp.StatusOK {
			return // an info endpoint (models, metrics, workers, health)
		}
		b := ctx.Response.Body()
		if !bytes.HasPrefix(b, []byte(`{"error":{"message":`)) {
			t.Fatalf("status %d body %q is no error envelope", status, b)
		}
	})
}
