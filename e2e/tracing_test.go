package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
)

// Issue 35, acceptance 3: a disaggregated request's trace in a real trace
// store. `infera serve --otlp-traces-endpoint` exports to Jaeger (built from
// the Go module proxy by scripts/jaeger.sh, its in-memory store), and the
// stored trace is read back through Jaeger's query API: the request span,
// admission and pick per leg, the prefill and decode legs, the KV hand-off;
// each engine recorded the traceparent naming its leg's span.

// jaegerBinary returns the cached Jaeger, building it when absent.
func jaegerBinary(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("bash", filepath.Join("..", "scripts", "jaeger.sh")).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("scripts/jaeger.sh: %v\n%s", err, stderr)
	}
	return strings.TrimSpace(string(out))
}

// startJaeger runs Jaeger with an in-memory store, OTLP/gRPC in and the query
// API on free ports; it returns both endpoints.
func startJaeger(t *testing.T) (otlp, query string) {
	t.Helper()
	bin := jaegerBinary(t)
	otlp = fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	query = fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	cfg := fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: %s
    grpc:
      endpoint: 127.0.0.1:%d
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`, query, testkit.FreePort(t), otlp)
	path := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startBinary(t, bin, "jaeger", cleanEnv(), "--config", path)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + query + "/api/services")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("jaeger's query API did not answer within 60 s:\n%s", p.logText())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return otlp, query
}

// jaegerTrace is what GET /api/traces/{id} returns of one trace.
type jaegerTrace struct {
	Data []struct {
		TraceID string `json:"traceID"`
		Spans   []struct {
			SpanID        string `json:"spanID"`
			OperationName string `json:"operationName"`
			References    []struct {
				RefType string `json:"refType"`
				SpanID  string `json:"spanID"`
			} `json:"references"`
			Tags []struct {
				Key   string `json:"key"`
				Value any    `json:"value"`
			} `json:"tags"`
		} `json:"spans"`
	} `json:"data"`
}

func TestTracingPDJaeger(t *testing.T) {
	otlp, query := startJaeger(t)
	f := startServe(t, "--otlp-traces-endpoint", "http://"+otlp, "--otlp-traces-sample-ratio", "1")
	proto := pdProtos[0] // vllm-nixl: serial, the hand-off in the prefill's answer
	pre := f.startPDWorker(t, proto, "prefill", "trace-prefill")
	dec := f.startPDWorker(t, proto, "decode", "trace-decode")
	status, ph, dh, _ := pdDo(t, f, "trace this disaggregated request", true, 8)
	if status != 200 || ph != pre.id || dh != dec.id {
		t.Fatalf("status %d, prefill %q decode %q", status, ph, dh)
	}
	pg, dg := pre.got(t), dec.got(t)
	if len(pg) != 1 || len(dg) != 1 {
		t.Fatalf("engines got %d and %d requests", len(pg), len(dg))
	}
	// traceparent: 00-TRACE-SPAN-01
	parts := strings.Split(dg[0].Traceparent, "-")
	pparts := strings.Split(pg[0].Traceparent, "-")
	if len(parts) != 4 || len(pparts) != 4 || parts[1] != pparts[1] || parts[3] != "01" {
		t.Fatalf("traceparents: prefill %q, decode %q", pg[0].Traceparent, dg[0].Traceparent)
	}
	traceID := parts[1]

	var tr jaegerTrace
	want := []string{"POST /v1/chat/completions", "admission", "admission", "pick", "pick", "leg", "leg", "pd.kv_handoff"}
	deadline := time.Now().Add(30 * time.Second)
	for {
		tr = jaegerTrace{}
		resp, err := http.Get("http://" + query + "/api/traces/" + traceID)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			_ = json.Unmarshal(b, &tr)
		}
		if len(tr.Data) == 1 && len(tr.Data[0].Spans) >= len(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("trace %s not stored in jaeger within 30 s: %+v", traceID, tr)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ops := map[string]int{}
	legs := map[string]map[string]any{} // span id → tags
	var rootID string
	for _, s := range tr.Data[0].Spans {
		ops[s.OperationName]++
		tags := map[string]any{}
		for _, tg := range s.Tags {
			tags[tg.Key] = tg.Value
		}
		switch s.OperationName {
		case "leg":
			legs[s.SpanID] = tags
		case "POST /v1/chat/completions":
			rootID = s.SpanID
			if len(s.References) != 0 || tags["infera.pd"] != true || tags["gen_ai.request.model"] != "pd-model" {
				t.Errorf("request span %+v", s)
			}
		case "pick":
			if tags["infera.policy"] == nil || tags["infera.worker_id"] == nil {
				t.Errorf("pick span %+v", s)
			}
		}
	}
	for _, name := range want {
		if ops[name] == 0 {
			t.Fatalf("span %q missing from the stored trace: %v", name, ops)
		}
	}
	if ops["leg"] != 2 || ops["admission"] != 2 || ops["pick"] != 2 || rootID == "" {
		t.Fatalf("stored spans %v", ops)
	}
	for role, got := range map[string]pdGot{"prefill": pg[0], "decode": dg[0]} {
		id := strings.Split(got.Traceparent, "-")[2]
		tags, ok := legs[id]
		if !ok || tags["infera.leg.role"] != role || tags["infera.pd.protocol"] != proto.name || tags["infera.leg.transport"] != "http" {
			t.Fatalf("%s engine's traceparent names span %s: %v (legs %v)", role, id, tags, legs)
		}
	}
	t.Logf("trace %s stored with spans %v", traceID, ops)
	for _, w := range []*pdWorker{pre, dec} {
		w.p.stop(syscall.SIGTERM)
	}
	f.serve.stop(syscall.SIGTERM)
}
