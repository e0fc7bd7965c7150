package continuation_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/continuation"
	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/openai"
	"github.com/infera/infera/sim"
)

// startSim runs the simulator in-process, as flavor, and returns its base URL.
func startSim(t *testing.T, flavor string) string {
	t.Helper()
	cfg := config.DefaultSim()
	cfg.Port = 0
	cfg.Flavor = flavor
	s, err := sim.New(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	return "http://" + servetest.Loopback(t, "sim", s.Serve)
}

// events posts body and returns the answer's SSE events.
func events(t *testing.T, url, body string) [][]byte {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(bufio.NewReader(resp.Body))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s %v", url, resp.StatusCode, raw, err)
	}
	return splitEvents(t, raw)
}

// splitEvents cuts a stream's bytes into its SSE events.
func splitEvents(t testing.TB, raw []byte) [][]byte {
	t.Helper()
	var out [][]byte
	for len(raw) > 0 {
		n := openai.NextEvent(raw)
		if n < 0 {
			t.Fatalf("unterminated event %q", raw)
		}
		out = append(out, raw[:n])
		raw = raw[n:]
	}
	return out
}

// clientChunk is what the client reads from a chunk.
type clientChunk struct {
	ID      string
	Object  string
	Choices []struct {
		Text         string
		Delta        struct{ Content string }
		FinishReason *string `json:"finish_reason"`
	}
}

