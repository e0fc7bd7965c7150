package router_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/router"
	"github.com/infera/infera/tokenizer"
)

// otherTemplate is the router's tokenizer with a chat template that is not
// the engine's: it renders a header the simulator's ChatML does not have.
type otherTemplate struct{ tokenizer.Bytes }

func (o otherTemplate) AppendRenderChat(dst []byte, c tokenizer.Chat) ([]byte, error) {
	dst = append(dst, "<|begin_of_text|>"...)
	return o.Bytes.AppendRenderChat(dst, c)
}

func (o otherTemplate) RenderChat(messages []byte) (string, error) {
	b, err := o.AppendRenderChat(nil, tokenizer.Chat{Messages: messages})
	return string(b), err
}

// divergenceRun sends a shared-prefix chat workload (unary and streamed with
// usage) through a kv-aware router with tokenizer tok in front of two
// simulators, and returns the router, its log and the fleet snapshot.
func divergenceRun(t *testing.T, tok tokenizer.Tokenizer, requests int) (*testRouter, *testkit.LogSink, router.FleetSnapshot) {
	t.Helper()
	a := startSim(t, func(c *config.Sim) { c.TimeScale = 0 })
	b := startSim(t, func(c *config.Sim) { c.TimeScale = 0 })
	logs := new(testkit.LogSink)
	cfg := kvConfig(func(c *router.KVAwareConfig) { c.Tokenizer = tok })
	cfg.EngineIdleConnTimeout = 50 * time.Millisecond
	p, err := router.NewKVAware(cfg, zerolog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	tr := startRouter(t, p, router.DefaultConfig(), simRecord(a), simRecord(b))
	defer http.DefaultClient.CloseIdleConnections()
	system := strings.Repeat("You answer in one line. ", 12)
	for i := range requests {
		user := "question " + strings.Repeat("x", i%7) + string(rune('a'+i%26))
		msgs := `[{"role":"system","content":"` + system + `"},{"role":"user","content":"` + user + `"}]`
		if i%2 == 0 {
			resp, body := tr.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"sim-model","max_tokens":2,"messages":`+msgs+`}`)
			// The usage is read from the answer the client gets: its body
			// must still be the engine's.
			if resp.StatusCode != 200 || !strings.Contains(string(body), `"object":"chat.completion"`) {
				t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
			}
			continue
		}
		resp, r := tr.stream(t, `{"model":"sim-model","max_tokens":2,"stream":true,"stream_options":{"include_usage":true},"messages":`+msgs+`}`)
		if resp.StatusCode != 200 {
			t.Fatalf("stream %d: %d", i, resp.StatusCode)
		}
		_, _ = io.Copy(io.Discard, bufio.NewReader(r))
		resp.Body.Close()
	}
	_, body := tr.do(t, http.MethodGet, "/v1/admin/fleet", "")
	var snap router.FleetSnapshot
	if err := json.Unmarshal(body, &snap); err != nil {
		t.Fatalf("fleet: %v %s", err, body)
	}
	return tr, logs, snap
}

// TestKVDivergenceAlarm: a router whose chat template is not the engine's
// is told within a few dozen requests, per worker, once; the same workload
// with the engine's template stays quiet and fills the reported hit ratio.
func TestKVDivergenceAlarm(t *testing.T) {
	t.Run("mismatched", func(t *testing.T) {
		tr, log, snap := divergenceRun(t, otherTemplate{}, 40)
		testkit.Eventually(t, "two warnings", func() bool { return strings.Count(log.String(), "kv divergence") == 2 })
		for _, w := range snap.Workers {
			d := w.Divergence
			if d == nil || !d.Divergent || d.Cause != "prompt_tokens" || d.PromptsDiffering != d.PromptsCounted || d.Hint == "" {
				t.Fatalf("worker %s divergence %+v", w.WorkerID, d)
			}
			if !strings.Contains(log.String(), w.WorkerID) {
				t.Fatalf("no warning names %s:\n%s", w.WorkerID, log)
			}
		}
		if v, _ := tr.metric(t, "infera_router_kv_divergence_warnings_total"); v != 2 {
			t.Fatalf("warnings counter %v, want 2", v)
		}
		if v, _ := tr.metric(t, `infera_router_kv_divergent{worker_id="`+snap.Workers[0].WorkerID+`"}`); v != 1 {
			t.Fatalf("divergent gauge %v, want 1", v)
		}
	})
	t.Run("matched", func(t *testing.T) {
		tr, log, snap := divergenceRun(t, tokenizer.Bytes{}, 40)
		if strings.Contains(log.String(), "kv divergence") {
			t.Fatalf("matched fleet warned:\n%s", log)
		}
		for _, w := range snap.Workers {
			d := w.Divergence
			if d == nil || d.Divergent || d.PromptsCounted == 0 || d.PromptsDiffering != 0 || w.HitRatioReported == nil || *w.HitRatioReported <= 0 {
				t.Fatalf("worker %s divergence %+v, reported hit ratio %v", w.WorkerID, d, w.HitRatioReported)
			}
		}
		if v, _ := tr.metric(t, "infera_router_kv_divergence_warnings_total"); v != 0 {
			t.Fatalf("warnings counter %v, want 0", v)
		}
	})
}
