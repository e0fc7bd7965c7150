package router_test

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/kvd/kvdtest"
	"github.com/infera/infera/router"
)

func TestPrewarmForwardsPrefetchHint(t *testing.T) {
	sock, st := kvdtest.Start(t, 1<<20)
	tr := startRouter(t, &router.RoundRobin{}, withConfig(func(c *router.Config) { c.KVDSocket = sock }))

	resp, body := tr.do(t, http.MethodPost, "/v1/cache/prewarm",
		`{"model":"m","block_hashes":["00112233aabbccdd","ffeeddccbbaa9988"],"compat_key":"tp0of1_pp0of1","deadline_ms":5000}`)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var got struct {
		Keys       int    `json:"keys"`
		Model      string `json:"model"`
		DeadlineMs int64  `json:"deadline_ms"`
	}
	if err := json.Unmarshal(body, &got); err != nil || got.Keys != 2 || got.Model != "m" || got.DeadlineMs != 5000 {
		t.Fatalf("body %s (%v)", body, err)
	}
	// prefetch_hint has no reply: wait for the daemon to count it. This
	// kvd has no L3, so both keys are dropped, and counted.
	testkit.Eventually(t, "the hint reaches kvd", func() bool {
		c := st.Counters()
		return c.PrefetchHints == 1 && c.PrefetchDropped == 2
	})
	// The connection is reused for the next one.
	resp, body = tr.do(t, http.MethodPost, "/v1/cache/prewarm", `{"model":"m","block_hashes":["0011223344556677"]}`)
	if resp.StatusCode != http.StatusAccepted || !strings.Contains(string(body), `"compat_key":"tp0of1_pp0of1"`) || !strings.Contains(string(body), `"deadline_ms":1000`) {
		t.Fatalf("defaults: %d %s", resp.StatusCode, body)
	}
	testkit.Eventually(t, "the second hint", func() bool { return st.Counters().PrefetchHints == 2 })

	// Bad bodies: 400 with what is wrong.
	for body, want := range map[string]string{
		`{"block_hashes":["0011223344556677"]}`:                               "model is required",
		`{"model":"m"}`:                                                       "at least one hash",
		`{"model":"m","block_hashes":["0011"]}`:                               "16 hex digits",
		`{"model":"m","block_hashes":["00112233445566zz"]}`:                   "not hex",
		`{"model":"m","block_hashes":[1]}`:                                    "block_hashes[0]",
		`{"model":"m","block_hashes":["0011223344556677"],"x":1}`:             "unknown field",
		`{"model":"m","block_hashes":[],"deadline_ms":0}`:                     "deadline_ms",
		`{"model":"m","block_hashes":["0011223344556677"],"deadline_ms":1.5}`: "deadline_ms",
		`[1]`:          "JSON object",
		`{"model":"m"`: "invalid prewarm request",
	} {
		resp, b := tr.do(t, http.MethodPost, "/v1/cache/prewarm", body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), want) {
			t.Errorf("%s: %d %s, want 400 with %q", body, resp.StatusCode, b, want)
		}
	}
	resp, _ = tr.do(t, http.MethodGet, "/v1/cache/prewarm", "")
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %d", resp.StatusCode)
	}
}

func TestPrewarmWithoutKVD(t *testing.T) {
	tr := startRouter(t, &router.RoundRobin{}, router.DefaultConfig())
	resp, body := tr.do(t, http.MethodPost, "/v1/cache/prewarm", `{"model":"m","block_hashes":["0011223344556677"]}`)
	wantError(t, resp, body, http.StatusServiceUnavailable, "kvd_not_configured")

	// A socket nobody listens on: 503 too, and the router keeps serving.
	tr = startRouter(t, &router.RoundRobin{}, withConfig(func(c *router.Config) { c.KVDSocket = filepath.Join(t.TempDir(), "none.sock") }))
	resp, body = tr.do(t, http.MethodPost, "/v1/cache/prewarm", `{"model":"m","block_hashes":["0011223344556677"]}`)
	wantError(t, resp, body, http.StatusServiceUnavailable, "kvd_unavailable")
	if strings.Contains(string(body), ".sock") {
		t.Fatalf("the socket path reached the client: %s", body)
	}
}

