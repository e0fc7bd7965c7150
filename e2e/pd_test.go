package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
)

// Disaggregated serving end to end (issue 14): `infera serve` and
// `infera worker --engine vllm|sglang` PD workers whose engines are the
// simulator's facades (engines/testdata/shims), on one host with
// --disaggregation-allow-tcp. Each simulated engine records the bodies it
// received (INFERA_RECORD_REQUESTS), so the protocol shapes are asserted
// from what the engines got; a decode verifies the prefill's KV bytes by
// checksum before it decodes (else it answers 500).

// pdProto is one protocol's worker command lines.
type pdProto struct {
	name   string
	engine string
	// args returns the engine arguments of a worker of role.
	args func(t *testing.T, role string) []string
	// env returns the worker's extra environment for role (nil: none).
	env func(t *testing.T, role string) []string
	// completions: the protocol hands off on /v1/completions only (ATOM).
	completions bool
}

var pdProtos = []pdProto{
	{
		name: "vllm-nixl", engine: "vllm",
		args: func(t *testing.T, role string) []string {
			kvRole := map[string]string{"prefill": "kv_producer", "decode": "kv_consumer"}[role]
			return []string{"Qwen/Qwen3-8B", "--host", "127.0.0.1", "--served-model-name", "pd-model",
				"--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"` + kvRole + `"}`}
		},
	},
	{
		name: "vllm-mooncake", engine: "vllm",
		args: func(t *testing.T, role string) []string {
			kvRole := map[string]string{"prefill": "kv_producer", "decode": "kv_consumer"}[role]
			return []string{"Qwen/Qwen3-8B", "--host", "127.0.0.1", "--served-model-name", "pd-model",
				"--kv-transfer-config", `{"kv_connector":"MooncakeConnector","kv_role":"` + kvRole + `"}`}
		},
		env: func(t *testing.T, role string) []string {
			// The prefill's bootstrap server, as both the worker (its
			// record) and the engine read it.
			return []string{"VLLM_MOONCAKE_BOOTSTRAP_PORT=" + strconv.Itoa(testkit.FreePort(t))}
		},
	},
	moriProto("vllm-mori-read", true),
	moriProto("vllm-mori-write", false),
	{
		name: "sglang-bootstrap", engine: "sglang",
		args: func(t *testing.T, role string) []string {
			a := []string{"--model-path", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--served-model-name", "pd-model",
				"--disaggregation-mode", role}
			if role == "prefill" {
				a = append(a, "--disaggregation-bootstrap-port", strconv.Itoa(testkit.FreePort(t)))
			}
			return a
		},
	},
}

// moriProto is vLLM's MoRIIO connector in read or write mode, on free
// handshake and notify ports.
func moriProto(name string, read bool) pdProto {
	return pdProto{name: name, engine: "vllm", args: func(t *testing.T, role string) []string {
		kvRole := map[string]string{"prefill": "kv_producer", "decode": "kv_consumer"}[role]
		return []string{"Qwen/Qwen3-8B", "--host", "127.0.0.1", "--served-model-name", "pd-model",
			"--kv-transfer-config", fmt.Sprintf(`{"kv_connector":"MoRIIOConnector","kv_role":%q,"kv_connector_extra_config":{"handshake_port":%d,"notify_port":%d,"read_mode":%t}}`,
				kvRole, testkit.FreePort(t), testkit.FreePort(t), read)}
	}}
}

// atomProto is ATOM's mooncake connector (serial, completions only).
var atomProto = pdProto{name: "atom-mooncake", engine: "atom", completions: true, args: func(t *testing.T, role string) []string {
	kvRole := map[string]string{"prefill": "kv_producer", "decode": "kv_consumer"}[role]
	return []string{"--model", "deepseek-ai/DeepSeek-R1", "--host", "127.0.0.1", "--served-model-name", "pd-model",
		"--kv-transfer-config", fmt.Sprintf(`{"kv_connector":"mooncake","kv_role":%q,"handshake_port":%d}`, kvRole, testkit.FreePort(t))}
}}

// pdWorker is one PD worker process and what its engine recorded.
type pdWorker struct {
	p   *proc
	id  string
	log string
}

// startPDWorker starts a worker of role for proto; env adds INFERA_* sim
// settings (fault injection).
func (f *fleet) startPDWorker(t *testing.T, proto pdProto, role, name string, env ...string) *pdWorker {
	t.Helper()
	return f.startPDWorkerFlags(t, proto, role, name, nil, env...)
}

// startPDWorkerFlags is startPDWorker with extra worker flags.
func (f *fleet) startPDWorkerFlags(t *testing.T, proto pdProto, role, name string, flags []string, env ...string) *pdWorker {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".jsonl")
	e := append(shimEnv(t), "INFERA_RECORD_REQUESTS="+logPath, "INFERA_TIME_SCALE=0.05", "INFERA_PD_KV_TIMEOUT=20s")
	if proto.env != nil {
		e = append(e, proto.env(t, role)...)
	}
	e = append(e, env...)
	args := []string{"worker", "--engine", proto.engine, "--etcd-endpoints", f.etcd,
		"--advertise-host", "127.0.0.1", "--lease-ttl", "5s", "--keepalive-interval", "1s",
		"--drain-timeout", "10s", "--stop-grace", "5s", "--disaggregation-allow-tcp"}
	args = append(append(append(args, flags...), "--"), proto.args(t, role)...)
	p := startEnv(t, name, e, args...)
	id, _ := p.waitLog("worker registered", 60*time.Second)["worker_id"].(string)
	if id == "" {
		t.Fatalf("%s: no worker_id", name)
	}
	f.waitWorkers(name+" listed", 10*time.Second, func(ws map[string]string) bool { return ws[id] == "active" })
	return &pdWorker{p: p, id: id, log: logPath}
}

