package router_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/router"
)

// TestModelRetrieve: GET /v1/models/{id} answers the model object of a
// served model (an id with a slash too, escaped or not) and 404 in the
// OpenAI envelope for a model no active worker serves.
func TestModelRetrieve(t *testing.T) {
	a, b, c := jsonUpstream(t), jsonUpstream(t), jsonUpstream(t)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(),
		record(a, "m1", discovery.StatusActive), record(b, "org/m2", discovery.StatusActive), record(c, "m3", discovery.StatusDraining))
	for _, tc := range []struct{ path, id string }{
		{"/v1/models/m1", "m1"},
		{"/v1/models/org/m2", "org/m2"},
		{"/v1/models/org%2Fm2", "org/m2"},
	} {
		resp, body := tr.do(t, http.MethodGet, tc.path, "")
		var m struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Created int64  `json:"created"`
			OwnedBy string `json:"owned_by"`
		}
		if err := json.Unmarshal(body, &m); err != nil || resp.StatusCode != 200 || m.ID != tc.id || m.Object != "model" || m.Created == 0 || m.OwnedBy == "" {
			t.Fatalf("GET %s = %d %s (%v)", tc.path, resp.StatusCode, body, err)
		}
	}
	for _, path := range []string{"/v1/models/nope", "/v1/models/m3"} {
		resp, body := tr.do(t, http.MethodGet, path, "")
		wantError(t, resp, body, http.StatusNotFound, "model_not_found")
	}
	resp, body := tr.do(t, http.MethodPost, "/v1/models/m1", "")
	wantError(t, resp, body, http.StatusMethodNotAllowed, "method_not_allowed")
	if v, ok := tr.metric(t, `infera_requests_total{outcome="model_not_found",route="model"}`); !ok || v != 2 {
		t.Fatalf("model_not_found metric %v %v", v, ok)
	}
}

// TestEngine4xxPassedThrough: a worker's 4xx reaches the client with the
// worker's own status and body, byte for byte, unary or asked as a stream;
// it is not retried elsewhere nor rewritten.
func TestEngine4xxPassedThrough(t *testing.T) {
	const engineErr = `{"object":"error","message":"This model's maximum context length is 8 tokens.","type":"BadRequestError","param":null,"code":400}`
	var calls sync.Map
	bad := func(status int) *upstream {
		var u *upstream
		u = startUpstream(t, func(ctx *fasthttp.RequestCtx) {
			n, _ := calls.LoadOrStore(u.addr, new(int))
			*n.(*int)++
			ctx.SetStatusCode(status)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(engineErr)
		})
		return u
	}
	for _, status := range []int{400, 422, 413} {
		a, b := bad(status), bad(status)
		cfg := router.DefaultConfig()
		cfg.MaxRetries = 3
		tr := startRouter(t, router.RoundRobin{}, cfg, record(a, "m", discovery.StatusActive), record(b, "m", discovery.StatusActive))
		for _, stream := range []string{"false", "true"} {
			resp, body := tr.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"m","stream":`+stream+`,"messages":[{"role":"user","content":"hi"}]}`)
			if resp.StatusCode != status || string(body) != engineErr || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("%d stream=%s: got %d %q %q, want the engine's own answer", status, stream, resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
		}
		total := 0
		calls.Range(func(_, v any) bool { total += *v.(*int); return true })
		if total != 2 {
			t.Fatalf("%d: %d worker calls for 2 requests: a 4xx must not be retried", status, total)
		}
		calls.Clear()
	}
}

// TestEngine4xxFromSim: the simulator's own 400 (a prompt over its context
// length, vLLM's message) comes back through the router, unary or asked as
// a stream, as the engine wrote it.
func TestEngine4xxFromSim(t *testing.T) {
	s := startSim(t, func(c *config.Sim) { c.MaxModelLen = 64 })
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), simRecord(s))
	for _, stream := range []string{"false", "true"} {
		engine4xxFromSim(t, tr, s, `{"model":"sim-model","stream":`+stream+`,"messages":[{"role":"user","content":"`+strings.Repeat("long ", 20)+`"}]}`)
	}
}

func engine4xxFromSim(t *testing.T, tr *testRouter, s *upstream, req string) {
	t.Helper()
	resp, body := tr.do(t, http.MethodPost, "/v1/chat/completions", req)
	direct, err := http.Post("http://"+s.addr+"/v1/chat/completions", "application/json", strings.NewReader(req))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Body.Close()
	want, err := io.ReadAll(direct.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 400 || direct.StatusCode != 400 || !strings.Contains(string(body), "maximum context length is 64 tokens") ||
		strings.ReplaceAll(string(body), " ", "") != strings.ReplaceAll(string(want), " ", "") {
		t.Fatalf("through the router %d %s; the sim itself %d %s", resp.StatusCode, body, direct.StatusCode, want)
	}
}

// holdUpstream answers every request after release is closed.
func holdUpstream(t *testing.T, release <-chan struct{}, entered chan<- struct{}) *upstream {
	var u *upstream
	u = startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/v1/chat/completions" {
			entered <- struct{}{}
			<-release
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"object":"list","worker":"` + u.addr + `"}`)
	})
	return u
}

