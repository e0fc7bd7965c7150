package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/internal/testkit"
)

// fakeServer mimics an OpenAI-compatible engine behind `infera serve`: chat
// and completions, unary and SSE, usage with cached tokens (half the prompt),
// and an X-Infera-Worker header alternating between two workers.
type fakeServer struct {
	fakeBehaviour
	requests    atomic.Int64
	mu          sync.Mutex
	seenPrompts []string
	seenMsgs    []int
}

type fakeBehaviour struct {
	status     int           // answer every request with this status when not 0
	hang       chan struct{} // when not nil, block until closed (or the client goes)
	midError   bool          // send an error event after the first token
	noDone     bool          // end streams without [DONE]
	noUsage    bool          // never report usage
	tokenDelay time.Duration // between content chunks
}

type fakeRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
	Prompt        *string `json:"prompt"`
	MaxTokens     int     `json:"max_tokens"`
	Stream        bool    `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func (s *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/models" {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"fake-model","object":"model"}]}`)
		return
	}
	chat := r.URL.Path == "/v1/chat/completions"
	if !chat && r.URL.Path != "/v1/completions" {
		http.NotFound(w, r)
		return
	}
	n := s.requests.Add(1)
	var req fakeRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Model == "" || req.MaxTokens < 1 {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	prompt := ""
	if chat {
		parts := make([]string, len(req.Messages))
		for i, m := range req.Messages {
			parts[i] = m.Content
		}
		prompt = strings.Join(parts, "\n")
	} else if req.Prompt != nil {
		prompt = *req.Prompt
	}
	s.mu.Lock()
	s.seenPrompts = append(s.seenPrompts, prompt)
	s.seenMsgs = append(s.seenMsgs, len(req.Messages))
	s.mu.Unlock()
	w.Header().Set(WorkerHeader, fmt.Sprintf("w%d", n%2))
	if s.status != 0 {
		http.Error(w, `{"error":{"message":"injected"}}`, s.status)
		return
	}
	if s.hang != nil {
		select {
		case <-s.hang:
		case <-r.Context().Done():
		}
		return
	}
	promptTokens := len(strings.Fields(prompt))
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}`,
		promptTokens, req.MaxTokens, promptTokens+req.MaxTokens, promptTokens/2)
	if s.noUsage {
		usage = "null"
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		if chat {
			fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"%s"},"finish_reason":"length"}],"usage":%s}`,
				strings.Repeat("tok ", req.MaxTokens), usage)
		} else {
			fmt.Fprintf(w, `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"%s","finish_reason":"length"}],"usage":%s}`,
				strings.Repeat("tok ", req.MaxTokens), usage)
		}
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	send := func(data string) {
		fmt.Fprintf(w, "data: %s\n\n", data)
		fl.Flush()
	}
	if chat {
		send(`{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`)
	}
	for k := range req.MaxTokens {
		if k > 0 && s.tokenDelay > 0 {
			time.Sleep(s.tokenDelay)
		}
		if chat {
			send(`{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":null}]}`)
		} else {
			send(`{"id":"x","object":"text_completion","choices":[{"index":0,"text":"tok ","finish_reason":null}]}`)
		}
		if s.midError {
			send(`{"error":{"message":"engine died","type":"server_error"}}`)
			return
		}
	}
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage && !s.noUsage {
		send(`{"id":"x","object":"chat.completion.chunk","choices":[],"usage":` + usage + `}`)
	}
	if !s.noDone {
		send("[DONE]")
	}
}

func startFake(t *testing.T, s *fakeServer) string {
	t.Helper()
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv.URL
}

func baseOptions(url string) Options {
	return Options{
		URLs: []string{url}, Endpoint: EndpointChat, Stream: true, Seed: 1,
		Requests: 40, Concurrency: 4, MaxInflight: 64, Timeout: 10 * time.Second,
		Workload: WorkloadRandom, InputLen: 32, OutputLen: 5,
		PrefixGroups: 2, PrefixLen: 16, SuffixLen: 4, Sessions: 2, Turns: 2,
	}
}