type pdGot struct {
	RequestID   string         `json:"request_id"`
	Traceparent string         `json:"traceparent"`
	Body        map[string]any `json:"body"`
}

func (w *pdWorker) got(t *testing.T) []pdGot {
	t.Helper()
	data, err := os.ReadFile(w.log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []pdGot
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		var g pdGot
		if err := json.Unmarshal([]byte(line), &g); err != nil {
			t.Fatalf("%s: %q: %v", w.log, line, err)
		}
		out = append(out, g)
	}
	return out
}

// pdDo sends one chat request (stream or not) with a deadline and returns
// the status, the prefill and decode headers and the answer text (or the
// stream's data lines joined).
func pdDo(t *testing.T, f *fleet, content string, stream bool, maxTokens int) (int, string, string, string) {
	t.Helper()
	status, ph, dh, body, err := pdSend(t.Context(), f, content, stream, maxTokens)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	return status, ph, dh, body
}

// pdDoProto is pdDo on the route proto hands off on: chat, or
// completions for ATOM.
func pdDoProto(t *testing.T, f *fleet, proto pdProto, content string, stream bool, maxTokens int) (int, string, string, string) {
	t.Helper()
	status, ph, dh, body, err := pdSendRoute(t.Context(), f, proto.completions, content, stream, maxTokens)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	return status, ph, dh, body
}

// pdSend is pdDo without the test (safe on any goroutine).
func pdSend(parent context.Context, f *fleet, content string, stream bool, maxTokens int) (int, string, string, string, error) {
	return pdSendRoute(parent, f, false, content, stream, maxTokens)
}

