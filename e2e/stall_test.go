package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Issue 12, acceptance 1: one frozen engine (SIGSTOP for 10 s), or one that
// hangs 20% of its requests before the first token, must not stall a fleet
// of four under 32 concurrent streams, with round-robin and kv-aware: the
// fleet keeps at least 60% of its throughput, no request fails, and the
// router reports the stalled worker (and brings it back).

const (
	stallConcurrency = 32
	stallWindow      = time.Second
)

// stallServeArgs: a short stall window, and failover room for the streams
// that leave a stuck worker. The first-byte and idle timeouts stay at
// their defaults (60 s, 30 s): what keeps the fleet going must be the stall
// detection, not a timeout.
func stallServeArgs(policy string) []string {
	return []string{"--log-level", "info", "--router-policy", policy,
		"--stall-window", stallWindow.String(), "--stall-probe-interval", "500ms",
		"--request-max-retries", "2"}
}

// stallSimArgs: real time, a fast prefill, ~100 tokens per answer (about
// half a second at the default step cost).
var stallSimArgs = []string{"--time-scale", "1", "--prefill-tokens-per-s", "1000000"}

// streamLoad is a test client: stallConcurrency goroutines streaming chat
// completions back to back, recording when each completed, where, and how
// each failed.
type streamLoad struct {
	base   string
	client *http.Client
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	done     []time.Time // completions
	doneBy   []string    // their workers
	failures []string
}

func startStreamLoad(t *testing.T, base string) *streamLoad {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	l := &streamLoad{base: base, cancel: cancel, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * stallConcurrency}}}
	for i := range stallConcurrency {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				worker, err := l.one(ctx, fmt.Sprintf("client %d request %d: tell me about routers", i, n))
				if ctx.Err() != nil {
					return // stopped mid-request: neither a completion nor a failure
				}
				l.mu.Lock()
				if err != nil {
					l.failures = append(l.failures, err.Error())
				} else {
					l.done = append(l.done, time.Now())
					l.doneBy = append(l.doneBy, worker)
				}
				l.mu.Unlock()
			}
		}()
	}
	t.Cleanup(l.stop)
	return l
}

// one streams a request to its end; an error is a failed request.
func (l *streamLoad) one(ctx context.Context, content string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.base+"/v1/chat/completions", bytes.NewReader(chatBody(true, content, 100)))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	worker := resp.Header.Get("X-Infera-Worker")
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return worker, fmt.Errorf("status %d: %s", resp.StatusCode, clipBody(body))
	}
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		if payload, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: "); ok {
			if payload == "[DONE]" {
				return worker, nil
			}
			if strings.HasPrefix(payload, `{"error"`) {
				return worker, fmt.Errorf("error event on %s: %s", worker, payload)
			}
		}
		if err != nil {
			return worker, fmt.Errorf("stream on %s ended without [DONE]: %w", worker, err)
		}
	}
}

// rate is the completions per second in [from, to).
func (l *streamLoad) rate(from, to time.Time) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, d := range l.done {
		if !d.Before(from) && d.Before(to) {
			n++
		}
	}
	return float64(n) / to.Sub(from).Seconds()
}

// servedBy counts the completions by worker id in [from, to).
func (l *streamLoad) servedBy(id string, from, to time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for i, d := range l.done {
		if l.doneBy[i] == id && !d.Before(from) && d.Before(to) {
			n++
		}
	}
	return n
}

func (l *streamLoad) stop() {
	l.cancel()
	l.wg.Wait()
	l.client.CloseIdleConnections()
}

func (l *streamLoad) failed() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.failures...)
}

// stalledReport is what the router says of one worker: /v1/workers'
// stalled field and the infera_router_worker_stalled gauge.
func stalledReport(t *testing.T, base, id string) (listed, gauge bool) {
	t.Helper()
	res, err := do(t.Context(), http.MethodGet, base+"/v1/workers", nil, nil)
	if err != nil {
		t.Fatalf("GET /v1/workers: %v", err)
	}
	var list struct {
		Workers []struct {
			WorkerID string `json:"worker_id"`
			Stalled  bool   `json:"stalled"`
		} `json:"workers"`
	}
	if err := json.Unmarshal(res.body, &list); err != nil {
		t.Fatalf("decode /v1/workers %s: %v", res.body, err)
	}
	for _, w := range list.Workers {
		if w.WorkerID == id {
			listed = w.Stalled
		}
	}
	res, err = do(t.Context(), http.MethodGet, base+"/metrics", nil, nil)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	return listed, metricValue(string(res.body), "infera_router_worker_stalled", `worker_id="`+id+`"`) == 1
}

func TestStallFrozenEngine(t *testing.T) {
	for _, policy := range []string{"round-robin", "kv-aware"} {
		t.Run(policy, func(t *testing.T) { testStallFrozenEngine(t, policy) })
	}
}

