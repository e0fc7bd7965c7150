package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
)

// gateway sends one request to etcd's JSON gateway over plain HTTP, the
// way Infera's Python workers and servers talk to etcd.
func gateway(t *testing.T, etcd, path string, req, resp any) {
	t.Helper()
	body, _ := json.Marshal(req)
	r, err := http.Post(etcd+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d %s", path, r.StatusCode, b)
	}
	if err := json.Unmarshal(b, resp); err != nil {
		t.Fatalf("POST %s: %v in %s", path, err, b)
	}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// A Python Infera fleet moves over unchanged: its workers' records, exactly
// as they write them, are registered through etcd's JSON gateway (lease
// grant, put with the lease, range) against `infera serve`'s embedded etcd;
// the server routes every routable one to its engine (a simulator), lists
// the others with their reason, skips the planner's key, and logs no
// warning or error for any of it.
func TestPythonFleetInterop(t *testing.T) {
	f := startServe(t)
	var grant struct {
		ID string `json:"ID"`
	}
	gateway(t, f.etcd, "/v3/lease/grant", map[string]any{"TTL": 60}, &grant)
	if grant.ID == "" {
		t.Fatal("no lease id")
	}

	routable := map[string]string{ // golden file → host its engine listens on
		"vllm.json": "127.0.0.1", "sglang-dp4.json": "127.0.0.1", "atom.json": "127.0.0.1",
		"external-dp-rank.json": "127.0.0.1", "ipv6.json": "::1", "no-engine.json": "127.0.0.1", "kv-block.json": "127.0.0.1",
	}
	reasons := map[string]string{"nats.json": "unroutable: nats transport", "dead.json": "unroutable: status dead"}
	models := map[string]string{} // model → unroutable reason ("" = routable)
	for _, name := range append(mapKeys(routable), mapKeys(reasons)...) {
		raw, err := os.ReadFile(filepath.Join("..", "testdata", "infera-python", name))
		if err != nil {
			t.Fatal(err)
		}
		var rec struct {
			ModelName string `json:"model_name"`
		}
		if err := json.Unmarshal(raw, &rec); err != nil {
			t.Fatal(err)
		}
		port := 0
		if host, ok := routable[name]; ok {
			ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
			if err != nil {
				t.Fatal(err)
			}
			port = ln.Addr().(*net.TCPAddr).Port
			ln.Close()
			sim := start(t, "sim-"+rec.ModelName, "sim", "--host", host, "--port", strconv.Itoa(port),
				"--model", rec.ModelName, "--time-scale", "0")
			sim.waitLog("sim listening", 60*time.Second)
		} else {
			port = testkit.FreePort(t) // nothing listens: it must never be dialed
		}
		value := strings.ReplaceAll(string(raw), "{port}", strconv.Itoa(port))
		var id struct {
			WorkerID string `json:"worker_id"`
		}
		_ = json.Unmarshal([]byte(value), &id)
		var put map[string]any
		gateway(t, f.etcd, "/v3/kv/put", map[string]any{"key": b64("/infera/workers/" + id.WorkerID), "value": b64(value), "lease": grant.ID}, &put)
		models[rec.ModelName] = reasons[name]
	}
	planner, err := os.ReadFile(filepath.Join("..", "testdata", "infera-python", "planner-decision.json"))
	if err != nil {
		t.Fatal(err)
	}
	var put map[string]any
	gateway(t, f.etcd, "/v3/kv/put", map[string]any{"key": b64("/infera/workers/planner/decision"), "value": b64(string(planner))}, &put)

	var rng struct {
		Count string `json:"count"`
	}
	gateway(t, f.etcd, "/v3/kv/range", map[string]any{"key": b64("/infera/workers/"), "range_end": b64("/infera/workers0"), "count_only": true}, &rng)
	if want := strconv.Itoa(len(models) + 1); rng.Count != want {
		t.Fatalf("range counts %s keys, want %s", rng.Count, want)
	}

	type listed struct {
		ModelName  string `json:"model_name"`
		Unroutable string `json:"unroutable"`
	}
	var list struct {
		Workers []listed `json:"workers"`
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(f.base + "/v1/workers")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if json.Unmarshal(b, &list) == nil && len(list.Workers) == len(models) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/v1/workers lists %d of %d workers", len(list.Workers), len(models))
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, w := range list.Workers {
		if w.Unroutable != models[w.ModelName] {
			t.Errorf("%s: unroutable %q, want %q", w.ModelName, w.Unroutable, models[w.ModelName])
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for model, reason := range models {
		for i := range 2 {
			body := fmt.Sprintf(`{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":"hello %d"}]}`, model, i)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.base+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Infera-Request-Id", "req-"+model)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			want := http.StatusOK
			if reason != "" {
				want = http.StatusServiceUnavailable
			}
			if resp.StatusCode != want {
				t.Errorf("%s: %d %s, want %d", model, resp.StatusCode, b, want)
			}
			if got := resp.Header.Get("X-Infera-Request-Id"); got != "req-"+model {
				t.Errorf("%s: X-Infera-Request-Id echoed %q", model, got)
			}
		}
	}
	for _, line := range strings.Split(f.serve.logText(), "\n") {
		if strings.Contains(line, `"level":"error"`) || strings.Contains(line, `"level":"warn"`) {
			t.Errorf("serve logged: %s", line)
		}
	}
}

func mapKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
