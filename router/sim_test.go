package router_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/router"
	"github.com/infera/infera/sim"
)

// startSim runs the simulated engine in-process on a free port.
func startSim(t *testing.T, tweak func(*config.Sim)) *upstream {
	t.Helper()
	cfg := config.DefaultSim()
	cfg.Port = 0
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := sim.New(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{addr: servetest.Loopback(t, "sim", s.Serve)}
	if cfg.KVEventsEndpoint != "" {
		testkit.Eventually(t, "the simulator's event sockets", func() bool { return s.KVEventsEndpoint() != "" })
		u.kvEvents, u.kvReplay = s.KVEventsEndpoint(), s.KVEventsReplayEndpoint()
	}
	return u
}

func simRecord(u *upstream) discovery.Record {
	r := record(u, "sim-model", discovery.StatusActive)
	return r
}

// simGauge reads one unlabelled-or-labelled gauge from the sim's /metrics.
func simGauge(t *testing.T, u *upstream, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + u.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(body), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		return v
	}
	t.Fatalf("sim /metrics has no %s", name)
	return 0
}

// simPublished waits until the simulator has published the counters of a
// request it answered (its success count past before): the scheduler
// publishes a round's counters after the round (sim/scheduler.go publish),
// which may be after the answer reached the client, and a counter read at
// once missed the request on a loaded box.
func simPublished(t *testing.T, u *upstream, successBefore float64) {
	t.Helper()
	testkit.Eventually(t, "the simulator to publish the request's counters", func() bool {
		return simGauge(t, u, "vllm:request_success_total") > successBefore
	})
}

func TestSimUnaryAndStream(t *testing.T) {
	a, b := startSim(t, nil), startSim(t, nil)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), simRecord(a), simRecord(b))
	defer http.DefaultClient.CloseIdleConnections()

	workers := map[string]bool{}
	for i := range 4 {
		resp, body := tr.do(t, "POST", "/v1/chat/completions",
			`{"model":"sim-model","messages":[{"role":"user","content":"hello `+strconv.Itoa(i)+`"}],"max_tokens":8}`)
		var out struct {
			Object  string `json:"object"`
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(body, &out); err != nil || resp.StatusCode != 200 || out.Object != "chat.completion" ||
			len(out.Choices) != 1 || out.Usage.CompletionTokens != 8 {
			t.Fatalf("unary: %d %s (%v)", resp.StatusCode, body, err)
		}
		workers[resp.Header.Get("X-Infera-Worker")] = true
	}
	if len(workers) != 2 {
		t.Fatalf("both sims should get traffic, got %v", workers)
	}

	resp, body := tr.do(t, "POST", "/v1/completions",
		`{"model":"sim-model","prompt":"once upon","max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %d %v", resp.StatusCode, resp.Header)
	}
	events := strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n")
	if len(events) < 7 || events[len(events)-1] != "data: [DONE]" || !strings.Contains(events[len(events)-2], `"usage"`) {
		t.Fatalf("stream body %q: want 5 token events, a usage event and [DONE]", body)
	}
}

// TestSimClientDisconnectStopsGeneration: the engine's running count drops
// when the client of a long stream goes away.
func TestSimClientDisconnectStopsGeneration(t *testing.T) {
	s := startSim(t, nil)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), simRecord(s))
	defer http.DefaultClient.CloseIdleConnections()

	resp, br := tr.stream(t, `{"model":"sim-model","messages":[{"role":"user","content":"go on"}],"max_tokens":4000,"stream":true}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	readEvent(t, br)
	readEvent(t, br)
	if got := simGauge(t, s, "vllm:num_requests_running"); got != 1 {
		t.Fatalf("running = %v during the stream, want 1", got)
	}
	resp.Body.Close()
	testkit.Eventually(t, "the engine's running count to drop", func() bool {
		return simGauge(t, s, "vllm:num_requests_running") == 0
	})
	if got := simGauge(t, s, "vllm:generation_tokens_total"); got >= 4000 {
		t.Fatalf("the engine generated all %v tokens for a client that left", got)
	}
}
