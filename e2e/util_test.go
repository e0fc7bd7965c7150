package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// enginePID finds the engine child's pid in the worker's log: the supervisor
// tags engine output and its own engine lines with a "pid" field.
func enginePID(t *testing.T, w *proc) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		for _, l := range w.lines {
			if pid, ok := l["pid"].(float64); ok && pid > 0 {
				w.mu.Unlock()
				return int(pid)
			}
		}
		w.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no engine pid in the worker log:\n%s", w.logText())
	return 0
}

// streamWithStart streams a chat completion and sends the serving worker id on
// started once the first event has arrived, then reads the stream to its end.
func streamWithStart(ctx context.Context, base, content string, maxTokens int, started chan<- string) (int, string, string, error) {
	body := fmt.Sprintf(`{"model":"sim-model","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, maxTokens, content)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	worker := resp.Header.Get("X-Infera-Worker")
	var all strings.Builder
	rd := bufio.NewReader(resp.Body)
	signalled := false
	for {
		line, err := rd.ReadString('\n')
		all.WriteString(line)
		if !signalled && strings.HasPrefix(line, "data: ") {
			started <- worker
			signalled = true
		}
		if err == io.EOF {
			return resp.StatusCode, worker, all.String(), nil
		}
		if err != nil {
			return resp.StatusCode, worker, all.String(), err
		}
	}
}
