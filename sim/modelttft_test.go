package sim

import (
	"bufio"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/testkit"
)

type modelTTFTLine struct {
	RequestID    string  `json:"request_id"`
	PromptTokens int     `json:"prompt_tokens"`
	CachedTokens int     `json:"cached_tokens"`
	ModelTTFTS   float64 `json:"model_ttft_s"`
	ModelAdmitS  float64 `json:"model_admit_wait_s"`
	ModelIdleS   float64 `json:"model_idle_ttft_s"`
	ModelClockS  float64 `json:"model_clock_s"`
}

func readModelTTFTLog(t *testing.T, path string) []modelTTFTLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []modelTTFTLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l modelTTFTLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %q: %v", sc.Bytes(), err)
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// startTTFTLogSim starts a simulator that writes --model-ttft-log to a
// fresh file, edit adjusting its configuration first; it returns the
// configuration it runs with and the file's path.
func startTTFTLogSim(t *testing.T, edit func(*config.Sim)) (*testSim, config.Sim, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ttft.jsonl")
	var cfg config.Sim
	ts := startSim(t, func(c *config.Sim) {
		c.ModelTTFTLog = path
		edit(c)
		cfg = *c
	})
	return ts, cfg, path
}

// postID sends a completion with an X-Request-Id.
func (ts *testSim) postID(t *testing.T, id, body string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, ts.url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// completion is a completion body of maxTokens on prompt.
func completion(maxTokens int, prompt string) string {
	return `{"model":"sim-model","max_tokens":` + strconv.Itoa(maxTokens) + `,"prompt":"` + prompt + `"}`
}

// runBeside posts long (X-Request-Id "long") in the background and, once
// the engine runs it and pause has passed, short ("short"); then it stops
// the simulator and returns its log's lines.
func runBeside(t *testing.T, ts *testSim, path, long, short string, pause time.Duration) []modelTTFTLine {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		ts.postID(t, "long", long)
	}()
	testkit.Eventually(t, "the long request running", func() bool { return ts.gauge(t, "vllm:num_requests_running") == 1 })
	time.Sleep(pause)
	ts.postID(t, "short", short)
	<-done
	if err := ts.stop(); err != nil {
		t.Fatal(err)
	}
	return readModelTTFTLog(t, path)
}

// The line of each request holds the TTFT the step model gives it: on an
// idle engine, one prefill step of its uncached tokens (the step overhead
// plus those tokens at --prefill-tokens-per-s), in model seconds whatever
// --time-scale; a request with two choices is one line.
func TestModelTTFTLog(t *testing.T) {
	ts, cfg, path := startTTFTLogSim(t, func(c *config.Sim) { c.TimeScale = 0.01 })
	prompt := strings.Repeat("x", 400) // 400 byte tokens, 25 blocks
	ts.postID(t, "first", `{"model":"sim-model","max_tokens":4,"prompt":"`+prompt+`"}`)
	ts.postID(t, "again", `{"model":"sim-model","max_tokens":4,"prompt":"`+prompt+`"}`)
	ts.postID(t, "two-choices", `{"model":"sim-model","max_tokens":4,"n":2,"prompt":"`+strings.Repeat("y", 100)+`"}`)
	if err := ts.stop(); err != nil {
		t.Fatal(err)
	}
	lines := readModelTTFTLog(t, path)
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3: %+v", len(lines), lines)
	}
	prefill := func(uncached int) float64 {
		return cfg.StepOverheadMs/1e3 + float64(uncached)/cfg.PrefillTokensPerS
	}
	// The last prompt token is always computed: 24 of the 25 blocks hit.
	hit := (400 - 1) / cfg.BlockSize * cfg.BlockSize
	want := []modelTTFTLine{
		{RequestID: "first", PromptTokens: 400, CachedTokens: 0, ModelTTFTS: prefill(400), ModelIdleS: prefill(400)},
		{RequestID: "again", PromptTokens: 400, CachedTokens: hit, ModelTTFTS: prefill(400 - hit), ModelIdleS: prefill(400 - hit)},
	}
	// The choices are submitted one after the other: the second may join
	// the first one's prefill step or wait for the next.
	if l := lines[2]; l.RequestID != "two-choices" || l.PromptTokens != 100 || l.CachedTokens != 0 ||
		l.ModelTTFTS < prefill(100)-1e-6 || l.ModelTTFTS > prefill(200)+1e-6 {
		t.Errorf("line 2 = %+v, want two-choices, 100 prompt tokens, none cached, TTFT %v..%v", l, prefill(100), prefill(200))
	}
	if l := lines[2]; math.Abs(l.ModelIdleS-prefill(100)) > 1e-6 {
		t.Errorf("line 2's idle TTFT %v, want its own prefill alone %v", l.ModelIdleS, prefill(100))
	}
	for i, w := range want {
		got := lines[i]
		if got.RequestID != w.RequestID || got.PromptTokens != w.PromptTokens || got.CachedTokens != w.CachedTokens ||
			math.Abs(got.ModelTTFTS-w.ModelTTFTS) > 1e-6 || math.Abs(got.ModelIdleS-w.ModelIdleS) > 1e-6 {
			t.Errorf("line %d = %+v, want %+v", i, got, w)
		}
	}
	// The engine's clock starts at 0 and only moves forward.
	if math.Abs(lines[0].ModelClockS-lines[0].ModelTTFTS) > 1e-6 {
		t.Errorf("first request's model clock %v, want its TTFT %v", lines[0].ModelClockS, lines[0].ModelTTFTS)
	}
	for i := 1; i < len(lines); i++ {
		if lines[i].ModelClockS-lines[i].ModelTTFTS < lines[i-1].ModelClockS-1e-9 {
			t.Errorf("line %d submitted at model time %v, before line %d's first token at %v",
				i, lines[i].ModelClockS-lines[i].ModelTTFTS, i-1, lines[i-1].ModelClockS)
		}
	}
}

