package sim

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/testkit"
)

func TestChatUnaryShape(t *testing.T) {
	ts := startSim(t, nil)
	m := ts.postJSON(t, "/v1/chat/completions", chatBody(t, map[string]any{"max_tokens": 20}, "hello"))
	id, _ := m["id"].(string)
	if !strings.HasPrefix(id, "chatcmpl-") || len(id) != len("chatcmpl-")+32 {
		t.Errorf("id %q", id)
	}
	if m["object"] != "chat.completion" || m["model"] != "sim-model" {
		t.Errorf("object/model: %v %v", m["object"], m["model"])
	}
	if c, _ := m["created"].(float64); c < float64(time.Now().Add(-time.Hour).Unix()) {
		t.Errorf("created %v", m["created"])
	}
	choices := m["choices"].([]any)
	if len(choices) != 1 {
		t.Fatalf("choices %v", choices)
	}
	ch := choices[0].(map[string]any)
	if ch["index"] != 0.0 || ch["finish_reason"] != "length" || ch["stop_reason"] != nil {
		t.Errorf("choice %v", ch)
	}
	if v, ok := ch["logprobs"]; !ok || v != nil {
		t.Errorf("logprobs must be null: %v", ch)
	}
	msg := ch["message"].(map[string]any)
	content, _ := msg["content"].(string)
	if msg["role"] != "assistant" || len(content) != 20 {
		t.Errorf("message %v", msg)
	}
	// ChatML rendering of one user message plus the generation prompt.
	prompt := len("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
	checkUsage(t, m["usage"], prompt, 20, 0)
}

func checkUsage(t *testing.T, u any, prompt, completion, cached int) {
	t.Helper()
	usage, ok := u.(map[string]any)
	if !ok {
		t.Fatalf("usage %v", u)
	}
	details, _ := usage["prompt_tokens_details"].(map[string]any)
	if usage["prompt_tokens"] != float64(prompt) || usage["completion_tokens"] != float64(completion) ||
		usage["total_tokens"] != float64(prompt+completion) || details == nil || details["cached_tokens"] != float64(cached) {
		t.Errorf("usage %v, want prompt %d completion %d cached %d", usage, prompt, completion, cached)
	}
}

func TestCompletionUnaryShape(t *testing.T) {
	ts := startSim(t, nil)
	m := ts.postJSON(t, "/v1/completions", complBody(t, nil, "once upon a time"))
	id, _ := m["id"].(string)
	if !strings.HasPrefix(id, "cmpl-") || len(id) != len("cmpl-")+32 {
		t.Errorf("id %q", id)
	}
	if m["object"] != "text_completion" || m["model"] != "sim-model" {
		t.Errorf("object/model: %v %v", m["object"], m["model"])
	}
	ch := m["choices"].([]any)[0].(map[string]any)
	text, _ := ch["text"].(string)
	if len(text) != 16 || ch["finish_reason"] != "length" || ch["index"] != 0.0 { // --max-tokens-default
		t.Errorf("choice %v", ch)
	}
	checkUsage(t, m["usage"], len("once upon a time"), 16, 0)

	// Token-id prompts are accepted and give the same answer as the text.
	m2 := ts.postJSON(t, "/v1/completions", complBody(t, nil, []int{111, 110, 99, 101, 32, 117, 112, 111, 110, 32, 97, 32, 116, 105, 109, 101}))
	if got := m2["choices"].([]any)[0].(map[string]any)["text"]; got != text {
		t.Errorf("token-id prompt text %q, want %q", got, text)
	}
}

func TestChatStreamShape(t *testing.T) {
	ts := startSim(t, nil)
	unary := ts.postJSON(t, "/v1/chat/completions", chatBody(t, map[string]any{"max_completion_tokens": 7}, "stream me"))
	want := unary["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string)

	resp := ts.stream(t, t.Context(), "/v1/chat/completions", chatBody(t, map[string]any{"max_completion_tokens": 7, "stream": true}, "stream me"))
	defer resp.Body.Close()
	events, err := readAllEvents(resp.Body)
	if err != nil {
		t.Fatalf("read stream: %v", err)
	}
	// role chunk + 7 token chunks + [DONE]
	if len(events) != 9 || events[8] != "[DONE]" {
		t.Fatalf("events %d: %q", len(events), events)
	}
	var got strings.Builder
	var id string
	for i, ev := range events[:8] {
		var c map[string]any
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("event %d: %v: %s", i, err, ev)
		}
		if i == 0 {
			id, _ = c["id"].(string)
		}
		if c["id"] != id || !strings.HasPrefix(id, "chatcmpl-") || c["object"] != "chat.completion.chunk" || c["model"] != "sim-model" {
			t.Errorf("event %d header: %s", i, ev)
		}
		if _, ok := c["usage"]; ok {
			t.Errorf("event %d has usage without include_usage: %s", i, ev)
		}
		ch := c["choices"].([]any)[0].(map[string]any)
		delta := ch["delta"].(map[string]any)
		switch {
		case i == 0:
			if delta["role"] != "assistant" || delta["content"] != "" || ch["finish_reason"] != nil {
				t.Errorf("role chunk %s", ev)
			}
		case i == 7:
			if ch["finish_reason"] != "length" {
				t.Errorf("last chunk %s", ev)
			}
			if v, ok := ch["stop_reason"]; !ok || v != nil {
				t.Errorf("last chunk lacks stop_reason null: %s", ev)
			}
		default:
			if ch["finish_reason"] != nil {
				t.Errorf("chunk %d finish_reason: %s", i, ev)
			}
		}
		if v, ok := ch["logprobs"]; !ok || v != nil {
			t.Errorf("chunk %d logprobs: %s", i, ev)
		}
		if i > 0 {
			s, _ := delta["content"].(string)
			if len(s) != 1 {
				t.Errorf("chunk %d carries %q, want one token", i, s)
			}
			got.WriteString(s)
		}
	}
	if got.String() != want {
		t.Errorf("streamed %q, unary %q", got.String(), want)
	}
}

func TestStreamIncludeUsage(t *testing.T) {
	ts := startSim(t, nil)
	for _, tc := range []struct {
		path, body, object string
		prompt             int
	}{
		{"/v1/chat/completions", chatBody(t, map[string]any{"max_tokens": 3, "stream": true, "stream_options": map[string]any{"include_usage": true}}, "u"),
			"chat.completion.chunk", len("<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n")},
		{"/v1/completions", complBody(t, map[string]any{"max_tokens": 3, "stream": true, "stream_options": map[string]any{"include_usage": true}}, "abc"),
			"text_completion", 3},
	} {
		resp := ts.stream(t, t.Context(), tc.path, tc.body)
		events, err := readAllEvents(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: %v", tc.path, err)
		}
		n := len(events)
		if n < 3 || events[n-1] != "[DONE]" {
			t.Fatalf("%s: events %q", tc.path, events)
		}
		var u map[string]any
		if err := json.Unmarshal([]byte(events[n-2]), &u); err != nil {
			t.Fatal(err)
		}
		if u["object"] != tc.object || len(u["choices"].([]any)) != 0 {
			t.Errorf("%s: usage chunk %s", tc.path, events[n-2])
		}
		checkUsage(t, u["usage"], tc.prompt, 3, 0)
		if tc.object == "text_completion" {
			// Completion chunks: text, logprobs, finish_reason, stop_reason.
			var c map[string]any
			_ = json.Unmarshal([]byte(events[0]), &c)
			ch := c["choices"].([]any)[0].(map[string]any)
			if len(ch["text"].(string)) != 1 || ch["finish_reason"] != nil {
				t.Errorf("completion chunk %s", events[0])
			}
			if _, ok := ch["stop_reason"]; !ok {
				t.Errorf("completion chunk lacks stop_reason: %s", events[0])
			}
		}
	}
}

func TestCachedTokensRise(t *testing.T) {
	ts := startSim(t, nil)
	prompt := strings.Repeat("the same long system prompt ", 10) // 280 bytes
	body := complBody(t, map[string]any{"max_tokens": 4}, prompt)
	first := ts.postJSON(t, "/v1/completions", body)
	checkUsage(t, first["usage"], 280, 4, 0)
	second := ts.postJSON(t, "/v1/completions", body)
	checkUsage(t, second["usage"], 280, 4, (280-1)/16*16)

	// A longer prompt with the same start hits the shared full blocks.
	third := ts.postJSON(t, "/v1/completions", complBody(t, map[string]any{"max_tokens": 4}, prompt+"and more"))
	checkUsage(t, third["usage"], 288, 4, 280/16*16)

	// Multi-turn: the previous answer is part of the next prompt, so its
	// blocks (stored while decoding) hit too.
	turn1 := ts.postJSON(t, "/v1/completions", complBody(t, map[string]any{"max_tokens": 64}, "Q: why?\nA:"))
	answer := turn1["choices"].([]any)[0].(map[string]any)["text"].(string)
	turn2 := ts.postJSON(t, "/v1/completions", complBody(t, map[string]any{"max_tokens": 4}, "Q: why?\nA:"+answer+"\nQ: and?"))
	p := len("Q: why?\nA:") + 64 + len("\nQ: and?")
	checkUsage(t, turn2["usage"], p, 4, (len("Q: why?\nA:")+64-1)/16*16)

	// The counters are published when the scheduler ends its round, which
	// may come just after the last answer reached the client.
	wantQ := float64(280 + 280 + 288 + 10 + p)
	testkit.Eventually(t, "the last request counted", func() bool {
		return ts.metrics(t)["vllm:prefix_cache_queries_total"].value >= wantQ
	})
	m := ts.metrics(t)
	if q, h := m["vllm:prefix_cache_queries_total"].value, m["vllm:prefix_cache_hits_total"].value; q != wantQ ||
		h != float64((280-1)/16*16+280/16*16+(len("Q: why?\nA:")+64-1)/16*16) {
		t.Errorf("queries %v hits %v", q, h)
	}

	// /reset_prefix_cache forgets everything.
	if code, _ := ts.post(t, "/reset_prefix_cache", ""); code != http.StatusOK {
		t.Fatalf("reset: %d", code)
	}
	again := ts.postJSON(t, "/v1/completions", body)
	checkUsage(t, again["usage"], 280, 4, 0)
}

// syncRecorder is a cacheObserver safe to read from the test goroutine.
type syncRecorder struct {
	mu sync.Mutex
	recorder
}

func (r *syncRecorder) blockStored(h, p uint64, tokens []uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(tokens) != 4 {
		panic("stored block of the wrong size")
	}
	r.recorder.blockStored(h, p, tokens)
}

func (r *syncRecorder) blockRemoved(h uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recorder.blockRemoved(h)
}

func (r *syncRecorder) allCleared() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recorder.allCleared()
}

