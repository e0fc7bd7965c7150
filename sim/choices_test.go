package sim

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/tokenizer"
)

// choiceOut is one choice of an answer, unary or gathered from a stream.
type choiceOut struct {
	Text   string
	Finish string
	Stop   any
	Tool   string // a tool call: name and arguments
}

// nAnswer is an answer with every choice, by index.
type nAnswer struct {
	Choices          []choiceOut
	Prompt, Complete int
	Order            []int // streamed: the choice index of every chunk
}

func unaryChoices(t *testing.T, ts *testSim, path, body string) nAnswer {
	t.Helper()
	var m struct {
		Choices []struct {
			Index   int    `json:"index"`
			Text    string `json:"text"`
			Finish  string `json:"finish_reason"`
			Stop    any    `json:"stop_reason"`
			Message *struct {
				Content   *string `json:"content"`
				ToolCalls []struct {
					ID       string `json:"id"`
					Function struct {
						Name, Arguments string
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			Prompt   int `json:"prompt_tokens"`
			Complete int `json:"completion_tokens"`
			Total    int `json:"total_tokens"`
		} `json:"usage"`
	}
	code, b := ts.post(t, path, body)
	if code != 200 {
		t.Fatalf("POST %s %s: %d %s", path, body, code, b)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if m.Usage.Total != m.Usage.Prompt+m.Usage.Complete {
		t.Fatalf("usage %+v", m.Usage)
	}
	a := nAnswer{Prompt: m.Usage.Prompt, Complete: m.Usage.Complete}
	ids := map[string]bool{}
	for i, c := range m.Choices {
		if c.Index != i {
			t.Fatalf("choice %d has index %d: %s", i, c.Index, b)
		}
		o := choiceOut{Text: c.Text, Finish: c.Finish, Stop: c.Stop}
		if c.Message != nil {
			if c.Message.Content != nil {
				o.Text = *c.Message.Content
			}
			for _, tc := range c.Message.ToolCalls {
				if ids[tc.ID] {
					t.Fatalf("tool call id %s repeated: %s", tc.ID, b)
				}
				ids[tc.ID] = true
				o.Tool += tc.Function.Name + tc.Function.Arguments
			}
		}
		a.Choices = append(a.Choices, o)
	}
	return a
}

func streamChoices(t *testing.T, ts *testSim, path, body string) nAnswer {
	t.Helper()
	resp := ts.stream(t, t.Context(), path, body)
	defer resp.Body.Close()
	events, err := readAllEvents(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) == 0 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %q", events)
	}
	var a nAnswer
	roles := map[int]int{}
	for _, ev := range events[:len(events)-1] {
		var c struct {
			Choices []struct {
				Index  int    `json:"index"`
				Text   string `json:"text"`
				Finish string `json:"finish_reason"`
				Stop   any    `json:"stop_reason"`
				Delta  struct {
					Role      string `json:"role"`
					Content   string `json:"content"`
					ToolCalls []struct {
						Function struct {
							Name, Arguments string
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				Prompt   int `json:"prompt_tokens"`
				Complete int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("event %q: %v", ev, err)
		}
		if c.Usage != nil {
			a.Prompt, a.Complete = c.Usage.Prompt, c.Usage.Complete
		}
		if len(c.Choices) > 1 {
			t.Fatalf("chunk with %d choices: %s", len(c.Choices), ev)
		}
		for _, ch := range c.Choices {
			for len(a.Choices) <= ch.Index {
				a.Choices = append(a.Choices, choiceOut{})
			}
			o := &a.Choices[ch.Index]
			if o.Finish != "" {
				t.Fatalf("choice %d goes on after finish_reason %s: %s", ch.Index, o.Finish, ev)
			}
			if ch.Delta.Role != "" {
				roles[ch.Index]++
			}
			o.Text += ch.Text + ch.Delta.Content
			for _, tc := range ch.Delta.ToolCalls {
				o.Tool += tc.Function.Name + tc.Function.Arguments
			}
			o.Finish, o.Stop = ch.Finish, ch.Stop
			a.Order = append(a.Order, ch.Index)
		}
	}
	if strings.Contains(path, "chat") {
		for i := range a.Choices {
			if roles[i] != 1 {
				t.Fatalf("choice %d has %d role chunks", i, roles[i])
			}
		}
	}
	return a
}

// interleaved reports whether a chunk of another choice comes between the
// first and the last chunk of choice 0.
func interleaved(order []int) bool {
	first, last := -1, -1
	for i, c := range order {
		if c == 0 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	for _, c := range order[max(first, 0):max(last, 0)] {
		if c != 0 {
			return true
		}
	}
	return false
}

// TestChoicesN: n=3 gives three distinct, deterministic choices with
// indexes 0..2, unary and streamed (chunks interleaved), chat and
// completions; choice 0 is the n=1 answer; usage counts the prompt once
// and the completion tokens of every choice.
func TestChoicesN(t *testing.T) {
	ts := startSim(t, nil)
	for _, tc := range []struct {
		path string
		body func(extra map[string]any) string
	}{
		{"/v1/chat/completions", func(extra map[string]any) string { return chatBody(t, extra, "three ways") }},
		{"/v1/completions", func(extra map[string]any) string { return complBody(t, extra, "three ways") }},
	} {
		one := unaryChoices(t, ts, tc.path, tc.body(map[string]any{"max_tokens": 20}))
		got := unaryChoices(t, ts, tc.path, tc.body(map[string]any{"max_tokens": 20, "n": 3}))
		if len(one.Choices) != 1 || len(got.Choices) != 3 {
			t.Fatalf("%s: %d choices for n=1, %d for n=3", tc.path, len(one.Choices), len(got.Choices))
		}
		if got.Choices[0] != one.Choices[0] {
			t.Fatalf("%s: choice 0 %+v, n=1 answer %+v", tc.path, got.Choices[0], one.Choices[0])
		}
		seen := map[string]bool{}
		for i, c := range got.Choices {
			if len(c.Text) != 20 || c.Finish != "length" || c.Stop != nil || seen[c.Text] {
				t.Fatalf("%s: choice %d %+v (all %+v)", tc.path, i, c, got.Choices)
			}
			seen[c.Text] = true
		}
		if got.Prompt != one.Prompt || got.Complete != 60 {
			t.Fatalf("%s: usage prompt %d completion %d, want %d and 60", tc.path, got.Prompt, got.Complete, one.Prompt)
		}
		again := unaryChoices(t, ts, tc.path, tc.body(map[string]any{"max_tokens": 20, "n": 3}))
		for i := range again.Choices {
			if again.Choices[i] != got.Choices[i] {
				t.Fatalf("%s: choice %d not deterministic: %+v then %+v", tc.path, i, got.Choices[i], again.Choices[i])
			}
		}
		st := streamChoices(t, ts, tc.path, tc.body(map[string]any{"max_tokens": 20, "n": 3, "stream": true, "stream_options": map[string]any{"include_usage": true}}))
		if len(st.Choices) != 3 || st.Prompt != got.Prompt || st.Complete != 60 {
			t.Fatalf("%s streamed: %+v", tc.path, st)
		}
		for i := range st.Choices {
			if st.Choices[i] != got.Choices[i] {
				t.Fatalf("%s streamed choice %d %+v, unary %+v", tc.path, i, st.Choices[i], got.Choices[i])
			}
		}
		if !interleaved(st.Order) {
			t.Fatalf("%s: choices not interleaved: %v", tc.path, st.Order)
		}
	}
}

// TestChoicesStopPerChoice: a stop string ends each choice where it occurs
// in that choice's text; a choice without it runs to max_tokens.
func TestChoicesStopPerChoice(t *testing.T) {
	ts := startSim(t, nil)
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		body := func(extra map[string]any) string {
			if strings.Contains(path, "chat") {
				return chatBody(t, extra, "stop somewhere")
			}
			return complBody(t, extra, "stop somewhere")
		}
		full := unaryChoices(t, ts, path, body(map[string]any{"max_tokens": 40, "n": 3}))
		// A word of choice 1 that choice 0 does not hold.
		stop := ""
		for _, w := range strings.Fields(full.Choices[1].Text)[1:] {
			if w = " " + w; !strings.Contains(full.Choices[0].Text, w) && strings.Index(full.Choices[1].Text, w)+len(w) < 40 {
				stop = w
				break
			}
		}
		if stop == "" {
			t.Fatalf("%s: no word of choice 1 is missing from choice 0: %+v", path, full.Choices)
		}
		var want []choiceOut
		tokens := 0
		for _, c := range full.Choices {
			if i := strings.Index(c.Text, stop); i >= 0 {
				want = append(want, choiceOut{Text: c.Text[:i], Finish: "stop", Stop: stop})
				tokens += i + len(stop)
			} else {
				want = append(want, c)
				tokens += 40
			}
		}
		for _, stream := range []bool{false, true} {
			extra := map[string]any{"max_tokens": 40, "n": 3, "stop": []any{stop}}
			var got nAnswer
			if stream {
				extra["stream"], extra["stream_options"] = true, map[string]any{"include_usage": true}
				got = streamChoices(t, ts, path, body(extra))
			} else {
				got = unaryChoices(t, ts, path, body(extra))
			}
			if got.Complete != tokens || len(got.Choices) != 3 {
				t.Fatalf("%s stream=%v stop %q: %d completion tokens, want %d: %+v", path, stream, stop, got.Complete, tokens, got)
			}
			for i := range want {
				if got.Choices[i] != want[i] {
					t.Fatalf("%s stream=%v stop %q choice %d:\ngot  %+v\nwant %+v", path, stream, stop, i, got.Choices[i], want[i])
				}
			}
		}
	}
}

// TestChoicesToolCalls: every choice of a triggered tool call is a call,
// with its own id, unary and streamed.
func TestChoicesToolCalls(t *testing.T) {
	ts := startSim(t, nil)
	tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "lookup", "parameters": map[string]any{}}}}
	want := choiceOut{Finish: "tool_calls", Tool: "lookup" + ToolArguments}
	for _, stream := range []bool{false, true} {
		extra := map[string]any{"max_tokens": 8, "n": 2, "tools": tools}
		var got nAnswer
		if stream {
			extra["stream"], extra["stream_options"] = true, map[string]any{"include_usage": true}
			got = streamChoices(t, ts, "/v1/chat/completions", chatBody(t, extra, "please "+ToolTrigger))
		} else {
			got = unaryChoices(t, ts, "/v1/chat/completions", chatBody(t, extra, "please "+ToolTrigger))
		}
		if len(got.Choices) != 2 || got.Complete != 16 {
			t.Fatalf("stream=%v: %+v", stream, got)
		}
		for i, c := range got.Choices {
			if c != want {
				t.Fatalf("stream=%v choice %d: %+v, want %+v", stream, i, c, want)
			}
		}
	}
}

// TestChoicesTimed: through the timed step loop, with fewer batch slots
// than choices (the last choice waits for a slot), a streamed n=3 answer
// completes with every choice; the scheduler counts each choice as a
// sequence.
func TestChoicesTimed(t *testing.T) {
	ts := startSim(t, func(c *config.Sim) {
		c.TimeScale = 0.01
		c.MaxNumSeqs = 2
	})
	body := complBody(t, map[string]any{"max_tokens": 12, "n": 3, "stream": true, "stream_options": map[string]any{"include_usage": true}}, "timed")
	st := streamChoices(t, ts, "/v1/completions", body)
	if len(st.Choices) != 3 || st.Complete != 36 {
		t.Fatalf("%+v", st)
	}
	for i, c := range st.Choices {
		if len(c.Text) != 12 || c.Finish != "length" {
			t.Fatalf("choice %d: %+v", i, c)
		}
	}
	got := unaryChoices(t, ts, "/v1/completions", complBody(t, map[string]any{"max_tokens": 12, "n": 3}, "timed"))
	for i := range got.Choices {
		if got.Choices[i] != st.Choices[i] {
			t.Fatalf("choice %d: unary %+v, streamed %+v", i, got.Choices[i], st.Choices[i])
		}
	}
	// The counters are published after the step that finished the last
	// choice, possibly after its answer went out.
	testkit.Eventually(t, "6 sequences, 72 tokens, no blocks held", func() bool {
		m := ts.metrics(t)
		return m["vllm:request_success_total"].value == 6 && m["vllm:generation_tokens_total"].value == 72 && m["vllm:kv_cache_usage_perc"].value == 0
	})
}

// TestChoicesDisconnectFreesAll: a client leaving an n=3 stream frees
// every choice's slot and blocks.
func TestChoicesDisconnectFreesAll(t *testing.T) {
	ts := startSim(t, func(c *config.Sim) { c.TimeScale = 0.2 })
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp := ts.stream(t, ctx, "/v1/chat/completions", chatBody(t, map[string]any{"max_tokens": 4000, "n": 3, "stream": true}, "bye"))
	r := &sseReader{r: newBufReader(resp.Body)}
	for i := range 7 {
		if _, err := r.next(); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	// Every choice runs: the three sequences may reach the scheduler in
	// different rounds and the gauge is published after a round, so the
	// first events can come before it counts all three.
	testkit.Eventually(t, "3 running while streaming n=3", func() bool { return ts.gauge(t, "vllm:num_requests_running") == 3 })
	cancel()
	resp.Body.Close()
	testkit.Eventually(t, "running back to 0", func() bool { return ts.gauge(t, "vllm:num_requests_running") == 0 })
	m := ts.metrics(t)
	if m["vllm:request_success_total"].value != 0 || m["vllm:kv_cache_usage_perc"].value != 0 {
		t.Errorf("choices not aborted: success %v usage %v", m["vllm:request_success_total"].value, m["vllm:kv_cache_usage_perc"].value)
	}
}

// TestChoicesHFTokenizer: with a Hugging Face tokenizer each choice has
// max_tokens model tokens, streamed one model token per chunk.
func TestChoicesHFTokenizer(t *testing.T) {
	dir := toyTokenizerDir(t)
	tok, err := tokenizer.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ts := startSim(t, func(c *config.Sim) { c.Tokenizer = dir })
	body := func(extra map[string]any) string { return complBody(t, extra, "the theme then the theme") }
	one := unaryChoices(t, ts, "/v1/completions", body(map[string]any{"max_tokens": 9}))
	got := unaryChoices(t, ts, "/v1/completions", body(map[string]any{"max_tokens": 9, "n": 2}))
	if len(got.Choices) != 2 || got.Choices[0] != one.Choices[0] || got.Choices[0].Text == got.Choices[1].Text || got.Complete != 18 {
		t.Fatalf("n=1 %+v, n=2 %+v", one, got)
	}
	for i, c := range got.Choices {
		if n := len(tok.Encode(c.Text)); n != 9 {
			t.Fatalf("choice %d %q is %d tokens", i, c.Text, n)
		}
	}
	st := streamChoices(t, ts, "/v1/completions", body(map[string]any{"max_tokens": 9, "n": 2, "stream": true}))
	if len(st.Order) != 18 || st.Choices[0] != got.Choices[0] || st.Choices[1] != got.Choices[1] {
		t.Fatalf("streamed %+v, unary %+v", st, got)
	}
}
