package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// raiseFileLimit lifts this process's open-file soft limit to at least n
// (the hard limit permitting); the processes the test starts inherit it.
func raiseFileLimit(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur >= n {
		return
	}
	if lim.Max < n {
		t.Fatalf("open-file hard limit %d is below the %d this test needs", lim.Max, n)
	}
	old := lim
	lim.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
}

// openAIError is the envelope the router answers errors with.
type openAIError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

// TestIdleConnectionsDoNotLockOut (issue 12, acceptance 5): 5,000
// connections that never send a request fill --max-connections; a new
// client is refused with an OpenAI error and Retry-After (not fasthttp's
// plain text) and is served once --client-header-timeout has closed the
// idle ones, well before --client-read-timeout.
func TestIdleConnectionsDoNotLockOut(t *testing.T) {
	const idle = 5000
	const headerTimeout = 2 * time.Second
	raiseFileLimit(t, 3*idle)
	f := startServe(t, "--log-level", "info", "--max-connections", strconv.Itoa(idle),
		"--client-header-timeout", headerTimeout.String(), "--client-read-timeout", "60s")
	_, id := f.startWorker("worker")
	f.waitWorkers("the worker", 15*time.Second, func(w map[string]string) bool { return w[id] == "active" })

	addr := strings.TrimPrefix(f.base, "http://")
	conns := make([]net.Conn, 0, idle)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for len(conns) < idle {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatalf("idle connection %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	opened := time.Now()

	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	body := `{"model":"sim-model","max_tokens":4,"messages":[{"role":"user","content":"let me in"}]}`
	refused := 0
	for {
		resp, err := client.Post(f.base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("new client: %v", err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("new client: status %d %s", resp.StatusCode, data)
		}
		var e openAIError
		if err := json.Unmarshal(data, &e); err != nil || e.Error.Code != "too_many_connections" || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("refusal is not an OpenAI error with Retry-After: %v %q %v", resp.Header, data, err)
		}
		refused++
		// The acceptance bound: served within the header timeout (plus
		// slack for the dialing and this loop), not after the read timeout.
		if time.Since(opened) > headerTimeout+5*time.Second {
			t.Fatalf("new client still refused %v after the idle connections opened", time.Since(opened))
		}
		time.Sleep(100 * time.Millisecond) // pacing
	}
	if refused == 0 {
		t.Fatalf("the new client was never refused: the %d idle connections did not fill --max-connections", idle)
	}
	t.Logf("new client served %v after %d idle connections opened (refused %d times)", time.Since(opened).Round(time.Millisecond), idle, refused)
	// The idle connections were closed by the router.
	buf := make([]byte, 512)
	_ = conns[0].SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		if _, err := conns[0].Read(buf); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("an idle connection is still open after the header timeout")
			}
			break
		}
	}
}

// rssKB reads VmRSS or VmHWM (peak) of pid in KiB.
func procStatusKB(t *testing.T, pid int, field string) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatalf("%s %q: %v", field, v, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestBodyBudget (issue 12, acceptance 5): 64 concurrent 30 MB request
// bodies against --body-budget-bytes 256 MiB: some are refused with 503 and
// Retry-After before they are read, the router's peak RSS stays under the
// budget plus 150 MB, and every accepted request succeeds.
func TestBodyBudget(t *testing.T) {
	const (
		clients = 64
		size    = 30 << 20
		budget  = 256 << 20
	)
	f := startServe(t, "--log-level", "info", "--body-budget-bytes", strconv.Itoa(budget), "--max-body-bytes", strconv.Itoa(32<<20))
	_, id := f.startWorker("worker")
	f.waitWorkers("the worker", 15*time.Second, func(w map[string]string) bool { return w[id] == "active" })
	pid := f.serve.cmd.Process.Pid

	// A valid request padded with JSON whitespace to 30 MB: the router and
	// the sim parse it whole, the prompt stays small. Shared by all clients.
	head := []byte(`{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"big body"}]`)
	body := make([]byte, size)
	copy(body, head)
	for i := len(head); i < size-1; i++ {
		body[i] = ' '
	}
	body[size-1] = '}'

	tr := &http.Transport{MaxConnsPerHost: 0, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 2 * time.Minute}
	var mu sync.Mutex
	counts := map[int]int{}
	var failures []string
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.base+"/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures = append(failures, fmt.Sprintf("client %d: %v", i, err))
				return
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			counts[resp.StatusCode]++
			switch resp.StatusCode {
			case http.StatusOK:
			case http.StatusServiceUnavailable, http.StatusTooManyRequests:
				var e openAIError
				if json.Unmarshal(data, &e) != nil || e.Error.Message == "" || resp.Header.Get("Retry-After") == "" {
					failures = append(failures, fmt.Sprintf("client %d: refusal without OpenAI error or Retry-After: %v %q", i, resp.Header, data))
				}
			default:
				failures = append(failures, fmt.Sprintf("client %d: status %d %q", i, resp.StatusCode, clipE2E(data)))
			}
		}()
	}
	close(start)
	wg.Wait()
	peak := procStatusKB(t, pid, "VmHWM")
	t.Logf("statuses %v, router peak RSS %d MiB", counts, peak>>10)
	for _, msg := range failures {
		t.Error(msg)
	}
	if counts[http.StatusOK] == 0 {
		t.Error("no request was accepted")
	}
	if counts[http.StatusServiceUnavailable]+counts[http.StatusTooManyRequests] == 0 {
		t.Error("no request was refused: the budget did not bind")
	}
	if limit := (budget + 150<<20) >> 10; peak > limit {
		t.Errorf("router peak RSS %d KiB exceeds the budget plus 150 MB (%d KiB)", peak, limit)
	}
	// Accepted bodies are released: a request after the flood is served.
	code, _, out, err := chat(t.Context(), f.base, false, "after the flood", 2)
	if err != nil || code != http.StatusOK {
		t.Fatalf("after the flood: %d %v %s", code, err, out)
	}
}

func clipE2E(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}