func TestLRUEvictionSmallCache(t *testing.T) {
	rec := &syncRecorder{}
	ts := startSim(t, func(c *config.Sim) {
		c.BlockSize, c.KVBlocks, c.MaxModelLen = 4, 8, 32
	}, withCacheObserver(rec))
	a := complBody(t, map[string]any{"max_tokens": 1}, "aaaaaaaaaaaaaaaaa") // 17 tokens: 5 blocks
	b := complBody(t, map[string]any{"max_tokens": 1}, "bbbbbbbbbbbbbbbbbbbbbbbbbbbbb")
	ts.postJSON(t, "/v1/completions", a)
	checkUsage(t, ts.postJSON(t, "/v1/completions", a)["usage"], 17, 1, 16)
	// b needs all 8 blocks: every block of a is evicted.
	ts.postJSON(t, "/v1/completions", b)
	checkUsage(t, ts.postJSON(t, "/v1/completions", a)["usage"], 17, 1, 0)
	// and a's blocks evicted b's, oldest (b's tail) first: b keeps 3 blocks.
	checkUsage(t, ts.postJSON(t, "/v1/completions", b)["usage"], 29, 1, 12)

	// The observer saw every store and eviction. Stored: a 4, b 7, a 4,
	// b 4 (its 3 surviving blocks were hits). Evicted: a's 4 by b, 4 of
	// b's by a, a's 4 by b again.
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.stored) != 4+7+4+4 || len(rec.removed) != 4+4+4 {
		t.Errorf("observer: %d stored, %d removed", len(rec.stored), len(rec.removed))
	}
}