// pdSendRoute is pdSend on /v1/completions when completions is set.
func pdSendRoute(parent context.Context, f *fleet, completions bool, content string, stream bool, maxTokens int) (int, string, string, string, error) {
	ctx, cancel := context.WithTimeout(parent, 30*time.Second)
	defer cancel()
	path := "/v1/chat/completions"
	body := fmt.Sprintf(`{"model":"pd-model","max_tokens":%d,"stream":%t,"messages":[{"role":"user","content":%q}]}`, maxTokens, stream, content)
	if completions {
		path = "/v1/completions"
		body = fmt.Sprintf(`{"model":"pd-model","max_tokens":%d,"stream":%t,"prompt":%q}`, maxTokens, stream, content)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Infera-Prefill-Worker"), resp.Header.Get("X-Infera-Worker"), string(b), err
}

// checkLegs asserts that the last request d received and its prefill leg
// (the request of the same X-Request-Id on one of ps) have the protocol's
// shape. stream is the client's stream flag, or nil when not to check it.
func checkLegs(t *testing.T, proto string, ps []*pdWorker, d *pdWorker, stream any) {
	t.Helper()
	dg := d.got(t)
	if len(dg) == 0 {
		t.Fatalf("decode %s got no request", d.id)
	}
	last := dg[len(dg)-1]
	var pb map[string]any
	for _, p := range ps {
		for _, g := range p.got(t) {
			if g.RequestID == last.RequestID {
				pb = g.Body
			}
		}
	}
	if pb == nil {
		t.Fatalf("no prefill got request %q", last.RequestID)
	}
	db := last.Body
	switch proto {
	case "vllm-nixl":
		kv, _ := pb["kv_transfer_params"].(map[string]any)
		if pb["max_tokens"] != 1.0 || pb["stream"] != false || kv["do_remote_decode"] != true || kv["remote_engine_id"] != nil {
			t.Errorf("nixl prefill body %v", pb)
		}
		dkv, _ := db["kv_transfer_params"].(map[string]any)
		if dkv["do_remote_prefill"] != true || dkv["remote_request_id"] == nil || dkv["remote_port"] == nil || (stream != nil && db["stream"] != stream) {
			t.Errorf("nixl decode body %v", db)
		}
	case "vllm-mooncake":
		pkv, _ := pb["kv_transfer_params"].(map[string]any)
		dkv, _ := db["kv_transfer_params"].(map[string]any)
		if pb["max_tokens"] != 1.0 || pb["stream"] != false || pkv["transfer_id"] == nil || pkv["transfer_id"] != dkv["transfer_id"] ||
			dkv["remote_bootstrap_addr"] == nil || dkv["remote_engine_id"] == nil || (stream != nil && db["stream"] != stream) {
			t.Errorf("mooncake bodies %v / %v", pb, db)
		}
	case "vllm-mori-read", "vllm-mori-write":
		pkv, _ := pb["kv_transfer_params"].(map[string]any)
		dkv, _ := db["kv_transfer_params"].(map[string]any)
		if pb["max_tokens"] != 1.0 || pkv["transfer_id"] == nil || pkv["transfer_id"] != dkv["transfer_id"] ||
			!strings.HasPrefix(last.RequestID, "___prefill_addr_host:127.0.0.1,handshake:") || (stream != nil && db["stream"] != stream) {
			t.Errorf("MoRIIO bodies %v / %v (request id %q)", pb, db, last.RequestID)
		}
	case "atom-mooncake":
		pkv, _ := pb["kv_transfer_params"].(map[string]any)
		dkv, _ := db["kv_transfer_params"].(map[string]any)
		if pb["max_tokens"] != 1.0 || pb["stream"] != false || pkv["do_remote_decode"] != true || pkv["remote_host"] != "127.0.0.1" ||
			pkv["remote_handshake_port"] == nil || pkv["remote_port"] == nil {
			t.Errorf("ATOM prefill body %v", pb)
		}
		if dkv["transfer_id"] == nil || dkv["remote_handshake_port"] == nil || dkv["remote_dp_size"] == nil || dkv["remote_tp_size"] == nil ||
			db["max_tokens"] == 1.0 || (stream != nil && db["stream"] != stream) {
			t.Errorf("ATOM decode body %v", db)
		}
	case "sglang-bootstrap":
		if pb["bootstrap_room"] == nil || pb["bootstrap_room"] != db["bootstrap_room"] || pb["bootstrap_host"] != "127.0.0.1" ||
			pb["bootstrap_port"] != db["bootstrap_port"] || pb["stream"] != db["stream"] || (stream != nil && db["stream"] != stream) {
			t.Errorf("sglang bodies %v / %v", pb, db)
		}
	}
}

// checkVerified asserts that decode d verified the prefill's KV bytes
// (checksum) for every request it received: its simulator counts a
// transfer only after the check passed, and refuses to decode otherwise.
func checkVerified(t *testing.T, d *pdWorker) {
	t.Helper()
	resp, err := http.Get("http://" + d.id + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if got, want := metricValue(string(b), "infera_sim_kv_transfers_total"), len(d.got(t)); got != float64(want) || want == 0 {
		t.Errorf("decode %s verified %v KV transfers, got %d requests", d.id, got, want)
	}
}

// TestPDEnginesEndToEnd: acceptance 1 for every protocol (ATOM's on
// completions), through the engines' worker shims: 1P1D, 1P2D and 2P1D,
// unary and streaming, both legs' bodies as the engines received them,
// every decode's KV verified.
func TestPDEnginesEndToEnd(t *testing.T) {
	for _, proto := range append(slices.Clone(pdProtos), atomProto) {
		t.Run(proto.name, func(t *testing.T) {
			f := startServe(t)
			p1 := f.startPDWorker(t, proto, "prefill", proto.engine+"-p1")
			d1 := f.startPDWorker(t, proto, "decode", proto.engine+"-d1")
			pdDo := func(t *testing.T, f *fleet, content string, stream bool, maxTokens int) (int, string, string, string) {
				t.Helper()
				return pdDoProto(t, f, proto, content, stream, maxTokens)
			}

			// 1P1D, unary and streaming.
			status, ph, dh, body := pdDo(t, f, "explain disaggregated prefill and decode", false, 6)
			wantTokens := `"completion_tokens":6`
			if proto.name == "vllm-mooncake" || strings.HasPrefix(proto.name, "vllm-mori") {
				wantTokens = `"completion_tokens":5` // the decode leg's max_tokens is decremented
			}
			if status != 200 || ph != p1.id || dh != d1.id || !strings.Contains(body, wantTokens) {
				t.Fatalf("1P1D unary: %d via %s/%s: %s", status, ph, dh, body)
			}
			checkLegs(t, proto.name, []*pdWorker{p1}, d1, false)
			status, _, _, body = pdDo(t, f, "explain disaggregated prefill and decode", true, 6)
			if status != 200 || !strings.HasSuffix(strings.TrimSpace(body), "data: [DONE]") || strings.Contains(body, `"error"`) {
				t.Fatalf("1P1D stream: %d %s", status, body)
			}
			checkLegs(t, proto.name, []*pdWorker{p1}, d1, true)
			checkVerified(t, d1)

			// 1P2D: both decodes serve, each verifying the one prefill's KV.
			d2 := f.startPDWorker(t, proto, "decode", proto.engine+"-d2")
			seen := map[string]bool{}
			for i := range 6 {
				stream := i%2 == 1
				status, ph, dh, body := pdDo(t, f, fmt.Sprintf("question %d about kv transfer", i), stream, 4)
				if status != 200 || ph != p1.id || strings.Contains(body, `"error"`) {
					t.Fatalf("1P2D %d: %d via %s/%s: %s", i, status, ph, dh, body)
				}
				seen[dh] = true
				dw := d1
				if dh == d2.id {
					dw = d2
				}
				checkLegs(t, proto.name, []*pdWorker{p1}, dw, stream)
			}
			if !seen[d1.id] || !seen[d2.id] {
				t.Errorf("1P2D decodes used %v, want both", seen)
			}
			checkVerified(t, d1)
			checkVerified(t, d2)

			// 2P1D.
			d2.p.signal(syscall.SIGTERM)
			f.waitWorkers("d2 gone", 20*time.Second, func(ws map[string]string) bool { _, ok := ws[d2.id]; return !ok })
			p2 := f.startPDWorker(t, proto, "prefill", proto.engine+"-p2")
			seen = map[string]bool{}
			for i := range 6 {
				stream := i%2 == 0
				status, ph, dh, body := pdDo(t, f, fmt.Sprintf("another question %d", i), stream, 4)
				if status != 200 || dh != d1.id || strings.Contains(body, `"error"`) {
					t.Fatalf("2P1D %d: %d via %s/%s: %s", i, status, ph, dh, body)
				}
				seen[ph] = true
				checkLegs(t, proto.name, []*pdWorker{p1, p2}, d1, stream)
			}
			if !seen[p1.id] || !seen[p2.id] {
				t.Errorf("2P1D prefills used %v, want both", seen)
			}
			checkVerified(t, d1)
		})
	}
}

// TestPDFailuresEndToEnd: acceptance 2 with real processes; every request
// has a deadline well under the timeouts involved.
func TestPDFailuresEndToEnd(t *testing.T) {
	for _, proto := range append(slices.Clone(pdProtos), atomProto) {
		t.Run(proto.name, func(t *testing.T) {
			f := startServe(t, "--pd-prefill-timeout", "20s", "--request-max-retries", "0")
			pdDo := func(t *testing.T, f *fleet, content string, stream bool, maxTokens int) (int, string, string, string) {
				t.Helper()
				return pdDoProto(t, f, proto, content, stream, maxTokens)
			}
			// Half a pool.
			d := f.startPDWorker(t, proto, "decode", proto.engine+"-d")
			status, _, _, body := pdDo(t, f, "hello", false, 4)
			if status != 503 || !strings.Contains(body, "no_prefill_worker") {
				t.Fatalf("half a pool: %d %s", status, body)
			}

			// The prefill engine is killed while it holds the request.
			p := f.startPDWorker(t, proto, "prefill", proto.engine+"-hang", "INFERA_HANG_BEFORE_FIRST_TOKEN=1")
			done := make(chan struct{})
			var st int
			var b string
			var serr error
			start := time.Now()
			go func() {
				defer close(done)
				st, _, _, b, serr = pdSendRoute(context.Background(), f, proto.completions, "a request whose prefill dies", false, 4)
			}()
			deadline := time.Now().Add(10 * time.Second)
			for len(p.got(t)) == 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if err := syscall.Kill(enginePID(t, p.p), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				t.Fatal("client still waiting 15s after the prefill engine died")
			}
			if serr != nil || st < 500 || !strings.Contains(b, "prefill") {
				t.Errorf("prefill killed: %d %s, want a 5xx naming the prefill", st, b)
			}
			if el := time.Since(start); el > 15*time.Second {
				t.Errorf("error after %v", el)
			}
			f.waitWorkers("the dead prefill to go", 10*time.Second, func(ws map[string]string) bool { _, ok := ws[p.id]; return !ok })
			_ = p.p.wait(20 * time.Second)

			// The decode engine dies mid-stream: an in-stream error event.
			p = f.startPDWorker(t, proto, "prefill", proto.engine+"-p")
			d.p.signal(syscall.SIGTERM)
			f.waitWorkers("the decode to go", 20*time.Second, func(ws map[string]string) bool { _, ok := ws[d.id]; return !ok })
			dd := f.startPDWorker(t, proto, "decode", proto.engine+"-dies", "INFERA_DIE_AFTER_TOKENS=3")
			status, _, _, body = pdDo(t, f, "a stream whose decode dies", true, 12)
			if status != 200 || !strings.Contains(body, `"error"`) {
				t.Errorf("decode died mid-stream: %d %s, want 200 with an error event", status, body)
			}
			f.waitWorkers("the dead decode to go", 10*time.Second, func(ws map[string]string) bool { _, ok := ws[dd.id]; return !ok })

			// A client that leaves cancels both legs: running counts drop.
			slow := f.startPDWorker(t, proto, "decode", proto.engine+"-slow", "INFERA_DECODE_MS_PER_TOKEN=200", "INFERA_TIME_SCALE=1")
			path, long := "/v1/chat/completions", `{"model":"pd-model","max_tokens":200,"stream":%t,"messages":[{"role":"user","content":"a long answer please"}]}`
			if proto.completions {
				path, long = "/v1/completions", `{"model":"pd-model","max_tokens":200,"stream":%t,"prompt":"a long answer please"}`
			}
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.base+path, strings.NewReader(fmt.Sprintf(long, true)))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(resp.Body)
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("stream ended before its first token: %v", err)
				}
				if strings.HasPrefix(line, "data: ") {
					break
				}
			}
			if n := running(t, slow.id); n != 1 {
				t.Errorf("decode running %v mid-stream, want 1", n)
			}
			cancel()
			resp.Body.Close()
			waitIdle := func(what string) {
				t.Helper()
				deadline := time.Now().Add(10 * time.Second)
				for running(t, slow.id) != 0 || running(t, p.id) != 0 {
					if time.Now().After(deadline) {
						t.Fatalf("%s: running counts decode %v prefill %v 10s after the client left", what, running(t, slow.id), running(t, p.id))
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			waitIdle("stream")

			// The same for a unary request: its client watch aborts both legs.
			ctx, cancel = context.WithTimeout(t.Context(), 20*time.Second)
			req, _ = http.NewRequestWithContext(ctx, http.MethodPost, f.base+path, strings.NewReader(fmt.Sprintf(long, false)))
			req.Header.Set("Content-Type", "application/json")
			left := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				left <- err
			}()
			deadline = time.Now().Add(10 * time.Second)
			for running(t, slow.id) != 1 {
				if time.Now().After(deadline) {
					cancel()
					t.Fatalf("unary: decode running %v, want 1", running(t, slow.id))
				}
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
			if err := <-left; err == nil {
				t.Error("unary: the request answered, want it cancelled")
			}
			waitIdle("unary")
		})
	}
}

// running reads an engine's running-requests gauge (vLLM or SGLang name).
func running(t *testing.T, id string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + id + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "vllm:num_requests_running") || strings.HasPrefix(line, "sglang:num_running_reqs") {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			return v
		}
	}
	t.Fatalf("%s /metrics has no running gauge", id)
	return 0
}

