package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
)

// Issue 35, acceptance 4 (canary): the reference's tokenizer canary rule.
// Three workers of one model register; the one whose kv block's
// tokenizer_canary differs from the first's is rejected (not routed, not
// listed) and counted in infera_canary_rejections_total; with
// --tokenizer-canary-check=false all three are routed.
func TestTokenizerCanaryCheck(t *testing.T) {
	for _, check := range []bool{true, false} {
		t.Run(map[bool]string{true: "on", false: "off"}[check], func(t *testing.T) {
			var extra []string
			if !check {
				extra = []string{"--tokenizer-canary-check=false"}
			}
			f := startServe(t, extra...)
			cli, err := discovery.NewClient(config.Etcd{Endpoints: []string{f.etcd}, Prefix: "/infera/workers/", DialTimeout: 5 * time.Second}, zerolog.Nop())
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			register := func(id, canary string) {
				rec := discovery.Record{WorkerID: id, URL: "http://" + id, ModelName: "canary-model", Engine: "vllm",
					DisaggMode: discovery.DisaggMixed, DPSize: 1, RequestTransport: "http", Status: discovery.StatusActive,
					KV: json.RawMessage(`{"tokenizer_canary":` + canary + `}`)}
				reg := discovery.NewRegistrar(cli, "/infera/workers/", rec, discovery.RegistrarOptions{TTL: 10 * time.Second, KeepAliveInterval: time.Second}, zerolog.Nop())
				if err := reg.Register(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			register("127.0.0.1:1", "[101,202,303]")
			f.waitWorkers("the first worker", 20*time.Second, func(m map[string]string) bool { return len(m) == 1 })
			register("127.0.0.1:2", "[101,202,304]")
			register("127.0.0.1:3", "[101,202,303]")
			want := 2
			if !check {
				want = 3
			}
			f.waitWorkers("the matching workers", 20*time.Second, func(m map[string]string) bool {
				_, bad := m["127.0.0.1:2"]
				return len(m) == want && bad == !check && m["127.0.0.1:3"] != ""
			})
			resp, err := http.Get(f.base + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got := metricValue(string(body), "infera_canary_rejections_total")
			if check && got != 1 {
				t.Fatalf("infera_canary_rejections_total %v, want 1", got)
			}
			if !check && got != 0 {
				t.Fatalf("infera_canary_rejections_total %v with the check off", got)
			}
		})
	}
}
