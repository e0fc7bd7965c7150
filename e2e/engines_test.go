package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fullRecord is a worker record as GET /v1/workers lists it.
type fullRecord struct {
	WorkerID   string `json:"worker_id"`
	URL        string `json:"url"`
	ModelName  string `json:"model_name"`
	Engine     string `json:"engine"`
	DisaggMode string `json:"disagg_mode"`
	DisaggMeta struct {
		Protocol string         `json:"protocol"`
		Params   map[string]any `json:"params"`
	} `json:"disagg_meta"`
	KVEventsEndpoint *string `json:"kv_events_endpoint"`
	KVBlockSize      *int    `json:"kv_block_size"`
	DPRank           *int    `json:"dp_rank"`
	DPSize           int     `json:"dp_size"`
	Status           string  `json:"status"`
}

func (f *fleet) record(id string) (fullRecord, bool) {
	resp, err := http.Get(f.base + "/v1/workers")
	if err != nil {
		return fullRecord{}, false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var list struct {
		Workers []fullRecord `json:"workers"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return fullRecord{}, false
	}
	for _, r := range list.Workers {
		if r.WorkerID == id {
			return r, true
		}
	}
	return fullRecord{}, false
}

// shimEnv puts the engine shims (vllm, python, python3 that run the
// simulator's facades) first on PATH.
func shimEnv(t *testing.T) []string {
	t.Helper()
	shims, err := filepath.Abs(filepath.Join("..", "engines", "testdata", "shims"))
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"INFERA_SIM_BIN=" + binary}
	for _, kv := range cleanEnv() {
		if path, ok := strings.CutPrefix(kv, "PATH="); ok {
			kv = "PATH=" + shims + string(os.PathListSeparator) + path
		}
		env = append(env, kv)
	}
	return env
}

// TestRealEngineWorkers runs `infera worker --engine vllm|sglang|atom` with
// the engines' own command lines against shims named like the engines (they
// run the simulator's facades), and checks the registered record, routing
// through `infera serve`, drain on SIGTERM and deregistration on engine death.
func TestRealEngineWorkers(t *testing.T) {
	cases := []struct {
		name   string
		engine string
		args   []string
		// pd: a prefill/decode worker, which the router does not route
		// mixed traffic to; its record is checked, then it is drained.
		pd    bool
		check func(t *testing.T, r fullRecord)
	}{
		{
			name:   "vllm",
			engine: "vllm",
			args: []string{"Qwen/Qwen3-8B", "--host", "127.0.0.1", "--served-model-name", "qwen3-vllm",
				"--block-size", "32", "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.9"},
			check: func(t *testing.T, r fullRecord) {
				wantInt(t, "kv_block_size", r.KVBlockSize, 32)
				wantEndpoint(t, r.KVEventsEndpoint)
			},
		},
		{
			name:   "vllm-pd-prefill-dp-rank",
			engine: "vllm",
			args: []string{"Qwen/Qwen3-8B", "--host", "127.0.0.1", "--served-model-name", "qwen3-pd",
				"--data-parallel-size", "2", "--data-parallel-rank", "1",
				"--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_producer"}`},
			pd: true,
			check: func(t *testing.T, r fullRecord) {
				if r.DisaggMode != "prefill" || r.DisaggMeta.Protocol != "vllm-nixl" {
					t.Errorf("disagg %q/%q, want prefill/vllm-nixl", r.DisaggMode, r.DisaggMeta.Protocol)
				}
				if r.DPRank == nil || *r.DPRank != 1 || r.DPSize != 2 {
					t.Errorf("dp_rank %v dp_size %d, want 1 of 2", r.DPRank, r.DPSize)
				}
				wantEndpoint(t, r.KVEventsEndpoint)
			},
		},
		{
			name:   "sglang",
			engine: "sglang",
			args: []string{"--model-path", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--served-model-name", "qwen3-sglang",
				"--page-size", "16", "--tp", "2", "--mem-fraction-static", "0.8"},
			check: func(t *testing.T, r fullRecord) {
				wantInt(t, "kv_block_size", r.KVBlockSize, 16)
				wantEndpoint(t, r.KVEventsEndpoint)
			},
		},
		{
			name:   "atom",
			engine: "atom",
			args:   []string{"--model", "deepseek-ai/DeepSeek-R1", "--host", "127.0.0.1", "--served-model-name", "r1-atom", "-tp", "8"},
			check: func(t *testing.T, r fullRecord) {
				if r.KVEventsEndpoint != nil {
					t.Errorf("atom has no KV-event publisher, record says %q", *r.KVEventsEndpoint)
				}
			},
		},
	}
	f := startServe(t)
	env := shimEnv(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			model := ""
			for i, a := range tc.args {
				if a == "--served-model-name" {
					model = tc.args[i+1]
				}
			}
			args := []string{"worker", "--engine", tc.engine, "--etcd-endpoints", f.etcd,
				"--advertise-host", "127.0.0.1", "--lease-ttl", "5s", "--keepalive-interval", "1s",
				"--drain-timeout", "10s", "--stop-grace", "5s"}
			if tc.pd {
				// One host, loopback, no RDMA: the PD preflight would refuse.
				args = append(args, "--disaggregation-allow-tcp")
			}
			args = append(append(args, "--"), tc.args...)
			w := startEnv(t, tc.engine+"-worker", env, args...)
			line := w.waitLog("worker registered", 60*time.Second)
			id, _ := line["worker_id"].(string)
			var rec fullRecord
			f.waitWorkers("the record", 10*time.Second, func(map[string]string) bool {
				var ok bool
				rec, ok = f.record(id)
				return ok
			})
			if rec.Engine != tc.engine || rec.ModelName != model || rec.URL != "http://"+id || rec.Status != "active" {
				t.Fatalf("record %+v", rec)
			}
			if !tc.pd && (rec.DisaggMode != "mixed" || rec.DPSize != 1 || rec.DPRank != nil) {
				t.Fatalf("mixed record %+v", rec)
			}
			tc.check(t, rec)
			if tc.pd {
				w.signal(syscall.SIGTERM)
				if err := w.wait(20 * time.Second); err != nil {
					t.Fatalf("drained %s worker exited %v", tc.name, err)
				}
				return
			}

			// Routed through infera serve, by the served model name.
			body := fmt.Sprintf(`{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, model)
			resp, err := http.Post(f.base+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Infera-Worker") != id {
				t.Fatalf("routed request: %d via %q: %s", resp.StatusCode, resp.Header.Get("X-Infera-Worker"), data)
			}

			// Drain on SIGTERM: record goes, worker exits 0.
			w.signal(syscall.SIGTERM)
			f.waitWorkers("the drained record to go", 20*time.Second, func(ws map[string]string) bool {
				_, ok := ws[id]
				return !ok
			})
			if err := w.wait(20 * time.Second); err != nil {
				t.Fatalf("drained %s worker exited %v", tc.engine, err)
			}

			// Engine death: a second worker's engine is killed; its record goes and it exits non-zero.
			w2 := startEnv(t, tc.engine+"-worker-2", env, args...)
			id2, _ := w2.waitLog("worker registered", 60*time.Second)["worker_id"].(string)
			f.waitWorkers("the second record", 10*time.Second, func(ws map[string]string) bool { return ws[id2] == "active" })
			if err := syscall.Kill(enginePID(t, w2), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			f.waitWorkers("the dead engine's record to go", 5*time.Second, func(ws map[string]string) bool {
				_, ok := ws[id2]
				return !ok
			})
			if err := w2.wait(20 * time.Second); err == nil {
				t.Fatalf("%s worker whose engine died exited 0", tc.engine)
			}
		})
	}
}

func wantInt(t *testing.T, field string, got *int, want int) {
	t.Helper()
	if got == nil || *got != want {
		t.Errorf("%s = %v, want %d", field, got, want)
	}
}

func wantEndpoint(t *testing.T, ep *string) {
	t.Helper()
	if ep == nil || !strings.HasPrefix(*ep, "tcp://127.0.0.1:") {
		t.Errorf("kv_events_endpoint = %v, want tcp://127.0.0.1:PORT", ep)
	}
}