func TestMetricsNamesAndGauges(t *testing.T) {
	ts := startSim(t, func(c *config.Sim) {
		c.TimeScale = 0.2 // a step is about a millisecond
		c.MaxNumSeqs = 1
		c.ServedModelName = "served"
	})
	m := ts.metrics(t)
	for _, name := range []string{
		"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:cache_config_info",
		"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
	} {
		d, ok := m[name]
		if !ok {
			t.Errorf("metric %s missing", name)
			continue
		}
		if d.labels["model_name"] != "served" {
			t.Errorf("%s labels %v", name, d.labels)
		}
	}
	if cc := m["vllm:cache_config_info"]; cc.labels["block_size"] != "16" || cc.labels["num_gpu_blocks"] != "4096" || cc.value != 1 {
		t.Errorf("cache_config_info %v %v", cc.labels, cc.value)
	}

	// Three long streams with --max-num-seqs 1: one runs, two wait.
	ctx, cancel := context.WithCancel(t.Context())
	body := chatBody(t, map[string]any{"model": "served", "max_tokens": 4000, "stream": true}, "long")
	for range 3 {
		resp := ts.stream(t, ctx, "/v1/chat/completions", body)
		defer resp.Body.Close()
	}
	testkit.Eventually(t, "1 running, 2 waiting", func() bool {
		m := ts.metrics(t)
		return m["vllm:num_requests_running"].value == 1 && m["vllm:num_requests_waiting"].value == 2 &&
			m["vllm:kv_cache_usage_perc"].value > 0
	})
	cancel()
	testkit.Eventually(t, "queue empty after the clients left", func() bool {
		m := ts.metrics(t)
		return m["vllm:num_requests_running"].value == 0 && m["vllm:num_requests_waiting"].value == 0 &&
			m["vllm:kv_cache_usage_perc"].value == 0
	})
}