func run(t *testing.T, o Options) *Report {
	t.Helper()
	rep, err := Run(t.Context(), o, zerolog.Nop())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return rep
}

func TestRunStreamingChat(t *testing.T) {
	fs := &fakeServer{}
	url := startFake(t, fs)
	o := baseOptions(url)
	var progress testkit.LogSink
	o.Progress, o.ProgressInterval = &progress, time.Millisecond
	fs.tokenDelay = time.Millisecond
	rep := run(t, o)
	if rep.Requests != 40 || rep.Completed != 40 || len(rep.Errors) != 0 {
		t.Fatalf("requests %d, completed %d, errors %v (%v)", rep.Requests, rep.Completed, rep.Errors, rep.ErrorSamples)
	}
	if rep.Config.Model != "fake-model" {
		t.Fatalf("model %q, want the one /v1/models lists", rep.Config.Model)
	}
	if rep.OutputTokens != 40*5 || rep.PromptTokens != 40*32 || rep.CachedTokens != 40*16 {
		t.Fatalf("tokens: %d out, %d prompt, %d cached", rep.OutputTokens, rep.PromptTokens, rep.CachedTokens)
	}
	if rep.CacheHitRatio != 0.5 {
		t.Fatalf("cache hit ratio %v, want 0.5", rep.CacheHitRatio)
	}
	if rep.PerWorker["w0"]+rep.PerWorker["w1"] != 40 || len(rep.PerWorker) != 2 {
		t.Fatalf("per worker %v", rep.PerWorker)
	}
	if rep.TTFT.P50 <= 0 || rep.E2E.P50 < rep.TTFT.P50 || rep.ITL.P50 <= 0 || rep.TPOT.P50 <= 0 {
		t.Fatalf("latencies ttft %+v itl %+v tpot %+v e2e %+v", rep.TTFT, rep.ITL, rep.TPOT, rep.E2E)
	}
	if rep.Throughput.ReqPerS <= 0 || rep.Throughput.OutputTokPerS <= 0 || rep.DurationS <= 0 {
		t.Fatalf("throughput %+v over %v s", rep.Throughput, rep.DurationS)
	}
	if len(rep.TTFTCDF) != 40 {
		t.Fatalf("CDF has %d points, want 40", len(rep.TTFTCDF))
	}
	// The same seed sends the same prompts.
	first := slices.Clone(fs.seenPrompts)
	fs.seenPrompts = nil
	run(t, o)
	slices.Sort(first)
	slices.Sort(fs.seenPrompts)
	if !slices.Equal(first, fs.seenPrompts) {
		t.Fatal("two runs with the same seed sent different prompts")
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ttft", "itl", "tpot", "e2e", "req/s", "cache hits", "w0=", "50.00 %"} {
		if !strings.Contains(text.String(), want) {
			t.Fatalf("text report lacks %q:\n%s", want, text.String())
		}
	}
	if !strings.Contains(progress.String(), "done") {
		t.Fatalf("no progress line written: %q", progress.String())
	}
}