// testStallFrozenEngine: SIGSTOP one of four engines for 10 s under 32
// concurrent streams.
func testStallFrozenEngine(t *testing.T, policy string) {
	f := startServe(t, stallServeArgs(policy)...)
	var ids []string
	procs := map[string]*proc{}
	for i := range 4 {
		p, id := f.startWorker(fmt.Sprintf("worker-%d", i), stallSimArgs...)
		ids, procs[id] = append(ids, id), p
	}
	f.waitWorkers("four active workers", 15*time.Second, func(w map[string]string) bool { return len(w) == 4 })
	frozen := ids[0]
	pid := enginePID(t, procs[frozen])

	l := startStreamLoad(t, f.base)
	time.Sleep(2 * time.Second) // warm-up
	before := time.Now()
	time.Sleep(3 * time.Second)
	freeze := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP engine %d: %v", pid, err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}()
	var sawListed, sawGauge bool
	for time.Since(freeze) < 10*time.Second {
		listed, gauge := stalledReport(t, f.base, frozen)
		sawListed, sawGauge = sawListed || listed, sawGauge || gauge
		time.Sleep(200 * time.Millisecond)
	}
	thaw := time.Now()
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT engine %d: %v", pid, err)
	}
	resumed = true
	backBy := time.Now().Add(10 * time.Second)
	for {
		listed, gauge := stalledReport(t, f.base, frozen)
		if !listed && !gauge {
			break
		}
		if time.Now().After(backBy) {
			t.Fatalf("worker %s still reported stalled 10s after SIGCONT", frozen)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(3 * time.Second)
	after := time.Now()
	l.stop()

	rBefore, rDuring := l.rate(before, freeze), l.rate(freeze, thaw)
	t.Logf("%s: %.1f completions/s before the freeze, %.1f during it (%.0f%%); frozen worker served %d after SIGCONT",
		policy, rBefore, rDuring, 100*rDuring/rBefore, l.servedBy(frozen, thaw, after))
	if fails := l.failed(); len(fails) > 0 {
		t.Errorf("%d requests failed, want 0; first: %s", len(fails), fails[0])
	}
	var perSecond []string
	for i := -2; i < 11; i++ {
		from := freeze.Add(time.Duration(i) * time.Second)
		perSecond = append(perSecond, fmt.Sprintf("%.0f", l.rate(from, from.Add(time.Second))))
	}
	t.Logf("completions per second from 2s before the freeze to 1s after it: %s", strings.Join(perSecond, " "))
	if rDuring < 0.6*rBefore {
		t.Errorf("throughput during the freeze %.1f/s is below 60%% of the %.1f/s before", rDuring, rBefore)
	}
	if !sawListed || !sawGauge {
		t.Errorf("the frozen worker %s was not reported stalled: /v1/workers %t, infera_router_worker_stalled %t", frozen, sawListed, sawGauge)
	}
	if n := l.servedBy(frozen, thaw.Add(time.Second), after); n == 0 {
		t.Errorf("the frozen worker %s served nothing after SIGCONT", frozen)
	}
}

func TestStallHangingEngine(t *testing.T) {
	for _, policy := range []string{"round-robin", "kv-aware"} {
		t.Run(policy, func(t *testing.T) { testStallHangingEngine(t, policy) })
	}
}

// testStallHangingEngine: a fourth engine that hangs 20% of its requests
// before the first token joins three healthy ones under 32 concurrent
// streams. The baseline is the three healthy workers alone: the load is
// bound by the client's concurrency (32 streams, each ~100 decode steps
// whose cost barely grows with the batch), so three workers deliver about
// what four healthy ones would.
func testStallHangingEngine(t *testing.T, policy string) {
	f := startServe(t, stallServeArgs(policy)...)
	for i := range 3 {
		f.startWorker(fmt.Sprintf("worker-%d", i), stallSimArgs...)
	}
	f.waitWorkers("three active workers", 15*time.Second, func(w map[string]string) bool { return len(w) == 3 })

	l := startStreamLoad(t, f.base)
	time.Sleep(2 * time.Second) // warm-up
	before := time.Now()
	time.Sleep(3 * time.Second)
	beforeEnd := time.Now()
	_, hung := f.startWorker("worker-hanging", append([]string{"--hang-before-first-token", "0.2"}, stallSimArgs...)...)
	f.waitWorkers("the hanging worker active", 15*time.Second, func(w map[string]string) bool { return w[hung] == "active" })
	joined := time.Now()
	time.Sleep(10 * time.Second)
	end := time.Now()
	l.stop()

	rBefore, rDuring, rLate := l.rate(before, beforeEnd), l.rate(joined, end), l.rate(joined.Add(5*time.Second), end)
	res, err := do(t.Context(), http.MethodGet, f.base+"/metrics", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	stalled := metricValue(string(res.body), "infera_router_upstream_failures_total", `reason="stalled"`)
	t.Logf("%s: %.1f completions/s before, %.1f with the hanging engine (%.0f%%; %.1f in its last 5s); it served %d; %v stuck streams moved on",
		policy, rBefore, rDuring, 100*rDuring/rBefore, rLate, l.servedBy(hung, joined, end), stalled)
	if fails := l.failed(); len(fails) > 0 {
		t.Errorf("%d requests failed, want 0; first: %s", len(fails), fails[0])
	}
	// The last 5 s too: hung requests pile up over time when nothing
	// moves them, so the whole window alone would hide a slow collapse.
	if rDuring < 0.6*rBefore || rLate < 0.6*rBefore {
		t.Errorf("throughput with the hanging engine %.1f/s (last 5s %.1f/s) is below 60%% of the %.1f/s before", rDuring, rLate, rBefore)
	}
	if stalled == 0 {
		t.Errorf("no stream was reported stuck (infera_router_upstream_failures_total{reason=\"stalled\"} is 0): the hangs were not met")
	}
	if l.servedBy(hung, joined, end) == 0 {
		t.Errorf("the hanging engine served nothing: its 80%% of good answers were lost")
	}
}