// TestEmbeddingsAndResponsesRoutedByLoad: POST /v1/embeddings and
// /v1/responses go to a worker of the model, the least loaded one whatever
// the router's policy (round robin here), with the body as the client sent
// it (no cache hints, even for a vLLM worker).
func TestEmbeddingsAndResponsesRoutedByLoad(t *testing.T) {
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	a, b := holdUpstream(t, release, entered), holdUpstream(t, release, entered)
	ra, rb := record(a, "m", discovery.StatusActive), record(b, "m", discovery.StatusActive)
	ra.Engine, rb.Engine = discovery.EngineVLLM, discovery.EngineVLLM
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), ra, rb)

	// One chat held on one worker: the other is the less loaded.
	held := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, tr.url+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hold"}]}`))
		resp, err := tr.client.Do(req)
		if err != nil {
			held <- ""
			return
		}
		resp.Body.Close()
		held <- resp.Header.Get("X-Infera-Worker")
	}()
	<-entered
	busy := a.addr
	if len(b.seen()) > 0 {
		busy = b.addr
	}
	bodies := map[string]string{
		"/v1/embeddings": `{"model":"m","input":["one","two"],"encoding_format":"float"}`,
		"/v1/responses":  `{"model":"m","input":"hello","max_output_tokens":4}`,
	}
	for path, body := range bodies {
		for range 4 {
			resp, out := tr.do(t, http.MethodPost, path, body)
			if resp.StatusCode != 200 || !strings.Contains(string(out), `"object":"list"`) {
				t.Fatalf("%s: %d %s", path, resp.StatusCode, out)
			}
			if w := resp.Header.Get("X-Infera-Worker"); w == busy {
				t.Fatalf("%s went to %s, the worker holding a request", path, w)
			}
		}
	}
	close(release)
	if w := <-held; w != busy {
		t.Fatalf("held chat answered by %q, want %s", w, busy)
	}
	idle := a
	if busy == a.addr {
		idle = b
	}
	n := 0
	for _, sr := range idle.seen() {
		if want, ok := bodies[sr.Path]; ok {
			n++
			if string(sr.Body) != want {
				t.Fatalf("%s reached the worker as %s, want the client's body %s", sr.Path, sr.Body, want)
			}
		}
	}
	if n != 8 {
		t.Fatalf("the idle worker got %d embeddings/responses requests, want 8", n)
	}
	resp, body := tr.do(t, http.MethodPost, "/v1/embeddings", `{"model":"nope","input":"x"}`)
	wantError(t, resp, body, http.StatusNotFound, "model_not_found")
}