func TestRunVariants(t *testing.T) {
	cases := []struct {
		name   string
		edit   func(*Options)
		server fakeBehaviour
		check  func(t *testing.T, rep *Report, fs *fakeServer)
	}{
		{"unary completions", func(o *Options) { o.Endpoint, o.Stream = EndpointCompletions, false }, fakeBehaviour{},
			func(t *testing.T, rep *Report, fs *fakeServer) {
				if rep.Completed != 40 || rep.TTFT.P50 != rep.E2E.P50 || rep.ITL != (Summary{}) || rep.OutputTokens != 200 {
					t.Fatalf("unary: completed %d ttft %+v e2e %+v itl %+v out %d", rep.Completed, rep.TTFT, rep.E2E, rep.ITL, rep.OutputTokens)
				}
			}},
		{"unary chat", func(o *Options) { o.Stream = false }, fakeBehaviour{},
			func(t *testing.T, rep *Report, fs *fakeServer) {
				if rep.Completed != 40 || rep.CacheHitRatio != 0.5 {
					t.Fatalf("unary chat: completed %d, ratio %v, errors %v", rep.Completed, rep.CacheHitRatio, rep.ErrorSamples)
				}
			}},
		{"streaming completions", func(o *Options) { o.Endpoint = EndpointCompletions }, fakeBehaviour{},
			func(t *testing.T, rep *Report, fs *fakeServer) {
				if rep.Completed != 40 || rep.OutputTokens != 200 || rep.ITL.Mean <= 0 {
					t.Fatalf("completions stream: completed %d out %d itl %+v", rep.Completed, rep.OutputTokens, rep.ITL)
				}
			}},
		{"no usage counts chunks and words", nil, fakeBehaviour{noUsage: true},
			func(t *testing.T, rep *Report, fs *fakeServer) {
				if rep.Completed != 40 || rep.OutputTokens != 200 || rep.PromptTokens != 40*32 || rep.CacheHitRatio != 0 {
					t.Fatalf("no usage: completed %d out %d prompt %d ratio %v", rep.Completed, rep.OutputTokens, rep.PromptTokens, rep.CacheHitRatio)
				}
			}},
		{"http 503", nil, fakeBehaviour{status: 503},
			func(t *testing.T, rep *Report, fs *fakeServer) {
				if rep.Errors[KindHTTP5xx] != 40 || rep.Completed != 0 || !strings.Contains(rep.ErrorSamples[KindHTTP5xx], "injected") {
					t.Fatalf("errors %v %v", rep.Errors, rep.ErrorSamples)
				}
				if rep.PerWorker["w0"]+rep.PerWorker["w1"] != 40 {
					t.Fatalf("failed answers not counted per worker: %v", rep.PerWorker)
				}
			}},
		{"http 429", nil, fakeBehaviour{status: 429},
			func(t *testing.T, rep *Report, fs *fakeServer) {
				if rep.Errors[KindHTTP4xx] != 40 {
					t.Fatalf("errors %v", rep.Errors)
				}
			}},
		{"error event mid-stream", nil, fakeBehaviour{midError: true},
			func(t *testing.T, rep *Report, fs *fakeServer) {
				if rep.Errors[KindStream] != 40 || rep.ErrorSamples[KindStream] != "engine died" {
					t.Fatalf("errors %v %v", rep.Errors, rep.ErrorSamples)
				}
			}},
		{"stream without done", nil, fakeBehaviour{noDone: true},
			func(t *testing.T, rep *Report, fs *fakeServer) {
				if rep.Errors[KindStream] != 40 {
					t.Fatalf("errors %v", rep.Errors)
				}
			}},
		{"shared prefix", func(o *Options) { o.Workload = WorkloadSharedPrefix }, fakeBehaviour{},
			func(t *testing.T, rep *Report, fs *fakeServer) {
				heads := map[string]int{}
				for _, p := range fs.seenPrompts {
					heads[strings.Join(strings.Fields(p)[:16], " ")]++
				}
				if rep.Completed != 40 || len(heads) != 2 {
					t.Fatalf("completed %d, %d distinct prefixes, want 2", rep.Completed, len(heads))
				}
			}},
		{"multi-turn", func(o *Options) { o.Workload, o.Requests = WorkloadMultiTurn, 8 }, fakeBehaviour{},
			func(t *testing.T, rep *Report, fs *fakeServer) {
				counts := map[int]int{}
				for _, n := range fs.seenMsgs {
					counts[n]++
				}
				if rep.Completed != 8 || !maps.Equal(counts, map[int]int{1: 4, 3: 4}) {
					t.Fatalf("completed %d, message counts %v", rep.Completed, counts)
				}
			}},
		{"conversation", func(o *Options) {
			o.Workload, o.Requests, o.Turns, o.PrefixGroups, o.PrefixLen, o.Rate, o.TraceTimeScale = WorkloadConversation, 12, 3, 2, 20, 200, 0.001
		}, fakeBehaviour{},
			func(t *testing.T, rep *Report, fs *fakeServer) {
				// Every request opens with a system message; follow-ups
				// carry the conversation so far.
				odd := 0
				for _, n := range fs.seenMsgs {
					if n%2 == 1 {
						odd++
					}
				}
				if rep.Completed != 12 || odd != 0 {
					t.Fatalf("completed %d, message counts %v", rep.Completed, fs.seenMsgs)
				}
			}},
		{"trace closed loop", func(o *Options) {
			o.Workload, o.TracePath, o.Requests, o.TraceTimeScale = WorkloadTrace, filepath.Join("testdata", "trace_sample.jsonl"), 0, 0
		}, fakeBehaviour{},
			func(t *testing.T, rep *Report, fs *fakeServer) {
				if rep.Completed != 8 || rep.PromptTokens != 1200+700+1400+512+2000+900+1536+300 {
					t.Fatalf("completed %d prompt tokens %d", rep.Completed, rep.PromptTokens)
				}
			}},
		{"trace timestamps", func(o *Options) {
			o.Workload, o.TracePath, o.Requests, o.TraceTimeScale = WorkloadTrace, filepath.Join("testdata", "trace_sample.jsonl"), 0, 0.01
		}, fakeBehaviour{},
			func(t *testing.T, rep *Report, fs *fakeServer) {
				if rep.Completed != 8 {
					t.Fatalf("completed %d", rep.Completed)
				}
			}},
		{"poisson open loop", func(o *Options) { o.Rate = 2000 }, fakeBehaviour{},
			func(t *testing.T, rep *Report, fs *fakeServer) {
				if rep.Completed != 40 {
					t.Fatalf("completed %d errors %v", rep.Completed, rep.ErrorSamples)
				}
			}},
		{"duration", func(o *Options) { o.Requests, o.Duration = 0, 50*time.Millisecond }, fakeBehaviour{},
			func(t *testing.T, rep *Report, fs *fakeServer) {
				if rep.Completed == 0 || len(rep.Errors) != 0 {
					t.Fatalf("completed %d errors %v", rep.Completed, rep.Errors)
				}
			}},
		{"explicit model and key", func(o *Options) { o.Model, o.APIKey = "chosen", "secret" }, fakeBehaviour{},
			func(t *testing.T, rep *Report, fs *fakeServer) {
				if rep.Config.Model != "chosen" || rep.Completed != 40 {
					t.Fatalf("model %q completed %d", rep.Config.Model, rep.Completed)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := &fakeServer{fakeBehaviour: tc.server}
			o := baseOptions(startFake(t, fs))
			if tc.edit != nil {
				tc.edit(&o)
			}
			rep := run(t, o)
			tc.check(t, rep, fs)
		})
	}
}

func TestRunTimeout(t *testing.T) {
	fs := &fakeServer{fakeBehaviour: fakeBehaviour{hang: make(chan struct{})}}
	url := startFake(t, fs)
	defer close(fs.hang)
	o := baseOptions(url)
	o.Model, o.Requests, o.Timeout = "m", 4, 50*time.Millisecond
	rep := run(t, o)
	if rep.Errors[KindTimeout] != 4 {
		t.Fatalf("errors %v (%v), want 4 timeouts", rep.Errors, rep.ErrorSamples)
	}
}

func TestRunCancelled(t *testing.T) {
	fs := &fakeServer{fakeBehaviour: fakeBehaviour{hang: make(chan struct{})}}
	url := startFake(t, fs)
	defer close(fs.hang)
	o := baseOptions(url)
	o.Model, o.Requests, o.Concurrency = "m", 100, 3
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan *Report)
	go func() {
		rep, _ := Run(ctx, o, zerolog.Nop())
		done <- rep
	}()
	// Wait until the three workers are blocked in the server, then interrupt.
	deadline := time.Now().Add(10 * time.Second)
	for fs.requests.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatal("requests never reached the server")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	rep := <-done
	if rep.Errors[KindCanceled] != 3 || rep.Requests != 3 {
		t.Fatalf("requests %d errors %v, want 3 canceled", rep.Requests, rep.Errors)
	}
}

