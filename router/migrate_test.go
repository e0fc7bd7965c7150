package router_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/router"
	"github.com/infera/infera/sim"
)

// startDyingSim runs a simulator of flavor that "crashes" after streaming
// dieAfter tokens in total (0: never): its streams are cut without their
// end, as a killed engine's; the process stays (the exit is a no-op).
func startDyingSim(t *testing.T, flavor string, dieAfter int64) discovery.Record {
	t.Helper()
	cfg := config.DefaultSim()
	cfg.Port = 0
	cfg.Flavor = flavor
	cfg.DieAfterTokens = dieAfter
	s, err := sim.New(cfg, zerolog.Nop(), sim.WithExit(func(int) {}))
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{addr: servetest.Loopback(t, "sim", s.Serve)}
	rec := simRecord(u)
	rec.Engine, rec.RealEngine = flavor, "sim"
	return rec
}

// streamText sends a streaming request and returns the text the client
// read, its finish reason, whether an error event came, and the raw body.
func streamText(t *testing.T, tr *testRouter, path, body string) (text, finish string, errored bool, raw string) {
	t.Helper()
	resp, b := tr.do(t, http.MethodPost, path, body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
	}
	raw = string(b)
	var sb strings.Builder
	for line := range strings.SplitSeq(raw, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c struct {
			Error   json.RawMessage
			Type    string
			Delta   struct{ Text string }
			Choices []struct {
				Text         string
				Delta        struct{ Content string }
				FinishReason *string `json:"finish_reason"`
			}
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("chunk %s: %v", data, err)
		}
		if len(c.Error) > 0 || c.Type == "error" {
			errored = true
		}
		sb.WriteString(c.Delta.Text) // Anthropic content_block_delta
		for _, ch := range c.Choices {
			sb.WriteString(ch.Text + ch.Delta.Content)
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	return sb.String(), finish, errored, raw
}

func migrationConfig(limit int) router.Config {
	cfg := router.DefaultConfig()
	cfg.MigrationLimit = limit
	return cfg
}

const (
	contChat        = `{"model":"sim-model","stream":true,"max_tokens":40,"messages":[{"role":"user","content":"Tell me a long story about routers"}]}`
	contCompletions = `{"model":"sim-model","stream":true,"max_tokens":40,"prompt":"Once upon a time in a data center"}`
)

// TestContinuationExact: a vLLM-shaped stream cut mid-way is continued on
// another worker from the prompt's and output's token ids: the client reads
// the text of an unbroken run, one finish, no error event, no id field, and
// only chat chunks on chat; the continuation is counted.
func TestContinuationExact(t *testing.T) {
	for _, c := range []struct{ path, body, object string }{
		{"/v1/chat/completions", contChat, `"object":"chat.completion.chunk"`},
		{"/v1/completions", contCompletions, `"object":"text_completion"`},
	} {
		t.Run(c.path, func(t *testing.T) {
			healthy := startDyingSim(t, config.FlavorVLLM, 0)
			want, wantFinish, _, _ := streamText(t, startRouter(t, router.RoundRobin{}, router.DefaultConfig(), healthy), c.path, c.body)

			dying := startDyingSim(t, config.FlavorVLLM, 7)
			tr := startRouter(t, prefer{dying.WorkerID, healthy.WorkerID}, migrationConfig(3), dying, healthy)
			got, finish, errored, raw := streamText(t, tr, c.path, c.body)
			if errored || got != want || finish != wantFinish {
				t.Fatalf("continued stream: text %q finish %q error %v, want %q %q\n%s", got, finish, errored, want, wantFinish, raw)
			}
			for _, f := range []string{`"token_ids"`, `"prompt_token_ids"`, `"sglext"`} {
				if strings.Contains(raw, f) {
					t.Fatalf("the client saw %s:\n%s", f, raw)
				}
			}
			for line := range strings.SplitSeq(raw, "\n") {
				if strings.HasPrefix(line, "data: {") && !strings.Contains(line, c.object) {
					t.Fatalf("the client saw a chunk of another kind: %s", line)
				}
			}
			if n := metric(t, tr, `infera_migrations_total{reason="stream_broken"}`); n != 1 {
				t.Fatalf("infera_migrations_total{stream_broken} = %v, want 1", n)
			}
		})
	}
}

// TestContinuationClientAskedIDs: a client that set return_token_ids
// itself reads the ids in every chunk (the router asked nothing, so it
// strips nothing), and its stream is still continued exactly.
func TestContinuationClientAskedIDs(t *testing.T) {
	const body = `{"return_token_ids":true,"model":"sim-model","stream":true,"max_tokens":40,"prompt":"Once upon a time in a data center"}`
	healthy := startDyingSim(t, config.FlavorVLLM, 0)
	want, _, _, _ := streamText(t, startRouter(t, router.RoundRobin{}, router.DefaultConfig(), healthy), "/v1/completions", contCompletions)
	dying := startDyingSim(t, config.FlavorVLLM, 7)
	tr := startRouter(t, prefer{dying.WorkerID, healthy.WorkerID}, migrationConfig(3), dying, healthy)
	got, _, errored, raw := streamText(t, tr, "/v1/completions", body)
	if errored || got != want {
		t.Fatalf("continued stream: text %q error %v, want %q\n%s", got, errored, want, raw)
	}
	chunks, withIDs := 0, 0
	for line := range strings.SplitSeq(raw, "\n") {
		if strings.HasPrefix(line, "data: {") {
			chunks++
			if strings.Contains(line, `"token_ids":[`) {
				withIDs++
			}
		}
	}
	if chunks == 0 || withIDs != chunks || !strings.Contains(raw, `"prompt_token_ids":[`) {
		t.Fatalf("%d of %d chunks carried the ids the client asked for:\n%s", withIDs, chunks, raw)
	}
}

// TestContinuationBreaksAgain: a continuation that breaks in turn is
// continued again (exactly, from the ids both legs delivered).
func TestContinuationBreaksAgain(t *testing.T) {
	healthy := startDyingSim(t, config.FlavorVLLM, 0)
	want, _, _, _ := streamText(t, startRouter(t, router.RoundRobin{}, router.DefaultConfig(), healthy), "/v1/chat/completions", contChat)
	first, second := startDyingSim(t, config.FlavorVLLM, 5), startDyingSim(t, config.FlavorVLLM, 9)
	tr := startRouter(t, prefer{first.WorkerID, second.WorkerID, healthy.WorkerID}, migrationConfig(3), first, second, healthy)
	got, _, errored, raw := streamText(t, tr, "/v1/chat/completions", contChat)
	if errored || got != want {
		t.Fatalf("twice continued: %q (error %v), want %q\n%s", got, errored, want, raw)
	}
	if n := metric(t, tr, `infera_migrations_total{reason="stream_broken"}`); n != 2 {
		t.Fatalf("migrations %v, want 2", n)
	}
}

// TestContinuationLimit: past --migration-limit a broken stream ends with
// the error event, counted as a failed migration (limit); with the limit
// at 0 nothing is tracked or counted.
func TestContinuationLimit(t *testing.T) {
	first, second, third := startDyingSim(t, config.FlavorVLLM, 5), startDyingSim(t, config.FlavorVLLM, 9), startDyingSim(t, config.FlavorVLLM, 0)
	order := prefer{first.WorkerID, second.WorkerID, third.WorkerID}
	tr := startRouter(t, order, migrationConfig(1), first, second, third)
	_, _, errored, raw := streamText(t, tr, "/v1/chat/completions", contChat)
	if !errored {
		t.Fatalf("a stream broken twice with --migration-limit 1 ended without an error event:\n%s", raw)
	}
	if n := metric(t, tr, `infera_migrations_failed_total{reason="limit"}`); n != 1 {
		t.Fatalf("failed migrations (limit) %v, want 1", n)
	}
	// Off: the broken stream ends with the error event, nothing is
	// asked of the engine, nothing counted.
	d0, h0 := startDyingSim(t, config.FlavorVLLM, 5), startDyingSim(t, config.FlavorVLLM, 0)
	off := startRouter(t, prefer{d0.WorkerID, h0.WorkerID}, migrationConfig(0), d0, h0)
	_, _, errored, raw = streamText(t, off, "/v1/chat/completions", contChat)
	if !errored || strings.Contains(raw, "token_ids") {
		t.Fatalf("--migration-limit 0: a broken stream did not end with the error event, or ids were asked:\n%s", raw)
	}
	for _, r := range []string{"limit", "poisoned", "no_candidate", "no_first_byte"} {
		if n := metric(t, off, `infera_migrations_failed_total{reason="`+r+`"}`); n != 0 {
			t.Fatalf("--migration-limit 0 counted a failed migration (%s): %v", r, n)
		}
	}
}

// TestContinuationPoisoned: a request that is never continued (n > 1)
// ends with today's error event when its engine dies.
func TestContinuationPoisoned(t *testing.T) {
	dying, healthy := startDyingSim(t, config.FlavorVLLM, 5), startDyingSim(t, config.FlavorVLLM, 0)
	tr := startRouter(t, prefer{dying.WorkerID, healthy.WorkerID}, migrationConfig(3), dying, healthy)
	body := strings.Replace(contChat, `"stream":true`, `"stream":true,"n":2`, 1)
	_, _, errored, raw := streamText(t, tr, "/v1/chat/completions", body)
	if !errored {
		t.Fatalf("an n=2 stream was continued:\n%s", raw)
	}
	if n := metric(t, tr, `infera_migrations_total{reason="stream_broken"}`); n != 0 {
		t.Fatalf("migrations %v, want 0", n)
	}
}

// TestContinuationText: engines that give no ids (ATOM and the like) are
// continued on the text path: the stream ends with a finish and no error.
func TestContinuationText(t *testing.T) {
	dying, healthy := startDyingSim(t, config.FlavorVLLM, 6), startDyingSim(t, config.FlavorVLLM, 0)
	dying.Engine, healthy.Engine = discovery.EngineATOM, discovery.EngineATOM
	tr := startRouter(t, prefer{dying.WorkerID, healthy.WorkerID}, migrationConfig(3), dying, healthy)
	for _, c := range []struct{ path, body string }{{"/v1/chat/completions", contChat}, {"/v1/completions", contCompletions}} {
		got, finish, errored, raw := streamText(t, tr, c.path, c.body)
		if errored || finish == "" || got == "" {
			t.Fatalf("%s: text continuation: %q finish %q error %v\n%s", c.path, got, finish, errored, raw)
		}
		if strings.Contains(raw, "token_ids") {
			t.Fatalf("%s: ids asked of an engine that takes none:\n%s", c.path, raw)
		}
	}
}

// TestContinuationAnthropic: an Anthropic Messages stream continues too
// (the dialect translates the continued OpenAI stream): the client reads
// the unbroken text and one message_stop, no error event.
func TestContinuationAnthropic(t *testing.T) {
	const body = `{"model":"sim-model","stream":true,"max_tokens":40,"messages":[{"role":"user","content":"Tell me a long story about routers"}]}`
	healthy := startDyingSim(t, config.FlavorVLLM, 0)
	want, _, _, _ := streamText(t, startRouter(t, router.RoundRobin{}, router.DefaultConfig(), healthy), "/v1/messages", body)
	dying := startDyingSim(t, config.FlavorVLLM, 7)
	tr := startRouter(t, prefer{dying.WorkerID, healthy.WorkerID}, migrationConfig(3), dying, healthy)
	got, _, errored, raw := streamText(t, tr, "/v1/messages", body)
	if errored || got != want || strings.Count(raw, "event: message_stop") != 1 || strings.Count(raw, "event: message_start") != 1 {
		t.Fatalf("continued Anthropic stream: %q (error %v), want %q\n%s", got, errored, want, raw)
	}
}

// TestContinuationPD: a disaggregated stream whose decode engine dies
// mid-way continues on another decode worker (vLLM's decode engines compute
// a request without a hand-off), exactly: the client reads the unbroken
// run's text, one finish, no error event. With SGLang's bootstrap protocol
// (decode engines refuse requests without their room) and no mixed worker,
// it is not continued.
func TestContinuationPD(t *testing.T) {
	const body = `{"model":"sim-model","stream":true,"max_tokens":30,"messages":[{"role":"user","content":"tell me about disaggregated serving please"}]}`
	for _, c := range []struct {
		proto     string
		continued bool
	}{{discovery.ProtocolVLLMNixl, true}, {discovery.ProtocolVLLMMooncake, true}, {discovery.ProtocolSGLangBootstrap, false}} {
		t.Run(c.proto, func(t *testing.T) {
			healthy := startDyingSim(t, config.FlavorVLLM, 0)
			want, wantFinish, _, _ := streamText(t, startRouter(t, router.RoundRobin{}, router.DefaultConfig(), healthy), "/v1/chat/completions", body)
			p := startPDSim(t, "prefill", c.proto, nil)
			dying := startPDSim(t, "decode", c.proto, func(s *config.Sim) { s.DieAfterTokens = 7 })
			d := startPDSim(t, "decode", c.proto, nil)
			drec, dyrec := d.record(discovery.DisaggDecode, c.proto), dying.record(discovery.DisaggDecode, c.proto)
			drec.Engine, dyrec.Engine = discovery.EngineVLLM, discovery.EngineVLLM
			tr := startRouter(t, prefer{dyrec.WorkerID, drec.WorkerID}, withConfig(func(cfg *router.Config) {
				cfg.PDPrefillTimeout = 5 * time.Second
				cfg.MigrationLimit = 3
			}), p.record(discovery.DisaggPrefill, c.proto), dyrec, drec)
			got, finish, errored, raw := streamText(t, tr, "/v1/chat/completions", body)
			if !c.continued {
				if !errored {
					t.Fatalf("a %s decode stream was continued on a decode engine that refuses it:\n%s", c.proto, raw)
				}
				return
			}
			if errored || got != want || finish != wantFinish {
				t.Fatalf("continued PD stream: %q finish %q error %v, want %q %q\n%s", got, finish, errored, want, wantFinish, raw)
			}
			if n := metric(t, tr, `infera_migrations_total{reason="stream_broken"}`); n != 1 {
				t.Fatalf("migrations %v, want 1", n)
			}
		})
	}
}

// headersThenClose is a decode engine that answers a stream's status line
// and headers, then dies before its first event.
func headersThenClose(t *testing.T) *upstream {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	t.Cleanup(srv.Close)
	return &upstream{addr: strings.TrimPrefix(srv.URL, "http://")}
}

// TestContinuationPDBeforeFirstEvent: a disaggregated stream whose decode
// engine dies after its status line but before its first event is not
// lost: another pair cannot take its place (the status line went out), so
// it continues on another decode worker with the client's own request.
func TestContinuationPDBeforeFirstEvent(t *testing.T) {
	const body = `{"model":"sim-model","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"tell me about disaggregated serving please"}]}`
	proto := discovery.ProtocolVLLMNixl
	p := startPDSim(t, "prefill", proto, nil)
	d := startPDSim(t, "decode", proto, nil)
	dead := headersThenClose(t)
	drec := d.record(discovery.DisaggDecode, proto)
	deadRec := record(dead, "sim-model", discovery.StatusActive)
	deadRec.DisaggMode, deadRec.DisaggMeta = discovery.DisaggDecode, drec.DisaggMeta
	tr := startRouter(t, prefer{deadRec.WorkerID, drec.WorkerID}, withConfig(func(cfg *router.Config) {
		cfg.PDPrefillTimeout = 5 * time.Second
		cfg.MigrationLimit = 3
	}), p.record(discovery.DisaggPrefill, proto), deadRec, drec)
	got, finish, errored, raw := streamText(t, tr, "/v1/chat/completions", body)
	if errored || got == "" || finish != "length" {
		t.Fatalf("a PD stream broken before its first event: %q finish %q error %v\n%s", got, finish, errored, raw)
	}
	if n := metric(t, tr, `infera_migrations_total{reason="stream_broken"}`); n != 1 {
		t.Fatalf("migrations %v, want 1", n)
	}
}

// TestContinuationAfterRetry: a stream retried before its first byte (its
// --request-max-retries spent on a worker that refused it) is still
// continued when it breaks later: continuations are counted by
// --migration-limit, not by the retries before the first byte.
func TestContinuationAfterRetry(t *testing.T) {
	healthy := startDyingSim(t, config.FlavorVLLM, 0)
	want, _, _, _ := streamText(t, startRouter(t, router.RoundRobin{}, router.DefaultConfig(), healthy), "/v1/chat/completions", contChat)
	down := record(downUpstream(t), "sim-model", discovery.StatusActive)
	dying := startDyingSim(t, config.FlavorVLLM, 5)
	cfg := migrationConfig(3)
	cfg.MaxRetries = 1
	tr := startRouter(t, prefer{down.WorkerID, dying.WorkerID, healthy.WorkerID}, cfg, down, dying, healthy)
	got, _, errored, raw := streamText(t, tr, "/v1/chat/completions", contChat)
	if errored || got != want {
		t.Fatalf("retried, then continued: %q (error %v), want %q\n%s", got, errored, want, raw)
	}
	if n := metric(t, tr, `infera_migrations_total{reason="stream_broken"}`); n != 1 {
		t.Fatalf("migrations %v, want 1", n)
	}
}
