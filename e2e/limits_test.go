package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Issue 12, acceptance 2 and 3, and bare-LF request lines.

const int64Max = "9223372036854775807"

// vmRSS reads a process's resident set size in bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read /proc/%d/status: %v", pid, err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				t.Fatalf("VmRSS line %q: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// TestHugeMaxTokens: max_tokens = int64 max is refused by the router with
// 400 at once; sent straight to the simulator it is an error too, and the
// simulator's memory does not grow (it used to pre-generate without bound).
func TestHugeMaxTokens(t *testing.T) {
	f := startServe(t, "--log-level", "info")
	p, id := f.startWorker("worker")
	f.waitWorkers("the worker active", 15*time.Second, func(w map[string]string) bool { return w[id] == "active" })
	pid := enginePID(t, p)
	baseline := vmRSS(t, pid)

	for _, stream := range []bool{false, true} {
		body := fmt.Appendf(nil, `{"model":"sim-model","stream":%t,"max_tokens":%s,"messages":[{"role":"user","content":"hi"}]}`, stream, int64Max)
		start := time.Now()
		res, err := do(t.Context(), http.MethodPost, f.base+"/v1/chat/completions", body, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkEnvelope(res, http.StatusBadRequest, "max_tokens_too_large"); err != nil {
			t.Errorf("router, stream=%t: %v", stream, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("router took %v to refuse it", d)
		}
		if w := res.header.Get("X-Infera-Worker"); w != "" {
			t.Errorf("the refused request went to worker %s", w)
		}
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"sim-model","max_tokens":` + int64Max + `,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/chat/completions", `{"model":"sim-model","stream":true,"max_completion_tokens":` + int64Max + `,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/completions", `{"model":"sim-model","max_tokens":` + int64Max + `,"prompt":"hi"}`},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		res, err := do(ctx, http.MethodPost, "http://"+id+c.path, []byte(c.body), nil)
		cancel()
		if err != nil {
			t.Errorf("straight to the simulator %s: %v (RSS grew by %d MB)", c.path, err, (vmRSS(t, pid)-baseline)>>20)
			continue
		}
		if res.status != http.StatusBadRequest {
			t.Errorf("simulator %s: status %d, want 400; body %s", c.path, res.status, clipBody(res.body))
		}
	}
	time.Sleep(time.Second) // anything it had started would show by now
	if grown := vmRSS(t, pid) - baseline; grown > 100<<20 {
		t.Errorf("simulator RSS grew by %d MB, want under 100 MB", grown>>20)
	}
}

// TestUnaryDisconnectFreesEngine: a unary client that disconnects after 1 s
// of an ~8 s generation frees the engine within 2 s, and the router counts
// a disconnect.
func TestUnaryDisconnectFreesEngine(t *testing.T) {
	f := startServe(t, "--log-level", "info")
	_, id := f.startWorker("worker", "--time-scale", "1")
	f.waitWorkers("the worker active", 15*time.Second, func(w map[string]string) bool { return w[id] == "active" })

	// ~5 ms per decode step: 1600 tokens take about 8 s.
	body := chatBody(false, "a long story please", 1600)
	conn, err := net.Dial("tcp", strings.TrimPrefix(f.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	time.Sleep(time.Second)
	if n, err := engineLoad(id); err != nil || n != 1 {
		t.Fatalf("engine load %v (%v) after 1s, want 1 running request", n, err)
	}
	conn.Close()
	left := time.Now()
	for {
		n, err := engineLoad(id)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Since(left) > 2*time.Second {
			t.Fatalf("the engine still runs the request 2s after its unary client left")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("engine freed %v after the client left", time.Since(left).Round(time.Millisecond))
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, err := do(t.Context(), http.MethodGet, f.base+"/metrics", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if metricValue(string(res.body), "infera_router_client_disconnects_total") == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the disconnect was not counted: infera_router_client_disconnects_total = %v",
				metricValue(string(res.body), "infera_router_client_disconnects_total"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestUnaryTTFTTimeoutRunsOnce: a unary request slower than --ttft-timeout
// fails over, but never runs on two engines at once: the first attempt is
// closed (and the engine drops it) before the second starts, and neither
// engine finishes it.
func TestUnaryTTFTTimeoutRunsOnce(t *testing.T) {
	f := startServe(t, "--log-level", "info", "--ttft-timeout", "1s", "--request-max-retries", "1")
	_, a := f.startWorker("worker-a", "--time-scale", "1")
	_, b := f.startWorker("worker-b", "--time-scale", "1")
	f.waitWorkers("two active workers", 15*time.Second, func(w map[string]string) bool { return w[a] == "active" && w[b] == "active" })

	done := make(chan httpResult, 1)
	go func() {
		res, _ := do(t.Context(), http.MethodPost, f.base+"/v1/chat/completions", chatBody(false, "slow", 800), nil)
		done <- res
	}()
	var both time.Duration
	var res httpResult
	last := time.Now()
wait:
	for {
		select {
		case res = <-done:
			break wait
		case <-time.After(10 * time.Millisecond):
		}
		la, errA := engineLoad(a)
		lb, errB := engineLoad(b)
		if errA != nil || errB != nil {
			t.Fatalf("engine loads: %v %v", errA, errB)
		}
		now := time.Now()
		if la > 0 && lb > 0 {
			both += now.Sub(last)
		}
		last = now
	}
	if err := checkEnvelope(res, http.StatusGatewayTimeout, "upstream_timeout"); err != nil {
		t.Errorf("after two first-byte timeouts: %v", err)
	}
	if both > 200*time.Millisecond {
		t.Errorf("both engines ran the request at once for %v", both)
	}
	time.Sleep(time.Second)
	for _, id := range []string{a, b} {
		res, err := do(t.Context(), http.MethodGet, "http://"+id+"/metrics", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		text := string(res.body)
		if n := metricValue(text, "vllm:num_requests_running"); n != 0 {
			t.Errorf("engine %s still runs %v requests", id, n)
		}
		if n := metricValue(text, "vllm:generation_tokens_total"); n >= 800 {
			t.Errorf("engine %s generated %v tokens: it finished a request it was told to drop", id, n)
		}
	}
}

// TestBareLFRequestLine: raw TCP requests with bare-LF line endings are
// answered 400 at once, not after the 60 s read timeout.
func TestBareLFRequestLine(t *testing.T) {
	f := startServe(t, "--log-level", "info", "--client-read-timeout", "60s")
	body := `{"model":"sim-model","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	for _, req := range []string{
		"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: " + strconv.Itoa(len(body)) + "\n\n" + body,
		"GET /v1/models HTTP/1.1\nHost: x\n\n",
	} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(f.base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(conn, req); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		got, err := io.ReadAll(conn)
		conn.Close()
		if err != nil {
			t.Fatalf("%q: no complete answer within 5s (%v); got %q", req, err, got)
		}
		if !bytes.HasPrefix(got, []byte("HTTP/1.1 400")) || !bytes.Contains(got, []byte(`"error":{`)) {
			t.Errorf("%q: answer %q, want a 400 in the OpenAI envelope", req, got)
		}
		t.Logf("answered in %v", time.Since(start).Round(time.Millisecond))
	}
}