func TestDisconnectFreesSequence(t *testing.T) {
	ts := startSim(t, func(c *config.Sim) { c.TimeScale = 0.2 })
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp := ts.stream(t, ctx, "/v1/chat/completions", chatBody(t, map[string]any{"max_tokens": 4000, "stream": true}, "bye"))
	r := &sseReader{r: newBufReader(resp.Body)}
	for i := range 3 {
		if _, err := r.next(); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	if got := ts.gauge(t, "vllm:num_requests_running"); got != 1 {
		t.Fatalf("running %v while streaming", got)
	}
	cancel() // the client goes away mid-stream
	resp.Body.Close()
	testkit.Eventually(t, "running back to 0", func() bool { return ts.gauge(t, "vllm:num_requests_running") == 0 })
	m := ts.metrics(t)
	if m["vllm:request_success_total"].value != 0 || m["vllm:generation_tokens_total"].value >= 4000 {
		t.Errorf("sequence was not aborted: success %v, generated %v", m["vllm:request_success_total"].value, m["vllm:generation_tokens_total"].value)
	}
	if m["vllm:kv_cache_usage_perc"].value != 0 {
		t.Errorf("blocks still held: usage %v", m["vllm:kv_cache_usage_perc"].value)
	}
}

func TestErrorRate(t *testing.T) {
	ts := startSim(t, func(c *config.Sim) { c.ErrorRate = 1 })
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		body := chatBody(t, nil, "x")
		if path == "/v1/completions" {
			body = complBody(t, nil, "x")
		}
		code, b := ts.post(t, path, body)
		if code != http.StatusInternalServerError {
			t.Fatalf("%s: status %d", path, code)
		}
		checkEnvelope(t, b, 500, "InternalServerError")
	}
}

func checkEnvelope(t *testing.T, b []byte, code int, typ string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("envelope %s: %v", b, err)
	}
	if e.Error.Message == "" || e.Error.Type != typ || e.Error.Code != code {
		t.Errorf("envelope %s, want type %s code %d", b, typ, code)
	}
}