// TestTokenizeEndpoints: POST /tokenize and /detokenize are answered by the
// router's tokenizer in vLLM's shapes (here the bytes tokenizer: one token
// per byte, ChatML chat rendering), and fail clearly without one.
func TestTokenizeEndpoints(t *testing.T) {
	u := jsonUpstream(t)
	p := newKV(t, kvConfig(func(c *router.KVAwareConfig) { c.TokenizerSpec = "bytes" }))
	tr := startRouter(t, p, router.DefaultConfig(), record(u, "m", discovery.StatusActive))

	var tok struct {
		Count     int      `json:"count"`
		Tokens    []uint32 `json:"tokens"`
		TokenStrs any      `json:"token_strs"`
	}
	resp, body := tr.do(t, http.MethodPost, "/tokenize", `{"model":"m","prompt":"hi\u00e9"}`)
	if err := json.Unmarshal(body, &tok); err != nil || resp.StatusCode != 200 || tok.Count != 4 ||
		len(tok.Tokens) != 4 || tok.Tokens[0] != 'h' || tok.Tokens[2] != 0xc3 {
		t.Fatalf("tokenize prompt: %d %s (%v)", resp.StatusCode, body, err)
	}
	resp, body = tr.do(t, http.MethodPost, "/tokenize", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	const rendered = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
	if err := json.Unmarshal(body, &tok); err != nil || resp.StatusCode != 200 || tok.Count != len(rendered) || string(bytesOf(tok.Tokens)) != rendered {
		t.Fatalf("tokenize messages: %d %s (%v)", resp.StatusCode, body, err)
	}
	resp, body = tr.do(t, http.MethodPost, "/detokenize", `{"model":"m","tokens":[104, 105,34]}`)
	if resp.StatusCode != 200 || string(body) != `{"prompt":"hi\""}` {
		t.Fatalf("detokenize: %d %s", resp.StatusCode, body)
	}
	for _, tc := range []struct {
		path, body string
		status     int
		code       string
	}{
		{"/tokenize", `{"model":"m"}`, 400, "invalid_request"},
		{"/tokenize", `{"model":"m","prompt":[1,2]}`, 400, "invalid_request"},
		{"/tokenize", `{"model":"nope","prompt":"x"}`, 404, "model_not_found"},
		{"/detokenize", `{"model":"m","tokens":[-1]}`, 400, "invalid_body"},
		{"/detokenize", `{"model":"m","tokens":"x"}`, 400, "invalid_body"},
		{"/detokenize", `{"model":"m"}`, 400, "invalid_request"},
		{"/detokenize", `{"model":"m","tokens":[1]`, 400, "invalid_body"},
	} {
		resp, body := tr.do(t, http.MethodPost, tc.path, tc.body)
		wantError(t, resp, body, tc.status, tc.code)
	}
	resp, body = tr.do(t, http.MethodGet, "/tokenize", "")
	wantError(t, resp, body, http.StatusMethodNotAllowed, "method_not_allowed")

	// Without a router tokenizer: 501, saying how to get one.
	plain := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), record(u, "m", discovery.StatusActive))
	for _, path := range []string{"/tokenize", "/detokenize"} {
		resp, body := plain.do(t, http.MethodPost, path, `{"model":"m","prompt":"x","tokens":[1]}`)
		wantError(t, resp, body, http.StatusNotImplemented, "tokenizer_unavailable")
		if !strings.Contains(string(body), "--tokenizer") {
			t.Fatalf("%s without a tokenizer: %s does not say how to get one", path, body)
		}
	}
}

func bytesOf(ids []uint32) []byte {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = byte(id)
	}
	return b
}

// TestStreamIncludeUsage: stream_options.include_usage goes to the engine
// as the client sent it and the engine's final usage chunk (empty choices)
// comes back before [DONE]; without it no chunk carries usage.
func TestStreamIncludeUsage(t *testing.T) {
	s := startSim(t, nil)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), simRecord(s))
	for _, tc := range []struct{ path, input string }{
		{"/v1/chat/completions", `"messages":[{"role":"user","content":"usage please"}]`},
		{"/v1/completions", `"prompt":"usage please"`},
	} {
		for _, usage := range []bool{true, false} {
			opt := ""
			if usage {
				opt = `,"stream_options":{"include_usage":true}`
			}
			resp, body := tr.do(t, http.MethodPost, tc.path, `{"model":"sim-model","max_tokens":3,"stream":true`+opt+`,`+tc.input+`}`)
			events := strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n")
			if resp.StatusCode != 200 || len(events) < 2 || events[len(events)-1] != "data: [DONE]" {
				t.Fatalf("%s usage=%v: %d %q", tc.path, usage, resp.StatusCode, body)
			}
			withUsage := 0
			for i, ev := range events[:len(events)-1] {
				var chunk struct {
					Choices []json.RawMessage `json:"choices"`
					Usage   *struct {
						PromptTokens     int `json:"prompt_tokens"`
						CompletionTokens int `json:"completion_tokens"`
						TotalTokens      int `json:"total_tokens"`
					} `json:"usage"`
				}
				if err := json.Unmarshal([]byte(strings.TrimPrefix(ev, "data: ")), &chunk); err != nil {
					t.Fatalf("%s event %d %q: %v", tc.path, i, ev, err)
				}
				if chunk.Usage == nil {
					continue
				}
				withUsage++
				if i != len(events)-2 || len(chunk.Choices) != 0 || chunk.Usage.CompletionTokens != 3 ||
					chunk.Usage.TotalTokens != chunk.Usage.PromptTokens+3 {
					t.Fatalf("%s: usage in event %d of %d: %s", tc.path, i, len(events), ev)
				}
			}
			if want := map[bool]int{true: 1, false: 0}[usage]; withUsage != want {
				t.Fatalf("%s include_usage=%v: %d usage chunks, want %d\n%s", tc.path, usage, withUsage, want, body)
			}
		}
	}
}