// TestPDKVAwareEndToEnd: acceptance 3 (--pd-min-uncached-tokens) and 5
// (repeated prefixes land on the prefill worker that has them).
func TestPDKVAwareEndToEnd(t *testing.T) {
	proto := pdProtos[0]
	f := startServe(t, "--router-policy", "kv-aware", "--tokenizer", "bytes", "--pd-min-uncached-tokens", "128")
	p1 := f.startPDWorker(t, proto, "prefill", "kv-p1")
	p2 := f.startPDWorker(t, proto, "prefill", "kv-p2")
	d := f.startPDWorker(t, proto, "decode", "kv-d")

	status, ph, dh, body := pdDo(t, f, "short", false, 3)
	if status != 200 || ph != "" || dh != d.id {
		t.Fatalf("short prompt: %d via %q/%q: %s", status, ph, dh, body)
	}
	if len(p1.got(t))+len(p2.got(t)) != 0 {
		t.Fatal("a short prompt reached a prefill worker")
	}
	long := strings.Repeat("The shared system prompt of this application, long enough to matter. ", 12)
	status, first, _, body := pdDo(t, f, long+"first question: "+strings.Repeat("detail ", 30), false, 3)
	if status != 200 || first == "" {
		t.Fatalf("long prompt: %d via prefill %q: %s", status, first, body)
	}
	for i := range 5 {
		// The KV events of the first prefill reach the router; the same
		// prefix then goes to the same prefill worker.
		time.Sleep(200 * time.Millisecond)
		// Each follow-up's own part is long enough to disaggregate.
		status, ph, _, body := pdDo(t, f, long+fmt.Sprintf("follow-up %d: ", i)+strings.Repeat(fmt.Sprintf("detail %d ", i), 24), i%2 == 0, 3)
		if status != 200 || ph != first {
			t.Fatalf("follow-up %d: %d via prefill %q, want %q: %s", i, status, ph, first, body)
		}
	}
}