func TestRunDeadURL(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	_ = l.Close()
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			o := baseOptions(url)
			o.Stream = stream
			o.Requests = 30
			// No --model: discovery fails too, and the run still reports.
			rep := run(t, o)
			if rep.Requests != 30 || rep.Errors[KindConnect] != 30 || rep.Completed != 0 {
				t.Fatalf("requests %d errors %v (%v)", rep.Requests, rep.Errors, rep.ErrorSamples)
			}
			if rep.Throughput.ReqPerS != 0 {
				t.Fatalf("throughput %v from failed requests", rep.Throughput)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	good := baseOptions("http://127.0.0.1:1")
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := good
	bad.URLs, bad.Endpoint, bad.Concurrency, bad.Workload, bad.Requests = []string{"ftp://x"}, "embeddings", 0, "nope", 0
	err := bad.Validate()
	if !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"url", "endpoint", "concurrency", "workload", "never end"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	tr := good
	tr.Workload, tr.Rate, tr.TraceTimeScale = WorkloadTrace, 5, 1
	if err := tr.Validate(); err == nil || !strings.Contains(err.Error(), "trace") {
		t.Fatalf("trace without file and with rate: %v", err)
	}
	for base, want := range map[string]string{
		"http://h:1":          "http://h:1/v1/chat/completions",
		"http://h:1/":         "http://h:1/v1/chat/completions",
		"http://h:1/v1":       "http://h:1/v1/chat/completions",
		"https://h/proxy/v1/": "https://h/proxy/v1/chat/completions",
	} {
		if got, err := endpointURL(base, EndpointChat); err != nil || got != want {
			t.Errorf("endpointURL(%q) = %q, %v; want %q", base, got, err, want)
		}
	}
}

func TestReportJSONSchema(t *testing.T) {
	fs := &fakeServer{}
	o := baseOptions(startFake(t, fs))
	o.APIKey = "do-not-leak"
	rep := run(t, o)
	path := filepath.Join(t.TempDir(), "r.json")
	if err := rep.WriteJSONFile(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte("do-not-leak")) {
		t.Fatal("the API key is in the report")
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	wantTop := []string{"config", "requests", "errors", "duration_s", "throughput", "ttft_ms", "itl_ms", "tpot_ms",
		"e2e_ms", "cache_hit_ratio", "per_worker", "ttft_cdf_ms"}
	if got := slices.Sorted(maps.Keys(doc)); !slices.Equal(got, slices.Sorted(slices.Values(wantTop))) {
		t.Fatalf("top-level keys %v, want %v", got, wantTop)
	}
	objKeys := func(name string) []string {
		m, ok := doc[name].(map[string]any)
		if !ok {
			t.Fatalf("%s is %T, want an object", name, doc[name])
		}
		return slices.Sorted(maps.Keys(m))
	}
	if got := objKeys("throughput"); !slices.Equal(got, []string{"input_tok_per_s", "output_tok_per_s", "req_per_s"}) {
		t.Fatalf("throughput keys %v", got)
	}
	for _, k := range []string{"ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"} {
		if got := objKeys(k); !slices.Equal(got, []string{"mean", "p50", "p90", "p99"}) {
			t.Fatalf("%s keys %v", k, got)
		}
	}
	for _, k := range []string{"url", "model", "endpoint", "stream", "seed", "workload", "concurrency", "rate"} {
		if !slices.Contains(objKeys("config"), k) {
			t.Fatalf("config lacks %q", k)
		}
	}
	if doc["requests"].(float64) != 40 || len(objKeys("errors")) != 0 || len(objKeys("per_worker")) != 2 {
		t.Fatalf("requests %v errors %v per_worker %v", doc["requests"], doc["errors"], doc["per_worker"])
	}
	if r, ok := doc["cache_hit_ratio"].(float64); !ok || r != 0.5 {
		t.Fatalf("cache_hit_ratio %v", doc["cache_hit_ratio"])
	}
	cdf := doc["ttft_cdf_ms"].([]any)
	if len(cdf) != 40 || len(cdf[0].([]any)) != 2 {
		t.Fatalf("ttft_cdf_ms %v", cdf)
	}
	back, err := ReadReportFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if back.TTFT != rep.TTFT || len(back.TTFTCDF) != 40 || back.Config.Label != rep.Config.Label {
		t.Fatalf("read back %+v", back)
	}
	for name, bad := range map[string]string{
		"not json": "{", "no cdf": `{"config":{},"requests":1,"ttft_ms":{}}`,
		"bad cdf": `{"config":{},"requests":1,"ttft_ms":{},"ttft_cdf_ms":[[5,0.5],[4,1]]}`,
	} {
		if _, err := ReadReport(strings.NewReader(bad)); !errors.Is(err, ErrInvalidReport) {
			t.Errorf("%s: err = %v, want ErrInvalidReport", name, err)
		}
	}
}

func TestSVGWellFormed(t *testing.T) {
	series := []Series{
		{Label: "direct <sim> & co", Points: [][2]float64{{0.5, 0.25}, {1, 0.5}, {2, 0.75}, {9.5, 1}}},
		{Label: "через infera", Points: CDF([]float64{3, 1, 4, 1, 5, 9, 2, 6})},
		{Label: "empty"},
	}
	for i := range 10 {
		series = append(series, Series{Label: fmt.Sprint("run ", i), Points: [][2]float64{{float64(i), 1}}})
	}
	for _, s := range [][]Series{series, nil, {{Label: "zeros", Points: [][2]float64{{0, 1}}}}} {
		var b bytes.Buffer
		if err := WriteCDFSVG(&b, `TTFT "CDF" <test>`, "TTFT (ms)", s); err != nil {
			t.Fatal(err)
		}
		dec := xml.NewDecoder(&b)
		root := ""
		paths := 0
		for {
			tok, err := dec.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("SVG is not well-formed XML: %v", err)
			}
			if se, ok := tok.(xml.StartElement); ok {
				if root == "" {
					root = se.Name.Local
				}
				if se.Name.Local == "path" {
					paths++
				}
				for _, a := range se.Attr {
					if strings.Contains(a.Value, "NaN") || strings.Contains(a.Value, "Inf") {
						t.Fatalf("attribute %s=%q", a.Name.Local, a.Value)
					}
				}
			}
		}
		if root != "svg" {
			t.Fatalf("root element %q, want svg", root)
		}
		want := 0
		for _, x := range s {
			if len(x.Points) > 0 {
				want++
			}
		}
		if paths != want {
			t.Fatalf("%d curves drawn, want %d", paths, want)
		}
	}
}

func TestRunSeveralURLs(t *testing.T) {
	a, b := &fakeServer{}, &fakeServer{}
	o := baseOptions(startFake(t, a))
	o.URLs = append(o.URLs, startFake(t, b)+"/v1/")
	rep := run(t, o)
	if rep.Completed != 40 || a.requests.Load() != 20 || b.requests.Load() != 20 {
		t.Fatalf("completed %d, split %d/%d, want 20/20", rep.Completed, a.requests.Load(), b.requests.Load())
	}
	if !strings.Contains(rep.Config.URL, ",") {
		t.Fatalf("config url %q does not list both", rep.Config.URL)
	}
}