// TestEmbeddingsThroughSim: the simulator's embeddings come back through
// the router unchanged (deterministic: the same input twice, two workers).
func TestEmbeddingsThroughSim(t *testing.T) {
	s1, s2 := startSim(t, nil), startSim(t, nil)
	r1, r2 := simRecord(s1), simRecord(s2)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), r1, r2)
	var first string
	workers := map[string]bool{}
	for i := range 4 {
		resp, body := tr.do(t, http.MethodPost, "/v1/embeddings", `{"model":"sim-model","input":"embed me","encoding_format":"float"}`)
		var out struct {
			Data []struct {
				Embedding []float64 `json:"embedding"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &out); err != nil || resp.StatusCode != 200 || len(out.Data) != 1 || len(out.Data[0].Embedding) == 0 {
			t.Fatalf("embeddings: %d %s (%v)", resp.StatusCode, body, err)
		}
		vec, _ := json.Marshal(out.Data[0].Embedding)
		if i == 0 {
			first = string(vec)
		} else if string(vec) != first {
			t.Fatalf("embedding %d differs: %s vs %s", i, vec, first)
		}
		workers[resp.Header.Get("X-Infera-Worker")] = true
	}
	if len(workers) != 2 {
		t.Fatalf("least load with idle workers rotates: got %v", workers)
	}
}

// TestMessagesCacheControlForwarded: an Anthropic cache_control breakpoint
// reaches the engines as their retention hints (long: vLLM's
// kv_transfer_params.infera_retention, SGLang's priority 100).
func TestMessagesCacheControlForwarded(t *testing.T) {
	v, s := jsonUpstream(t), jsonUpstream(t)
	rv, rs := record(v, "m", discovery.StatusActive), record(s, "m2", discovery.StatusActive)
	rv.Engine, rs.Engine = discovery.EngineVLLM, discovery.EngineSGLang
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), rv, rs)
	for _, tc := range []struct {
		u     *upstream
		model string
		want  []string
	}{
		{v, "m", []string{`"prompt_cache_retention":"long"`, `"kv_transfer_params":{"infera_retention":"long"}`}},
		{s, "m2", []string{`"prompt_cache_retention":"long"`, `"priority":100`, `"infera_retention":"long"`}},
	} {
		tr.do(t, http.MethodPost, "/v1/messages", `{"model":"`+tc.model+`","max_tokens":4,"system":[{"type":"text","text":"long shared prefix","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"q"}]}`)
		seen := tc.u.seen()
		if len(seen) != 1 || seen[0].Path != "/v1/chat/completions" {
			t.Fatalf("%s: worker saw %+v", tc.model, seen)
		}
		for _, w := range tc.want {
			if !strings.Contains(string(seen[0].Body), w) {
				t.Fatalf("%s engine body %s lacks %s", tc.model, seen[0].Body, w)
			}
		}
	}
}

// TestResponsesStreamRelayed: a streamed /v1/responses answer (named SSE
// events) reaches the client byte for byte.
func TestResponsesStreamRelayed(t *testing.T) {
	const events = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\",\"sequence_number\":1}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2}\n\n"
	u := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyString(events)
	})
	tr := startRouter(t, router.LeastLoad{}, router.DefaultConfig(), record(u, "m", discovery.StatusActive))
	resp, body := tr.do(t, http.MethodPost, "/v1/responses", `{"model":"m","input":"hi","stream":true}`)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || string(body) != events {
		t.Fatalf("responses stream: %d %q\n%q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if seen := u.seen(); len(seen) != 1 || seen[0].Path != "/v1/responses" {
		t.Fatalf("worker saw %+v", seen)
	}
}
