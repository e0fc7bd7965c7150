package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBadInput (issue 5, acceptance 4): malformed and hostile requests each
// get the right 4xx in the OpenAI error envelope, a slowloris client is cut
// off within the read timeout while a normal client is served beside it, and
// the server stays up and keeps serving.
func TestBadInput(t *testing.T) {
	const (
		maxBody     = 4096
		maxHeader   = 4096
		readTimeout = 2 * time.Second
	)
	f := startServe(t, "--log-level", "info",
		"--max-body-bytes", fmt.Sprint(maxBody),
		"--max-header-bytes", fmt.Sprint(maxHeader),
		"--client-read-timeout", readTimeout.String())
	_, id := f.startWorker("worker", "--time-scale", "0")
	f.waitWorkers("the worker", 15*time.Second, func(w map[string]string) bool { return w[id] == "active" })

	chatURL := f.base + "/v1/chat/completions"
	complURL := f.base + "/v1/completions"
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name    string
		url     string
		body    string
		headers map[string]string
		status  int
		code    string // "" = any code
	}{
		{"malformed json", chatURL, `{"model":"sim-model",` + msgs, nil, 400, "invalid_json"},
		{"trailing garbage", chatURL, `{"model":"sim-model",` + msgs + `} x`, nil, 400, "invalid_json"},
		{"empty body", chatURL, ``, nil, 400, ""},
		{"not an object", chatURL, `[1,2,3]`, nil, 400, ""},
		{"model not a string", chatURL, `{"model":42,` + msgs + `}`, nil, 400, ""},
		{"stream not a bool", chatURL, `{"model":"sim-model","stream":"yes",` + msgs + `}`, nil, 400, "invalid_field"},
		{"max_tokens not a number", chatURL, `{"model":"sim-model","max_tokens":"ten",` + msgs + `}`, nil, 400, "invalid_field"},
		{"messages not an array", chatURL, `{"model":"sim-model","messages":"hi"}`, nil, 400, "invalid_field"},
		{"missing model", chatURL, `{` + msgs + `}`, nil, 400, "missing_model"},
		{"missing messages", chatURL, `{"model":"sim-model","max_tokens":4}`, nil, 400, ""},
		{"missing prompt", complURL, `{"model":"sim-model","max_tokens":4}`, nil, 400, ""},
		{"unknown model", chatURL, `{"model":"no-such-model",` + msgs + `}`, nil, 404, "model_not_found"},
		{"non-UTF-8 content", chatURL, "{\"model\":\"sim-model\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\xc3\"}]}", nil, 400, ""},
		{"non-UTF-8 model", chatURL, "{\"model\":\"sim-\xffmodel\"," + msgs + "}", nil, 400, ""},
		{"body over the limit", chatURL, `{"model":"sim-model","messages":[{"role":"user","content":"` + strings.Repeat("a", 2*maxBody) + `"}]}`, nil, 413, "request_too_large"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := do(t.Context(), http.MethodPost, tc.url, []byte(tc.body), tc.headers)
			if err != nil {
				t.Fatalf("request failed: %v", err)
			}
			if err := checkEnvelope(res, tc.status, tc.code); err != nil {
				t.Error(err)
			}
		})
	}

	t.Run("huge headers", func(t *testing.T) {
		// A raw connection: the server may close it right after its answer
		// while unread header bytes are still queued, so read at once.
		res, err := rawRequest(f.base, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
			"X-Padding: "+strings.Repeat("p", 2*maxHeader)+"\r\nContent-Length: 2\r\n\r\n{}")
		if err != nil {
			t.Fatalf("huge headers: %v", err)
		}
		if err := checkEnvelope(res, http.StatusRequestHeaderFieldsTooLarge, "headers_too_large"); err != nil {
			t.Error(err)
		}
	})

	t.Run("slowloris", func(t *testing.T) {
		// Slow clients trickle a request one byte at a time, in the headers
		// and in the body; each must be cut off within the read timeout
		// (plus slack for a loaded machine) while a normal client is served.
		slow := []struct{ head, trickle string }{
			{"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", "X-Slow: " + strings.Repeat("s", 500)},
			{"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
				`{"model":"sim-model",` + strings.Repeat(" ", 500)},
		}
		limit := readTimeout + 5*time.Second
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := range 6 {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				if took, err := slowloris(f.base, slow[i%2].head, slow[i%2].trickle, 50*time.Millisecond, limit+5*time.Second); err != nil {
					errs <- fmt.Errorf("slow client %d: %w", i, err)
				} else if took > limit {
					errs <- fmt.Errorf("slow client %d was cut off after %v, want within %v", i, took, limit)
				}
			}(i)
		}
		// A normal client beside them.
		time.Sleep(300 * time.Millisecond) // pacing: the slow clients are connected
		for i := range 4 {
			status, _, body, err := chat(t.Context(), f.base, i%2 == 0, fmt.Sprintf("beside slowloris %d", i), 4)
			if err != nil || status != http.StatusOK {
				t.Errorf("normal request %d beside the slow clients: status %d err %v body %s", i, status, err, body)
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	// The server is still up and serves normal requests, several at once.
	select {
	case <-f.serve.done:
		t.Fatalf("serve exited: %v; log:\n%s", f.serve.exit, f.serve.logText())
	default:
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			status, _, body, err := chat(context.Background(), f.base, i%2 == 0, fmt.Sprintf("after the bad input %d", i), 4)
			if err != nil || status != http.StatusOK {
				t.Errorf("normal request %d after the bad input: status %d err %v body %s", i, status, err, body)
			} else if i%2 == 0 {
				if err := checkStream(body); err != nil {
					t.Errorf("normal stream %d after the bad input: %v", i, err)
				}
			}
		}(i)
	}
	wg.Wait()
	res, err := do(t.Context(), http.MethodGet, f.base+"/health", nil, nil)
	if err != nil || res.status != http.StatusOK {
		t.Errorf("GET /health after the bad input: %v %d", err, res.status)
	}
}

// rawRequest writes a raw HTTP/1.1 request on a fresh connection and parses
// the answer.
func rawRequest(base, request string) (httpResult, error) {
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		return httpResult{}, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, request); err != nil {
		return httpResult{}, fmt.Errorf("write: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return httpResult{}, fmt.Errorf("read the answer: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return httpResult{status: resp.StatusCode, header: resp.Header, body: body}, err
}

// slowloris sends head at once, then trickle one byte every interval, and
// returns how long the server took to close the connection. The server may
// answer (408) before it closes; it must never let the connection live past
// giveUp.
func slowloris(base, head, trickle string, interval, giveUp time.Duration) (time.Duration, error) {
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	began := time.Now()
	if _, err := io.WriteString(conn, head); err != nil {
		return 0, err
	}
	closed := make(chan time.Time, 1)
	go func() {
		// Read until the server closes; an early answer (408) is fine.
		_ = conn.SetReadDeadline(began.Add(giveUp))
		var buf [4096]byte
		for {
			if _, err := conn.Read(buf[:]); err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					closed <- time.Time{}
				} else {
					closed <- time.Now()
				}
				return
			}
		}
	}()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := 0; ; i = (i + 1) % len(trickle) {
		select {
		case at := <-closed:
			if at.IsZero() {
				return giveUp, fmt.Errorf("the server kept the connection open for %v", giveUp)
			}
			return at.Sub(began), nil
		case <-tick.C:
		}
		// Write errors (the server closed) show up on the reading side too.
		_, _ = conn.Write([]byte{trickle[i]})
	}
}