// TestPDSimEngineEndToEnd: `infera worker --engine sim` in PD roles
// registers them (bootstrap address, engine id) so that pairs serve.
func TestPDSimEngineEndToEnd(t *testing.T) {
	for _, proto := range []string{"vllm-nixl", "vllm-mooncake", "sglang-bootstrap"} {
		t.Run(proto, func(t *testing.T) {
			f := startServe(t)
			ids := map[string]string{}
			for _, role := range []string{"prefill", "decode"} {
				p := start(t, "sim-"+role, "worker", "--engine", "sim", "--etcd-endpoints", f.etcd,
					"--lease-ttl", "5s", "--keepalive-interval", "1s", "--drain-timeout", "10s", "--stop-grace", "5s",
					"--disaggregation-allow-tcp", "--", "--model", "pd-model", "--time-scale", "0.05",
					"--pd-role", role, "--pd-protocol", proto)
				id, _ := p.waitLog("worker registered", 60*time.Second)["worker_id"].(string)
				rec := fullRecord{}
				f.waitWorkers(role+" record", 10*time.Second, func(map[string]string) bool {
					var ok bool
					rec, ok = f.record(id)
					return ok
				})
				if rec.DisaggMode != role || rec.DisaggMeta.Protocol != proto {
					t.Fatalf("%s record %+v", role, rec)
				}
				ids[role] = id
			}
			for _, stream := range []bool{false, true} {
				status, ph, dh, body := pdDo(t, f, "a question for a simulated pair", stream, 4)
				if status != 200 || ph != ids["prefill"] || dh != ids["decode"] || strings.Contains(body, `"error"`) {
					t.Fatalf("stream %v: %d via %s/%s: %s", stream, status, ph, dh, body)
				}
			}
		})
	}
}

