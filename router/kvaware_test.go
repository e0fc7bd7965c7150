package router_test

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/kvcache"
	"github.com/infera/infera/router"
	"github.com/infera/infera/tokenizer"
)

// newKV builds a kv-aware policy closed with the test.
func newKV(t *testing.T, cfg router.KVAwareConfig) *router.KVAware {
	t.Helper()
	cfg.Subscriber.BackoffMin = 10 * time.Millisecond
	cfg.Subscriber.BackoffMax = 50 * time.Millisecond
	// Short, so fasthttp's pool cleaners are gone before goleak looks.
	cfg.EngineIdleConnTimeout = 50 * time.Millisecond
	p, err := router.NewKVAware(cfg, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

type cacheView struct {
	WorkerID   string `json:"worker_id"`
	DPRank     *int   `json:"dp_rank"`
	BlockCount int    `json:"block_count"`
	Mode       string `json:"mode"`
}

func (tr *testRouter) cacheView(t *testing.T, id, query string) (int, cacheView, []byte) {
	t.Helper()
	resp, body := tr.do(t, http.MethodGet, "/v1/admin/cache-view/"+id+query, "")
	var v cacheView
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(body, &v); err != nil {
			t.Fatalf("cache view %s: %v", body, err)
		}
	}
	return resp.StatusCode, v, body
}

// metric returns the value of the first /metrics sample whose line starts
// with prefix (a name, optionally with the start of its labels).
func (tr *testRouter) metric(t *testing.T, prefix string) (float64, bool) {
	t.Helper()
	_, body := tr.do(t, http.MethodGet, "/metrics", "")
	for line := range strings.SplitSeq(string(body), "\n") {
		if strings.HasPrefix(line, prefix) {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			return v, true
		}
	}
	return 0, false
}

func TestKVDataParallelRankHeader(t *testing.T) {
	up := jsonUpstream(t)
	rec := record(up, "m", discovery.StatusActive)
	rec.DPSize = 2
	tr := startRouter(t, newKV(t, kvConfig(func(c *router.KVAwareConfig) { c.TokenizerSpec = router.TokenizerBytes })), router.DefaultConfig(), rec)
	for i := range 4 {
		resp, body := tr.do(t, http.MethodPost, "/v1/completions", `{"model":"m","prompt":"`+strings.Repeat(strconv.Itoa(i), 100)+`"}`)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	ranks := map[string]int{}
	for _, r := range up.seen() {
		ranks[r.Headers["X-Data-Parallel-Rank"]]++
	}
	if ranks["0"] != 2 || ranks["1"] != 2 {
		t.Fatalf("X-Data-Parallel-Rank seen %v, want ranks 0 and 1 twice each", ranks)
	}

	// A single-rank record is its own target: no header.
	up2 := jsonUpstream(t)
	rec2 := record(up2, "m", discovery.StatusActive)
	one := 1
	rec2.DPRank, rec2.DPSize = &one, 2
	tr2 := startRouter(t, newKV(t, kvConfig(func(c *router.KVAwareConfig) { c.TokenizerSpec = router.TokenizerBytes })), router.DefaultConfig(), rec2)
	tr2.chat(t, "m")
	if seen := up2.seen(); len(seen) != 1 || seen[0].Headers["X-Data-Parallel-Rank"] != "" {
		t.Fatalf("single-rank worker got %v", seen)
	}
	if code, v, body := tr2.cacheView(t, rec2.WorkerID, ""); code != 200 || v.DPRank == nil || *v.DPRank != 1 {
		t.Fatalf("cache view %d %s", code, body)
	}
}

func TestKVCacheViewEndpoint(t *testing.T) {
	up := jsonUpstream(t)
	rec := record(up, "m", discovery.StatusActive)
	dp := record(jsonUpstream(t), "m", discovery.StatusActive)
	dp.DPSize = 3
	tr := startRouter(t, newKV(t, kvConfig(func(c *router.KVAwareConfig) { c.TokenizerSpec = router.TokenizerBytes })), router.DefaultConfig(), rec, dp)

	code, v, body := tr.cacheView(t, rec.WorkerID, "")
	if code != 200 || v.WorkerID != rec.WorkerID || v.DPRank == nil || *v.DPRank != 0 || v.BlockCount != 0 || v.Mode != "approximate" {
		t.Fatalf("fresh worker: %d %s", code, body)
	}
	// The router records its own placements for a worker without events.
	tr.do(t, http.MethodPost, "/v1/completions", `{"model":"m","prompt":"`+strings.Repeat("a", 64)+`"}`)
	tr.do(t, http.MethodPost, "/v1/completions", `{"model":"m","prompt":"`+strings.Repeat("a", 64)+`"}`)
	total := 0
	for _, id := range []string{rec.WorkerID, dp.WorkerID} {
		_, v, _ := tr.cacheView(t, id, "")
		total += v.BlockCount
	}
	if total != 4 {
		t.Fatalf("placements %d blocks, want 4 (one 64-token prompt, recorded once)", total)
	}
	if code, v, body := tr.cacheView(t, dp.WorkerID, ""); code != 200 || v.DPRank != nil {
		t.Fatalf("dp worker without rank: %d %s", code, body)
	}
	if code, v, body := tr.cacheView(t, dp.WorkerID, "?dp_rank=2"); code != 200 || v.DPRank == nil || *v.DPRank != 2 {
		t.Fatalf("dp worker rank 2: %d %s", code, body)
	}

	resp, body := tr.do(t, http.MethodGet, "/v1/admin/cache-view/nobody:1", "")
	wantError(t, resp, body, http.StatusNotFound, "worker_not_found")
	resp, body = tr.do(t, http.MethodGet, "/v1/admin/cache-view/"+dp.WorkerID+"?dp_rank=3", "")
	wantError(t, resp, body, http.StatusNotFound, "dp_rank_not_found")
	resp, body = tr.do(t, http.MethodGet, "/v1/admin/cache-view/"+rec.WorkerID+"?dp_rank=x", "")
	wantError(t, resp, body, http.StatusBadRequest, "invalid_dp_rank")
	resp, body = tr.do(t, http.MethodPost, "/v1/admin/cache-view/"+rec.WorkerID, "")
	wantError(t, resp, body, http.StatusMethodNotAllowed, "method_not_allowed")

	// Other policies keep no view.
	rr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), rec)
	resp, body = rr.do(t, http.MethodGet, "/v1/admin/cache-view/"+rec.WorkerID, "")
	wantError(t, resp, body, http.StatusNotFound, "cache_view_unavailable")

	if v, ok := tr.metric(t, `infera_requests_total{outcome="ok",route="cache_view"}`); !ok || v < 4 {
		t.Fatalf("cache_view requests metric %v %v", v, ok)
	}
}