// model_idle_ttft_s is a request's TTFT alone on an idle engine, a step
// budget at a time, whatever the engine was doing: a prompt of three
// budgets' worth is three steps, and a prompt that arrives while another
// request runs keeps its own floor while its TTFT grows.
func TestModelTTFTLogIdleFloor(t *testing.T) {
	ts, cfg, path := startTTFTLogSim(t, func(c *config.Sim) {
		// Real time: the long request below runs for about half a second,
		// so the short one surely arrives while it does.
		c.TimeScale = 1
		c.MaxNumBatchedTokens = 128
	})
	idle := func(uncached int) float64 {
		steps := (uncached + 127) / 128
		return float64(steps)*cfg.StepOverheadMs/1e3 + float64(uncached)/cfg.PrefillTokensPerS
	}
	ts.postID(t, "alone", completion(1, strings.Repeat("a", 384)))
	lines := runBeside(t, ts, path, completion(64, strings.Repeat("b", 1024)), completion(1, strings.Repeat("c", 256)), 0)
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3: %+v", len(lines), lines)
	}
	if l := lines[0]; l.RequestID != "alone" || math.Abs(l.ModelIdleS-idle(384)) > 1e-6 || math.Abs(l.ModelTTFTS-l.ModelIdleS) > 1e-6 {
		t.Errorf("line 0 = %+v, want alone, idle = TTFT = three steps %v", l, idle(384))
	}
	for _, l := range lines[1:] {
		if l.RequestID == "short" && (math.Abs(l.ModelIdleS-idle(256)) > 1e-6 || l.ModelTTFTS <= l.ModelIdleS+1e-6) {
			t.Errorf("line %+v: want idle TTFT %v, below its TTFT beside the long request", l, idle(256))
		}
	}
}