// TestPDATOMEndToEnd: atom-mooncake through `infera worker --engine atom`
// (serial, completions only: a chat request has no hand-off → 502); its
// 1P2D and 2P1D run in TestPDEnginesEndToEnd.
func TestPDATOMEndToEnd(t *testing.T) {
	proto := atomProto
	f := startServe(t)
	p := f.startPDWorker(t, proto, "prefill", "atom-p")
	d := f.startPDWorker(t, proto, "decode", "atom-d")
	for _, stream := range []bool{false, true} {
		body := fmt.Sprintf(`{"model":"pd-model","max_tokens":5,"stream":%t,"prompt":"an ATOM prompt to prefill remotely"}`, stream)
		resp, err := http.Post(f.base+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Prefill-Worker") != p.id || resp.Header.Get("X-Infera-Worker") != d.id || strings.Contains(string(b), `"error"`) {
			t.Fatalf("stream %v: %d %s", stream, resp.StatusCode, b)
		}
		dg := d.got(t)
		kv, _ := dg[len(dg)-1].Body["kv_transfer_params"].(map[string]any)
		if kv["transfer_id"] == nil || kv["remote_handshake_port"] == nil || dg[len(dg)-1].Body["max_tokens"] != 5.0 {
			t.Errorf("decode body %v", dg[len(dg)-1].Body)
		}
	}
	status, _, _, body := pdDo(t, f, "chat is not handed off by ATOM", false, 4)
	if status != 502 || !strings.Contains(body, "kv_transfer_params") {
		t.Errorf("chat: %d %s, want 502 naming the missing hand-off", status, body)
	}
}