func TestKVEngineTokenizer(t *testing.T) {
	// A worker whose /tokenize answers the bytes of the prompt.
	var up *upstream
	up = startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/tokenize" {
			var req struct {
				Prompt string `json:"prompt"`
			}
			if err := json.Unmarshal(ctx.PostBody(), &req); err != nil || req.Prompt == "" {
				ctx.Error("want a prompt", 400)
				return
			}
			ids := tokenizer.Bytes{}.Encode(req.Prompt)
			b, _ := json.Marshal(map[string]any{"count": len(ids), "max_model_len": 8192, "tokens": ids, "token_strs": nil})
			ctx.SetContentType("application/json")
			ctx.SetBody(b)
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"x","worker":"` + up.addr + `"}`)
	})
	tr := startRouter(t, newKV(t, kvConfig(func(c *router.KVAwareConfig) { c.TokenizerSpec = router.TokenizerEngine })), router.DefaultConfig(),
		record(up, "m", discovery.StatusActive))
	prompt := strings.Repeat("x", 40)
	if resp, body := tr.do(t, http.MethodPost, "/v1/completions", `{"model":"m","prompt":"`+prompt+`"}`); resp.StatusCode != 200 {
		t.Fatalf("status %d %s", resp.StatusCode, body)
	}
	seen := up.seen()
	if len(seen) != 2 || seen[0].Path != "/tokenize" || !strings.Contains(string(seen[0].Body), `"prompt":"`+prompt+`"`) {
		t.Fatalf("worker saw %+v", seen)
	}
	if v, _ := tr.metric(t, `infera_router_kv_picks_total{key="tokens"`); v != 1 {
		t.Fatalf("token-keyed picks %v, want 1", v)
	}
	if v, _ := tr.metric(t, `infera_router_kv_prompt_blocks_total`); v != 2 {
		t.Fatalf("prompt blocks %v, want 2 (40 tokens / 16)", v)
	}
	// A chat the worker cannot tokenize (this one only reads "prompt")
	// falls back to text keying, visibly.
	tr.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"`+strings.Repeat("y", 200)+`"}]}`)
	if v, _ := tr.metric(t, `infera_router_kv_picks_total{key="text"`); v != 1 {
		t.Fatalf("text-keyed picks %v, want 1", v)
	}
}