func TestRequestErrors(t *testing.T) {
	ts := startSim(t, func(c *config.Sim) { c.MaxModelLen = 64 })
	for _, tc := range []struct {
		name, path, body string
		code             int
		typ              string
	}{
		{"bad json", "/v1/chat/completions", `{"model":`, 400, "BadRequestError"},
		{"not an object", "/v1/completions", `[1,2]`, 400, "BadRequestError"},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, 404, "NotFoundError"},
		{"wrong type", "/v1/completions", `{"prompt":"x","max_tokens":"many"}`, 400, "BadRequestError"},
		{"no messages", "/v1/chat/completions", `{"model":"sim-model"}`, 400, "BadRequestError"},
		{"no prompt", "/v1/completions", `{}`, 400, "BadRequestError"},
		{"max_tokens 0", "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400, "BadRequestError"},
		{"too long", "/v1/completions", `{"prompt":"x","max_tokens":64}`, 400, "BadRequestError"},
		{"prompt too long", "/v1/completions", `{"prompt":"` + strings.Repeat("x", 64) + `"}`, 400, "BadRequestError"},
		{"stream_options without stream", "/v1/completions", `{"prompt":"x","stream_options":{"include_usage":true}}`, 400, "BadRequestError"},
		{"n=0", "/v1/completions", `{"prompt":"x","n":0}`, 400, "BadRequestError"},
		{"n too large", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"n":129}`, 400, "BadRequestError"},
		{"n not an integer", "/v1/completions", `{"prompt":"x","n":1.5}`, 400, "BadRequestError"},
		{"token out of vocabulary", "/v1/completions", `{"prompt":[1,2,300]}`, 400, "BadRequestError"},
		{"image part", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "BadRequestError"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, b := ts.post(t, tc.path, tc.body)
			if code != tc.code {
				t.Fatalf("status %d, want %d: %s", code, tc.code, b)
			}
			checkEnvelope(t, b, tc.code, tc.typ)
		})
	}
	// Default max_tokens is clamped to the context left.
	m := ts.postJSON(t, "/v1/completions", `{"prompt":"`+strings.Repeat("y", 60)+`"}`)
	checkUsage(t, m["usage"], 60, 4, 0)

	if code, _ := ts.get(t, "/v1/chat/completions"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET chat: %d", code)
	}
	if code, _ := ts.get(t, "/nope"); code != http.StatusNotFound {
		t.Errorf("unknown path: %d", code)
	}
}

func TestDieAfterTokens(t *testing.T) {
	var code atomic.Int32
	code.Store(-1)
	ts := startSim(t, func(c *config.Sim) { c.DieAfterTokens = 5 }, WithExit(func(c int) { code.Store(int32(c)) }))
	resp := ts.stream(t, t.Context(), "/v1/completions", complBody(t, map[string]any{"max_tokens": 20, "stream": true}, "crash"))
	events, err := readAllEvents(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Errorf("stream ended cleanly; want a dropped connection")
	}
	if len(events) != 5 {
		t.Errorf("got %d events before the crash, want 5: %q", len(events), events)
	}
	for _, ev := range events {
		if ev == "[DONE]" {
			t.Errorf("[DONE] sent by a crashed engine")
		}
	}
	if got := code.Load(); got != 1 {
		t.Fatalf("exit code %d, want 1", got)
	}
	// A dead engine answers nothing.
	if _, err := ts.client.Post(ts.url+"/v1/completions", "application/json", strings.NewReader(complBody(t, nil, "x"))); err == nil {
		t.Errorf("request to a dead engine succeeded")
	}
}

func TestDeterministicText(t *testing.T) {
	text := func(ts *testSim, prompt string) string {
		m := ts.postJSON(t, "/v1/completions", complBody(t, map[string]any{"max_tokens": 40}, prompt))
		return m["choices"].([]any)[0].(map[string]any)["text"].(string)
	}
	a := startSim(t, func(c *config.Sim) { c.Seed = 7 })
	b := startSim(t, func(c *config.Sim) { c.Seed = 7 })
	c := startSim(t, func(c *config.Sim) { c.Seed = 8 })
	if x, y := text(a, "p"), text(b, "p"); x != y {
		t.Errorf("same seed and prompt: %q vs %q", x, y)
	}
	if text(a, "p") == text(a, "q") {
		t.Errorf("different prompts gave the same text")
	}
	if text(a, "p") == text(c, "p") {
		t.Errorf("different seeds gave the same text")
	}
	// A shorter answer is a prefix of a longer one.
	short := a.postJSON(t, "/v1/completions", complBody(t, map[string]any{"max_tokens": 9}, "p"))
	if s := short["choices"].([]any)[0].(map[string]any)["text"].(string); !strings.HasPrefix(text(a, "p"), s) {
		t.Errorf("%q is not a prefix", s)
	}
}

func TestTokenize(t *testing.T) {
	ts := startSim(t, nil)
	m := ts.postJSON(t, "/tokenize", `{"model":"sim-model","prompt":"hi\u00e9"}`)
	if m["count"] != 4.0 || m["max_model_len"] != 8192.0 {
		t.Errorf("tokenize %v", m)
	}
	toks := m["tokens"].([]any)
	want := []float64{'h', 'i', 0xc3, 0xa9}
	for i, w := range want {
		if toks[i] != w {
			t.Errorf("token %d = %v, want %v", i, toks[i], w)
		}
	}
	if v, ok := m["token_strs"]; !ok || v != nil {
		t.Errorf("token_strs %v", m)
	}
	chat := ts.postJSON(t, "/tokenize", `{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"add_generation_prompt":false}`)
	// Text parts are joined with "\n", as vLLM and the router's bytes
	// tokenizer do.
	rendered := "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n"
	if chat["count"] != float64(len(rendered)) {
		t.Errorf("chat tokenize count %v, want %d", chat["count"], len(rendered))
	}
}

func TestModelsAndHealth(t *testing.T) {
	ts := startSim(t, func(c *config.Sim) {
		c.ServedModelName = "alias"
		c.SlowStart = 300 * time.Millisecond
	})
	if code, _ := ts.get(t, "/health"); code != http.StatusServiceUnavailable {
		t.Errorf("health during slow start: %d", code)
	}
	testkit.Eventually(t, "health 200", func() bool {
		code, b := ts.get(t, "/health")
		return code == http.StatusOK && len(b) == 0
	})
	_, b := ts.get(t, "/v1/models")
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			Object      string `json:"object"`
			OwnedBy     string `json:"owned_by"`
			Root        string `json:"root"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	if list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != "alias" || list.Data[0].Object != "model" ||
		list.Data[0].Root != "sim-model" || list.Data[0].OwnedBy != "vllm" || list.Data[0].MaxModelLen != 8192 {
		t.Errorf("models %s", b)
	}
	// The served name replaces --model.
	if code, _ := ts.post(t, "/v1/completions", complBody(t, nil, "x")); code != http.StatusNotFound {
		t.Errorf("--model name accepted next to --served-model-name: %d", code)
	}
	if code, _ := ts.post(t, "/v1/completions", complBody(t, map[string]any{"model": "alias"}, "x")); code != http.StatusOK {
		t.Errorf("served name refused: %d", code)
	}
}

func TestHangBeforeFirstToken(t *testing.T) {
	ts := startSim(t, func(c *config.Sim) { c.HangBeforeFirstToken = 1 })
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp := ts.stream(t, ctx, "/v1/chat/completions", chatBody(t, map[string]any{"stream": true}, "hang"))
	testkit.Eventually(t, "hung request counted as running", func() bool { return ts.gauge(t, "vllm:num_requests_running") == 1 })
	cancel()
	resp.Body.Close()
	testkit.Eventually(t, "hung request released", func() bool { return ts.gauge(t, "vllm:num_requests_running") == 0 })

	// A unary hung request is released when its client goes away too.
	ctx2, cancel2 := context.WithCancel(t.Context())
	done := make(chan struct{})
	unary := complBody(t, nil, "x")
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx2, http.MethodPost, ts.url+"/v1/completions", strings.NewReader(unary))
		if resp, err := ts.client.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	testkit.Eventually(t, "unary hung", func() bool { return ts.gauge(t, "vllm:num_requests_running") == 1 })
	cancel2()
	<-done
	testkit.Eventually(t, "unary released", func() bool { return ts.gauge(t, "vllm:num_requests_running") == 0 })
}