// deliver runs evs through tr as the relay would and returns what the
// client got: the text, the finish reason, and the raw events.
func deliver(t *testing.T, tr *continuation.Tracker, evs [][]byte, reshape bool) (text, finish string, seen [][]byte) {
	t.Helper()
	var sb strings.Builder
	for _, ev := range evs {
		out := bytes.Clone(tr.ObserveEvent(ev))
		data := bytes.TrimSpace(bytes.TrimPrefix(bytes.TrimSpace(out), []byte("data:")))
		if string(data) == "[DONE]" {
			seen = append(seen, out)
			continue
		}
		if reshape {
			data = continuation.ReshapeChat(nil, data, tr)
			out = append(append([]byte("data: "), data...), "\n\n"...)
		}
		seen = append(seen, out)
		var c clientChunk
		if err := json.Unmarshal(data, &c); err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		for _, ch := range c.Choices {
			sb.WriteString(ch.Text + ch.Delta.Content)
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	return sb.String(), finish, seen
}

var idFields = []string{`"token_ids"`, `"prompt_token_ids"`, `"sglext"`}

// TestExactContinuationThroughSim: a chat stream asked for ids, cut after
// k events, continued on another engine with Build's request, reshaped
// into chat chunks: the client sees the text of an unbroken run, chat
// chunks only, no id field, and one finish.
func TestExactContinuationThroughSim(t *testing.T) {
	for _, flavor := range []string{config.FlavorVLLM, config.FlavorSGLang} {
		t.Run(flavor, func(t *testing.T) {
			a, b := startSim(t, flavor), startSim(t, flavor)
			const body = `{"model":"sim-model","stream":true,"max_tokens":30,"messages":[{"role":"user","content":"Hello there"}]}`
			want, wantFinish, _ := deliver(t, new(continuation.Tracker), events(t, a+"/v1/chat/completions", body), false)
			engine := continuation.EngineVLLM
			if flavor == config.FlavorSGLang {
				engine = continuation.EngineSGLang
			}
			first := []byte(body)
			strip := false
			if continuation.AsksIDs(engine, true) {
				var err error
				if first, err = continuation.AskIDs(nil, first); err != nil {
					t.Fatalf("AskIDs: %v", err)
				}
				strip = true
			}
			evs := events(t, a+"/v1/chat/completions", string(first))
			for _, cut := range []int{2, 5, 17, len(evs) - 3} {
				var tr continuation.Tracker
				tr.Reset(strip)
				got, _, seen := deliver(t, &tr, evs[:cut], false)
				c, err := continuation.Build([]byte(body), &tr, continuation.Options{Chat: true, Engine: engine})
				if err != nil {
					t.Fatal(err)
				}
				if flavor == config.FlavorSGLang {
					// SGLang gives no ids on streaming chat: the text path,
					// which keeps the assistant's message open.
					if c.Exact || c.Path != "/v1/chat/completions" || !bytes.Contains(c.Body, []byte(`"continue_final_message":true`)) {
						t.Fatalf("sglang chat continuation %+v %s", c, c.Body)
					}
					continue
				}
				if !c.Exact || c.Path != "/v1/completions" || !c.Reshape || c.Produced != len(tr.OutIDs) {
					t.Fatalf("cut %d: continuation %+v", cut, c)
				}
				var req map[string]any
				if err := json.Unmarshal(c.Body, &req); err != nil {
					t.Fatal(err)
				}
				if req["messages"] != nil || req["max_tokens"].(float64) != float64(30-c.Produced) || req["return_token_ids"] != true {
					t.Fatalf("cut %d: body %s", cut, c.Body)
				}
				rest, finish, more := deliver(t, &tr, events(t, b+c.Path, string(c.Body)), c.Reshape)
				seen = append(seen, more...)
				if got+rest != want || finish != wantFinish {
					t.Fatalf("cut %d: continued text %q+%q finish %q, unbroken %q %q", cut, got, rest, finish, want, wantFinish)
				}
				for _, ev := range seen {
					for _, f := range idFields {
						if bytes.Contains(ev, []byte(f)) {
							t.Fatalf("client saw %s: %s", f, ev)
						}
					}
					if !bytes.Contains(ev, []byte("[DONE]")) && !bytes.Contains(ev, []byte(`"object":"chat.completion.chunk"`)) {
						t.Fatalf("client saw a non-chat chunk: %s", ev)
					}
				}
				if tr.Poisoned != continuation.PoisonNone {
					t.Fatalf("poisoned %v", tr.Poisoned)
				}
			}
		})
	}
}

// TestContinuationThatBreaksAgain: a continuation cut in turn is continued
// exactly again from the ids the first continuation delivered.
func TestContinuationThatBreaksAgain(t *testing.T) {
	a := startSim(t, config.FlavorVLLM)
	const body = `{"model":"sim-model","stream":true,"max_tokens":40,"prompt":"Once upon a time"}`
	want, _, _ := deliver(t, new(continuation.Tracker), events(t, a+"/v1/completions", body), false)
	first, _ := continuation.AskIDs(nil, []byte(body))
	var tr continuation.Tracker
	tr.Reset(true)
	got, _, _ := deliver(t, &tr, events(t, a+"/v1/completions", string(first))[:7], false)
	c, err := continuation.Build([]byte(body), &tr, continuation.Options{Engine: continuation.EngineVLLM})
	if err != nil || !c.Exact || c.Reshape {
		t.Fatalf("%+v %v", c, err)
	}
	mid, _, _ := deliver(t, &tr, events(t, a+c.Path, string(c.Body))[:9], false)
	c2, err := continuation.Build([]byte(body), &tr, continuation.Options{Engine: continuation.EngineVLLM})
	if err != nil || !c2.Exact || c2.Produced != len(got)+len(mid) {
		t.Fatalf("second continuation %+v %v", c2, err)
	}
	rest, finish, _ := deliver(t, &tr, events(t, a+c2.Path, string(c2.Body)), false)
	if got+mid+rest != want || finish != "length" {
		t.Fatalf("%q+%q+%q (%s), want %q", got, mid, rest, finish, want)
	}
}

// TestTextContinuation: without ids (ATOM), the delivered text is carried:
// as the assistant's turn on chat, appended to a string prompt on
// completions; max_tokens reduced by the text chunks.
func TestTextContinuation(t *testing.T) {
	a := startSim(t, config.FlavorATOM)
	chat := `{"model":"sim-model","stream":true,"max_completion_tokens":12,"messages":[{"role":"user","content":"hi"}]}`
	var tr continuation.Tracker
	tr.Reset(false)
	got, _, _ := deliver(t, &tr, events(t, a+"/v1/chat/completions", chat)[:5], false)
	c, err := continuation.Build([]byte(chat), &tr, continuation.Options{Chat: true, Engine: continuation.EngineOther})
	if err != nil || c.Exact || c.Produced != 4 || c.Path != "/v1/chat/completions" {
		t.Fatalf("%+v %v", c, err)
	}
	var req struct {
		Messages []struct{ Role, Content string }
		Max      int  `json:"max_completion_tokens"`
		IDs      *any `json:"return_token_ids"`
	}
	if err := json.Unmarshal(c.Body, &req); err != nil {
		t.Fatal(err)
	}
	if len(req.Messages) != 2 || req.Messages[1].Role != "assistant" || req.Messages[1].Content != got || req.Max != 8 || req.IDs != nil {
		t.Fatalf("body %s (delivered %q)", c.Body, got)
	}
	if _, _, more := deliver(t, &tr, events(t, a+c.Path, string(c.Body)), false); len(more) == 0 {
		t.Fatal("the continuation streamed nothing")
	}

	compl := `{"model":"sim-model","stream":true,"max_tokens":3,"prompt":["Say \"hi\""]}`
	tr.Reset(false)
	got, _, _ = deliver(t, &tr, events(t, a+"/v1/completions", compl)[:2], false)
	c, err = continuation.Build([]byte(compl), &tr, continuation.Options{Engine: continuation.EngineOther})
	if err != nil {
		t.Fatal(err)
	}
	var creq struct {
		Prompt string
		Max    int `json:"max_tokens"`
	}
	if err := json.Unmarshal(c.Body, &creq); err != nil || creq.Prompt != `Say "hi"`+got || creq.Max != 1 {
		t.Fatalf("body %s %v", c.Body, err)
	}
}

// TestPoisoned: what is never continued.
func TestPoisoned(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","n":2,"messages":[]}`,
		`{"model":"m","best_of":3,"prompt":"x"}`,
	} {
		if _, err := continuation.Build([]byte(body), new(continuation.Tracker), continuation.Options{}); !errors.Is(err, continuation.ErrPoisoned) {
			t.Errorf("%s: %v", body, err)
		}
	}
	if continuation.Continuable(2, 1) || continuation.Continuable(1, 3) || !continuation.Continuable(1, 1) {
		t.Error("Continuable: n > 1 or best_of > 1 is never continued, 1 and 1 is")
	}
	build := func(body string, chunks ...string) error {
		var tr continuation.Tracker
		tr.Reset(true)
		for _, c := range chunks {
			tr.ObserveEvent([]byte("data: " + c + "\n\n"))
		}
		_, err := continuation.Build([]byte(body), &tr, continuation.Options{Chat: strings.Contains(body, "messages")})
		return err
	}
	chat := `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`
	cases := map[string]struct {
		body   string
		chunks []string
		want   continuation.Poison
	}{
		"second choice": {chat, []string{`{"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"}}]}`}, continuation.PoisonChoices},
		"choice index":  {chat, []string{`{"choices":[{"index":1,"delta":{"content":"b"}}]}`}, continuation.PoisonChoices},
		"unparseable":   {chat, []string{`{"choices":[{"index":0,"delta":{"content":"a"}}]`}, continuation.PoisonUnparseable},
		"not an object": {chat, []string{`[1]`}, continuation.PoisonUnparseable},
		"tool calls":    {chat, []string{`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]}`}, continuation.PoisonToolCalls},
		"reasoning":     {chat, []string{`{"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}`}, continuation.PoisonToolCalls},
		"token prompt":  {`{"model":"m","stream":true,"prompt":[1,2,3]}`, []string{`{"choices":[{"index":0,"text":"a"}]}`}, continuation.PoisonPrompt},
		"batch prompt":  {`{"model":"m","stream":true,"prompt":["a","b"]}`, []string{`{"choices":[{"index":0,"text":"a"}]}`}, continuation.PoisonPrompt},
		"n=2":           {`{"model":"m","n":2,"stream":true,"prompt":"x"}`, nil, continuation.PoisonChoices},
	}
	for name, c := range cases {
		err := build(c.body, c.chunks...)
		var pe *continuation.PoisonError
		if !errors.As(err, &pe) || pe.Reason != c.want {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	// Tool calls do not poison an exact continuation... but chat-only
	// fields make it a text one, where they do.
	if err := build(`{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[]}`,
		`{"prompt_token_ids":[1],"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]},"token_ids":[5]}]}`); !errors.Is(err, continuation.ErrPoisoned) {
		t.Errorf("tools: %v", err)
	}
}

// TestStripKeepsClientIDs: AskIDs adds the field as the body's first
// member without reading the body; ids the client asked for itself (the
// router leaves its body alone then) are not stripped.
func TestStripKeepsClientIDs(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"m","prompt":"x"}`: `{"return_token_ids":true,"model":"m","prompt":"x"}`,
		" \n{ \"model\":\"m\"}":      " \n{\"return_token_ids\":true, \"model\":\"m\"}",
		`{ }`:                        `{"return_token_ids":true }`,
	} {
		if out, err := continuation.AskIDs([]byte("x"), []byte(body)); err != nil || string(out) != "x"+want {
			t.Errorf("AskIDs(%q) = %q %v, want %q", body, out, err, want)
		}
	}
	if _, err := continuation.AskIDs(nil, []byte(`[1]`)); err == nil {
		t.Fatal("AskIDs of a non-object")
	}
	var tr continuation.Tracker
	tr.Reset(false)
	ev := []byte("data: {\"choices\":[{\"index\":0,\"text\":\"a\",\"token_ids\":[97]}],\"prompt_token_ids\":[120]}\n\n")
	got := tr.ObserveEvent(ev)
	prompt, err := tr.PromptIDs(nil)
	if !bytes.Equal(got, ev) || !slices.Equal(tr.OutIDs, []uint32{97}) || !slices.Equal(prompt, []uint32{120}) || err != nil {
		t.Fatalf("%s ids %v %v %v", got, tr.OutIDs, prompt, err)
	}
}

// TestLimits: max_tokens reduced by what was produced, at least 1; absent
// stays absent.
func TestLimits(t *testing.T) {
	mk := func(body string, produced int) map[string]any {
		var tr continuation.Tracker
		tr.Reset(true)
		ids := make([]string, produced)
		for i := range ids {
			ids[i] = "97"
		}
		tr.ObserveEvent([]byte(`data: {"choices":[{"index":0,"text":"` + strings.Repeat("a", produced) + `","token_ids":[` + strings.Join(ids, ",") + `]}],"prompt_token_ids":[1,2]}` + "\n\n"))
		c, err := continuation.Build([]byte(body), &tr, continuation.Options{Engine: continuation.EngineVLLM})
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(c.Body, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := mk(`{"model":"m","max_tokens":10,"prompt":"x"}`, 4); m["max_tokens"].(float64) != 6 || len(m["prompt"].([]any)) != 6 {
		t.Errorf("%v", m)
	}
	if m := mk(`{"model":"m","max_tokens":3,"prompt":"x"}`, 5); m["max_tokens"].(float64) != 1 {
		t.Errorf("%v", m)
	}
	if m := mk(`{"model":"m","prompt":"x","echo":true}`, 2); m["max_tokens"] != nil || m["echo"] != nil {
		t.Errorf("%v", m)
	}
}

// TestObserveAllocs: reading and stripping a chunk allocates nothing once
// the tracker's buffers have grown.
func TestObserveAllocs(t *testing.T) {
	ev := []byte("data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ab\"},\"token_ids\":[97,98]}]}\n\n")
	var tr continuation.Tracker
	tr.Reset(true)
	for range 4 {
		tr.ObserveEvent(ev)
	}
	tr.Reset(true)
	if n := testing.AllocsPerRun(100, func() {
		if len(tr.OutIDs) > 150 {
			tr.Reset(true)
		}
		tr.ObserveEvent(ev)
	}); n != 0 {
		t.Fatalf("%v allocs per chunk", n)
	}
}