// startKVSim runs a simulator publishing KV events with a replay socket.
func startKVSim(t *testing.T, kvBlocks int) (u *upstream, events, replay *string) {
	t.Helper()
	u = startSim(t, func(c *config.Sim) {
		c.KVBlocks = kvBlocks
		c.MaxModelLen = 512
		c.TimeScale = 0
		c.KVEventsEndpoint = "tcp://127.0.0.1:0"
		c.KVEventsReplayEndpoint = "tcp://127.0.0.1:0"
	})
	e, r := u.kvEvents, u.kvReplay
	if e == "" || r == "" {
		t.Fatalf("simulator event endpoints %q %q", e, r)
	}
	return u, &e, &r
}

// TestKVSimEventsIntegration: simulator KV events over real ZMQ → the
// router's index → cache-view; eviction and a cache reset in the simulator
// show in the count.
func TestKVSimEventsIntegration(t *testing.T) {
	const kvBlocks = 64
	s, ev, rep := startKVSim(t, kvBlocks)
	rec := simRecord(s)
	bs := 16
	rec.KVEventsEndpoint, rec.KVEventsReplayEndpoint, rec.KVBlockSize = ev, rep, &bs
	p := newKV(t, kvConfig(func(c *router.KVAwareConfig) { c.TokenizerSpec = router.TokenizerBytes }))
	tr := startRouter(t, p, router.DefaultConfig(), rec)
	defer http.DefaultClient.CloseIdleConnections()

	testkit.Eventually(t, "the stream to be confirmed (precise)", func() bool {
		_, v, _ := tr.cacheView(t, rec.WorkerID, "")
		return v.Mode == "precise"
	})
	// Prompts distinct from their first byte, 200 tokens each: 12 full
	// blocks cached per request (max_tokens 1: the output token is never
	// computed, so never cached).
	prompt := func(i int) string { return strings.Repeat(string(rune('A'+i)), 200) }
	complete := func(i int) {
		t.Helper()
		resp, body := tr.do(t, http.MethodPost, "/v1/completions", `{"model":"sim-model","prompt":"`+prompt(i)+`","max_tokens":1}`)
		if resp.StatusCode != 200 {
			t.Fatalf("completion %d: %d %s", i, resp.StatusCode, body)
		}
	}
	for i := range 3 {
		complete(i)
	}
	testkit.Eventually(t, "36 blocks in the index", func() bool {
		_, v, _ := tr.cacheView(t, rec.WorkerID, "")
		return v.BlockCount == 36
	})
	// The router's match for prompt 0 is what the simulator hits.
	tok := tokenizer.Bytes{}.Encode(prompt(0))
	hashes := kvcache.AppendBlockHashes(nil, tok, bs)
	h, ok := p.Index().Lookup(kvcache.Key{Worker: rec.WorkerID})
	if !ok || p.Index().Match(h, hashes) != 12 {
		t.Fatalf("index match of prompt 0: %d, want 12", p.Index().Match(h, hashes))
	}
	hitsBefore, doneBefore := simGauge(t, s, "vllm:prefix_cache_hits_total"), simGauge(t, s, "vllm:request_success_total")
	complete(0)
	simPublished(t, s, doneBefore)
	if got := simGauge(t, s, "vllm:prefix_cache_hits_total") - hitsBefore; got != 12*16 {
		t.Fatalf("simulator hit %v tokens of prompt 0, want 192", got)
	}

	// Eviction: ten more prompts than fit. The index follows the cache:
	// never above its capacity, and prompt 0 is gone in both.
	for i := 3; i < 13; i++ {
		complete(i)
	}
	testkit.Eventually(t, "the index to follow evictions", func() bool {
		_, v, _ := tr.cacheView(t, rec.WorkerID, "")
		return v.BlockCount <= kvBlocks && p.Index().Match(h, hashes) == 0
	})
	_, v, _ := tr.cacheView(t, rec.WorkerID, "")
	if v.BlockCount < kvBlocks-13 {
		t.Fatalf("index holds %d blocks after eviction, want a full cache's", v.BlockCount)
	}
	// A cache reset (AllBlocksCleared) empties the view.
	resp, err := http.Post("http://"+s.addr+"/reset_prefix_cache", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	testkit.Eventually(t, "the count to drop to 0", func() bool {
		_, v, _ := tr.cacheView(t, rec.WorkerID, "")
		return v.BlockCount == 0
	})
	if v, ok := tr.metric(t, `infera_router_kv_events_applied_total{dp_rank="0",worker_id="`+rec.WorkerID+`"}`); !ok || v < 14 {
		t.Fatalf("events applied %v %v", v, ok)
	}
	if v, _ := tr.metric(t, `infera_router_worker_approximate{worker_id="`+rec.WorkerID+`"}`); v != 0 {
		t.Fatalf("approximate gauge %v for a precise worker", v)
	}
}

// TestKVChatTextPartsMatchSimulator: a chat whose content is a list of text
// parts renders to the same tokens in the router's bytes tokenizer and in
// the simulator (parts joined with "\n", as vLLM does), so the index matches
// what the simulator cached and the second identical request through
// kv-aware routing is a cache hit.
func TestKVChatTextPartsMatchSimulator(t *testing.T) {
	s, ev, rep := startKVSim(t, 64)
	rec := simRecord(s)
	bs := 16
	rec.KVEventsEndpoint, rec.KVEventsReplayEndpoint, rec.KVBlockSize = ev, rep, &bs
	p := newKV(t, kvConfig(func(c *router.KVAwareConfig) { c.TokenizerSpec = router.TokenizerBytes }))
	tr := startRouter(t, p, router.DefaultConfig(), rec)
	defer http.DefaultClient.CloseIdleConnections()
	testkit.Eventually(t, "the stream to be confirmed (precise)", func() bool {
		_, v, _ := tr.cacheView(t, rec.WorkerID, "")
		return v.Mode == "precise"
	})

	messages := `[{"role":"system","content":"` + strings.Repeat("s", 40) + `"},` +
		`{"role":"user","content":[{"type":"text","text":"` + strings.Repeat("a", 70) + `"},{"type":"text","text":"` + strings.Repeat("b", 70) + `"}]}]`
	rendered, err := tokenizer.Bytes{}.AppendRenderChat(nil, tokenizer.Chat{Messages: []byte(messages)})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rendered), strings.Repeat("a", 70)+"\n"+strings.Repeat("b", 70)) {
		t.Fatalf("router rendering %q does not join text parts with \\n", rendered)
	}
	routerTokens := tokenizer.Bytes{}.Encode(string(rendered))

	// The simulator's own tokenization of the same chat.
	resp, err := http.Post("http://"+s.addr+"/tokenize", "application/json",
		strings.NewReader(`{"model":"sim-model","messages":`+messages+`}`))
	if err != nil {
		t.Fatal(err)
	}
	var tok struct {
		Tokens []uint32 `json:"tokens"`
	}
	err = json.NewDecoder(resp.Body).Decode(&tok)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tok.Tokens, routerTokens) {
		t.Fatalf("simulator tokens %v\nrouter tokens    %v", tok.Tokens, routerTokens)
	}

	full := len(routerTokens) / bs
	chat := func() {
		t.Helper()
		resp, body := tr.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"sim-model","messages":`+messages+`,"max_tokens":1}`)
		if resp.StatusCode != 200 {
			t.Fatalf("chat: %d %s", resp.StatusCode, body)
		}
	}
	chat()
	hashes := kvcache.AppendBlockHashes(nil, routerTokens, bs)
	testkit.Eventually(t, "the index to match the whole chat", func() bool {
		h, ok := p.Index().Lookup(kvcache.Key{Worker: rec.WorkerID})
		return ok && p.Index().Match(h, hashes) == full
	})
	hitsBefore, doneBefore := simGauge(t, s, "vllm:prefix_cache_hits_total"), simGauge(t, s, "vllm:request_success_total")
	chat()
	simPublished(t, s, doneBefore)
	if got := simGauge(t, s, "vllm:prefix_cache_hits_total") - hitsBefore; got != float64(full*bs) {
		t.Fatalf("second identical chat hit %v tokens, want %d", got, full*bs)
	}
}

// TestKVRecordCapacityStandsAtOnce: the cache size a worker's record
// reports (kv_capacity_blocks) is its target's capacity from the start,
// before the engine has evicted anything; without one, nothing is known
// until the first removal.
func TestKVRecordCapacityStandsAtOnce(t *testing.T) {
	for _, reported := range []int{0, 64} {
		s, ev, rep := startKVSim(t, 64)
		rec := simRecord(s)
		bs := 16
		rec.KVEventsEndpoint, rec.KVEventsReplayEndpoint, rec.KVBlockSize = ev, rep, &bs
		rec.KVCapacityBlocks = reported
		p := newKV(t, kvConfig(func(c *router.KVAwareConfig) { c.TokenizerSpec = router.TokenizerBytes }))
		startRouter(t, p, router.DefaultConfig(), rec)
		h, ok := p.Index().Lookup(kvcache.Key{Worker: rec.WorkerID})
		if !ok {
			t.Fatalf("reported %d: no index entry for %s", reported, rec.WorkerID)
		}
		if got := h.Capacity(); got != reported {
			t.Fatalf("reported %d: capacity %d before any eviction", reported, got)
		}
	}
}