func TestTimedLoadFinishes(t *testing.T) {
	// Many concurrent requests through the timed step loop all complete
	// with the right number of tokens.
	ts := startSim(t, func(c *config.Sim) {
		c.TimeScale = 0.01
		c.MaxNumSeqs = 4
		c.MaxNumBatchedTokens = 64
	})
	errs := make(chan error, 16)
	for i := range 16 {
		body := complBody(t, map[string]any{"max_tokens": 10 + i, "stream": i%2 == 0}, strings.Repeat("z", 100+i))
		go func() {
			resp, err := ts.client.Post(ts.url+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			if i%2 == 0 {
				events, err := readAllEvents(resp.Body)
				if err == nil && len(events) != 10+i+1 {
					err = errorf("stream %d: %d events", i, len(events))
				}
				errs <- err
				return
			}
			var m map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
				errs <- err
				return
			}
			if len(m["choices"].([]any)[0].(map[string]any)["text"].(string)) != 10+i {
				errs <- errorf("unary %d: wrong length", i)
				return
			}
			errs <- nil
		}()
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	m := ts.metrics(t)
	if m["vllm:request_success_total"].value != 16 || m["vllm:kv_cache_usage_perc"].value != 0 {
		t.Errorf("success %v usage %v", m["vllm:request_success_total"].value, m["vllm:kv_cache_usage_perc"].value)
	}
}

func TestShutdownEndsStreams(t *testing.T) {
	ts := startSim(t, func(c *config.Sim) { c.TimeScale = 0.2 })
	resp := ts.stream(t, t.Context(), "/v1/completions", complBody(t, map[string]any{"max_tokens": 4000, "stream": true}, "stop"))
	defer resp.Body.Close()
	r := &sseReader{r: newBufReader(resp.Body)}
	if _, err := r.next(); err != nil {
		t.Fatal(err)
	}
	if err := ts.stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	events, err := readAllEvents(r.r)
	if err == nil {
		t.Errorf("stream ended cleanly after %d events; want it cut", len(events))
	}
	for _, ev := range events {
		if ev == "[DONE]" {
			t.Errorf("[DONE] from a stopped engine")
		}
	}
}

func TestRunLogsBoundAddress(t *testing.T) {
	cfg := config.DefaultSim()
	cfg.Port, cfg.TimeScale = 0, 0
	logs := &testkit.LogSink{}
	srv, err := New(cfg, zerolog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	var addr string
	testkit.Eventually(t, "sim listening log line", func() bool {
		for _, line := range strings.Split(logs.String(), "\n") {
			var l struct{ Message, Addr string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Message == "sim listening" {
				addr = l.Addr
				return true
			}
		}
		return false
	})
	if addr != srv.Addr() || strings.HasSuffix(addr, ":0") {
		t.Errorf("logged addr %q, Addr() %q", addr, srv.Addr())
	}
	resp, err := http.Get("http://" + addr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("health %d", resp.StatusCode)
	}
	http.DefaultClient.CloseIdleConnections()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(t.Context(), ln); !errors.Is(err, ErrServed) {
		t.Errorf("second Serve: %v", err)
	}
}

// Serve with a context already cancelled returns (and is ready first); a
// hang fails by the test timeout. 100 runs.
func TestServeCancelledContextReturns(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	cfg := config.DefaultSim()
	cfg.Port, cfg.TimeScale = 0, 0
	for i := range 100 {
		srv, err := New(cfg, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Serve(ctx, ln); err != nil {
			t.Fatalf("run %d: Serve: %v", i, err)
		}
		select {
		case <-srv.Ready():
		default:
			t.Fatalf("run %d: Ready not closed after Serve", i)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	cfg := config.DefaultSim()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	cfg.Port, cfg.ErrorRate, cfg.TimeScale, cfg.KVBlocks = -1, 1.5, -1, 10
	err := cfg.Validate()
	if !errors.Is(err, config.ErrInvalid) {
		t.Fatalf("err %v", err)
	}
	for _, flag := range []string{"--port", "--error-rate", "--time-scale", "--kv-blocks"} {
		if !strings.Contains(err.Error(), flag) {
			t.Errorf("%s not reported: %v", flag, err)
		}
	}
	if _, err := New(cfg, zerolog.Nop()); !errors.Is(err, config.ErrInvalid) {
		t.Errorf("New accepted an invalid config: %v", err)
	}
}