// model_admit_wait_s is the part of a request's TTFT spent waiting to
// enter the batch: none on an idle engine; until the request before it
// ends when that one holds the blocks it needs (the engine reserves a
// request's prompt and output at admission).
func TestModelTTFTLogAdmitWait(t *testing.T) {
	ts, cfg, path := startTTFTLogSim(t, func(c *config.Sim) {
		c.TimeScale = 1
		c.KVBlocks, c.MaxModelLen = 40, 640 // 640 tokens of cache
	})
	ts.postID(t, "alone", completion(1, strings.Repeat("a", 100)))
	// 400 + 200 tokens: 38 of the 40 blocks, for 200 decode steps.
	lines := runBeside(t, ts, path, completion(200, strings.Repeat("b", 400)), completion(1, strings.Repeat("c", 100)), 0)
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3: %+v", len(lines), lines)
	}
	by := map[string]modelTTFTLine{}
	for _, l := range lines {
		by[l.RequestID] = l
	}
	if l := by["alone"]; l.ModelAdmitS != 0 {
		t.Errorf("alone on an idle engine: %+v, want no admission wait", l)
	}
	long, short := by["long"], by["short"]
	// The short request enters once the long one ended: after its 200
	// decode steps, which follow its first token.
	decode := 199 * cfg.StepOverheadMs / 1e3
	if short.ModelAdmitS < decode || short.ModelAdmitS > short.ModelTTFTS-short.ModelIdleS+1e-6 {
		t.Errorf("short behind the long request's blocks: %+v, want an admission wait of at least %v s (the long one's decode), within its TTFT less its floor", short, decode)
	}
	if short.ModelClockS < long.ModelClockS+decode {
		t.Errorf("short's first token at %v, before the long request (first token at %v) could have ended", short.ModelClockS, long.ModelClockS)
	}
}

// A request that arrives while a step runs waits for the next step, but
// its TTFT counts from its arrival, not from the start of the step it
// missed: here a one-second prefill step is under way for 300 ms or more
// when the short request comes, so its TTFT is the rest of that step and
// its own prefill, at least 300 ms less than both whole.
func TestModelTTFTLogCountsFromArrival(t *testing.T) {
	ts, cfg, path := startTTFTLogSim(t, func(c *config.Sim) {
		c.TimeScale = 1
		c.PrefillTokensPerS = 1000
		c.MaxNumBatchedTokens = 1024
	})
	step := func(tokens int) float64 { return cfg.StepOverheadMs/1e3 + float64(tokens)/cfg.PrefillTokensPerS }
	lines := runBeside(t, ts, path, completion(1, strings.Repeat("a", 1000)), completion(1, strings.Repeat("b", 16)), 300*time.Millisecond)
	for _, l := range lines {
		if l.RequestID == "short" && l.ModelTTFTS > step(1000)+step(16)-0.3+1e-6 {
			t.Errorf("short, 300 ms or more into a %v s step: %+v, want a TTFT of at most %v s", step(1000), l, step(1000)+step(16)-0.3)
		}
	}
}

// Without the flag the engine has no log and marks no request for one.
func TestModelTTFTLogOff(t *testing.T) {
	ts := startSim(t, func(c *config.Sim) { c.TimeScale = 0.01 })
	ts.postID(t, "r", `{"model":"sim-model","max_tokens":2,"prompt":"hello"}`)
	if ts.srv.ttftLog != nil || ts.srv.sched.ttftLog != nil {
		t.Error("a model TTFT log is open without --model-ttft-log")
	}
	q := getSeq()
	defer putSeq(q)
	if q.logTTFT {
		t.Error("a recycled sequence is marked for the model TTFT log")
	}
}

func TestModelTTFTLogNeedsDirectory(t *testing.T) {
	cfg := config.DefaultSim()
	cfg.ModelTTFTLog = filepath.Join(t.TempDir(), "missing", "ttft.jsonl")
	_, err := New(cfg, zerolog.Nop())
	if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), "--model-ttft-log") {
		t.Fatalf("New: %v, want an invalid --model-ttft-log", err)
	}
}

// A request's line costs the zero-latency handler no allocation: it is
// appended to the log's buffer, which the writer swaps with its own.
func TestHandleUnaryModelTTFTLogAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race")
	}
	path := filepath.Join(t.TempDir(), "ttft.jsonl")
	s := handlerSim(t, func(c *config.Sim) { c.ModelTTFTLog = path })
	ctx := newCtx(benchChat)
	run := func() {
		ctx.Response.Reset()
		s.handle(ctx)
	}
	for range 64 {
		run()
	}
	allocs := testing.AllocsPerRun(200, run)
	if ctx.Response.StatusCode() != 200 {
		t.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if allocs > 0 {
		t.Errorf("unary handler with --model-ttft-log allocates %v times per request", allocs)
	}
}