// TestPrewarmDeadlineOverflow: a deadline_ms whose nanoseconds wrap int64
// (or that passes the limit) is a 400, not a negative duration.
func TestPrewarmDeadlineOverflow(t *testing.T) {
	sock, _ := kvdtest.Start(t, 1<<20)
	tr := startRouter(t, &router.RoundRobin{}, withConfig(func(c *router.Config) { c.KVDSocket = sock }))
	for _, ms := range []string{"9223372036854", "9223372036854775807", "18446744073709551616", "0", "-5"} {
		resp, body := tr.do(t, http.MethodPost, "/v1/cache/prewarm", `{"model":"m","block_hashes":["0011223344556677"],"deadline_ms":`+ms+`}`)
		wantError(t, resp, body, http.StatusBadRequest, "invalid_prewarm")
	}
}

// TestPrewarmStalledKVDConcurrent: against a kvd that accepts and never
// answers, 12 concurrent prewarms each answer 503 within the dial
// timeout, side by side (no lock is held across the dial).
func TestPrewarmStalledKVDConcurrent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "stalled.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	// The stalled kvd reads what comes and answers nothing; it counts the
	// connections open at once. Hints that queued (a lock held across the
	// dial, or one connection shared) would never have more than one open.
	var (
		mu            sync.Mutex
		held          []net.Conn
		open, maxOpen int
		readers       sync.WaitGroup
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			open++
			maxOpen = max(maxOpen, open)
			mu.Unlock()
			readers.Go(func() {
				_, _ = io.Copy(io.Discard, c) // until the router gives the hint up
				mu.Lock()
				open--
				mu.Unlock()
			})
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
		readers.Wait()
	})
	tr := startRouter(t, &router.RoundRobin{}, withConfig(func(c *router.Config) { c.KVDSocket = sock }))
	const n = 12
	// Every hint must be waiting on kvd before any gives up: the requests
	// start together, and each waits on its own connection until the
	// 2 s dial timeout.
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			resp, body := tr.do(t, http.MethodPost, "/v1/cache/prewarm", `{"model":"m","block_hashes":["0011223344556677"]}`)
			wantError(t, resp, body, http.StatusServiceUnavailable, "kvd_unavailable")
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if maxOpen != n {
		t.Fatalf("%d prewarms against a stalled kvd held at most %d connections at once: they queued", n, maxOpen)
	}
}

func TestParsePrewarm(t *testing.T) {
	req, err := router.ParsePrewarm([]byte(` {"deadline_ms":250,"compat_key":"tp1of2_pp0of1","model":"m\u00e9","block_hashes":["0102030405060708"]} `))
	if err != nil || req.Model != "mé" || req.CompatKey != "tp1of2_pp0of1" || req.Deadline != 250*time.Millisecond ||
		len(req.Keys) != 1 || string(req.Keys[0]) != "\x01\x02\x03\x04\x05\x06\x07\x08" {
		t.Fatalf("%+v %v", req, err)
	}
	many := `{"model":"m","block_hashes":[` + strings.Repeat(`"0011223344556677",`, router.MaxPrewarmKeys) + `"0011223344556677"]}`
	if _, err := router.ParsePrewarm([]byte(many)); !errors.Is(err, router.ErrPrewarmBody) || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("too many keys: %v", err)
	}
	if _, err := router.ParsePrewarm([]byte(`{"model":"m","model":"n","block_hashes":["0011223344556677"]}`)); err == nil || !strings.Contains(err.Error(), "duplicate") {
		t.Fatalf("duplicate: %v", err)
	}
}

func FuzzParsePrewarm(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","block_hashes":["0011223344556677"],"compat_key":"c","deadline_ms":5}`,
		`{"model":"m\"","block_hashes":[]}`, `{"model":"m","block_hashes":["0011223344556677"],"deadline_ms":9223372036854}`, `[]`, `{`, `{"deadline_ms":-1}`, `{"block_hashes":["0011223344556677",2]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := router.ParsePrewarm(b)
		if err != nil {
			if !errors.Is(err, router.ErrPrewarmBody) {
				t.Fatalf("error %v does not wrap ErrPrewarmBody", err)
			}
			return
		}
		if req.Model == "" || len(req.Keys) == 0 || len(req.Keys) > router.MaxPrewarmKeys || req.Deadline <= 0 || req.Deadline > router.MaxPrewarmDeadline {
			t.Fatalf("accepted %+v", req)
		}
		for _, k := range req.Keys {
			if len(k) != 8 {
				t.Fatalf("key %x", k)
			}
		}
		if !json.Valid(b) {
			t.Fatalf("accepted invalid JSON %q", b)
		}
	})
}