// TestPDSGLangDPEndToEnd: an SGLang prefill with --dp-size 2 (one worker,
// two ranks, KV kept per rank by the simulator): every request pins a
// prefill rank, the bootstrap room both legs get is congruent to it
// (room % dp_size = rank), and the decode is told that rank.
func TestPDSGLangDPEndToEnd(t *testing.T) {
	proto := pdProtos[len(pdProtos)-1]
	if proto.name != "sglang-bootstrap" {
		t.Fatalf("last protocol %s", proto.name)
	}
	dp := proto
	dp.args = func(t *testing.T, role string) []string {
		a := proto.args(t, role)
		if role == "prefill" {
			a = append(a, "--dp-size", "2", "--enable-dp-attention")
		}
		return a
	}
	f := startServe(t)
	p := f.startPDWorker(t, dp, "prefill", "sglang-dp-p")
	d := f.startPDWorker(t, dp, "decode", "sglang-dp-d")
	if rec, _ := f.record(p.id); rec.DPSize != 2 {
		t.Fatalf("prefill record dp_size %d, want 2", rec.DPSize)
	}
	for i := range 6 {
		if status, _, _, body := pdDo(t, f, fmt.Sprintf("dp question %d", i), i%2 == 0, 3); status != 200 {
			t.Fatalf("request %d: %d %s", i, status, body)
		}
	}
	data, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatal(err)
	}
	ranks := map[string]bool{}
	rankOf := map[string]string{} // by X-Request-Id
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var g struct {
			RequestID string `json:"request_id"`
			DPRank    string `json:"dp_rank"`
			Body      struct {
				Room json.Number `json:"bootstrap_room"`
			} `json:"body"`
		}
		dec := json.NewDecoder(strings.NewReader(line))
		dec.UseNumber()
		if err := dec.Decode(&g); err != nil {
			t.Fatal(err)
		}
		room, err := strconv.ParseUint(g.Body.Room.String(), 10, 64)
		if err != nil || g.DPRank == "" || strconv.FormatUint(room%2, 10) != g.DPRank {
			t.Errorf("prefill room %s with X-Data-Parallel-Rank %q: want room %% 2 = rank", g.Body.Room, g.DPRank)
		}
		ranks[g.DPRank] = true
		rankOf[g.RequestID] = g.DPRank
	}
	if len(ranks) != 2 {
		t.Errorf("prefill ranks used %v, want both", ranks)
	}
	// The decode was told the rank the prefill ran on; its simulator
	// fetches the KV from that rank only (and the prefill refused rooms
	// not congruent to its rank), so every verified transfer shows the
	// alignment held.
	dg := d.got(t)
	if len(dg) != 6 {
		t.Fatalf("decode got %d requests, want 6", len(dg))
	}
	for _, g := range dg {
		r, ok := g.Body["disagg_prefill_dp_rank"].(float64)
		if want := rankOf[g.RequestID]; !ok || want == "" || strconv.Itoa(int(r)) != want {
			t.Errorf("decode request %s: disagg_prefill_dp_rank %v, want the prefill's rank %q", g.RequestID, g.Body["disagg_prefill_dp_rank"], want)
		}
	}
	checkVerified(t, d)
}

// TestPDMismatchEndToEnd: a vLLM Nixl prefill and an SGLang decode of one
// model cannot pair: a clear 500 naming both protocols, no leg sent.
func TestPDMismatchEndToEnd(t *testing.T) {
	f := startServe(t)
	p := f.startPDWorker(t, pdProtos[0], "prefill", "nixl-p")
	d := f.startPDWorker(t, pdProtos[len(pdProtos)-1], "decode", "sglang-d")
	status, _, _, body := pdDo(t, f, "who pairs with whom", false, 3)
	if status != 500 || !strings.Contains(body, "pd_protocol_error") || !strings.Contains(body, `\"vllm-nixl\"`) || !strings.Contains(body, `\"sglang-bootstrap\"`) {
		t.Fatalf("%d %s, want 500 naming both protocols", status, body)
	}
	if len(p.got(t))+len(d.got(t)) != 0 {
		t.Error("a leg was sent to mismatched workers")
	}
}
