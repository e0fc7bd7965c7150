package sim

import (
	"encoding/json"
	"strings"
	"testing"
)

type choiceAnswer struct {
	Text    string
	Finish  string
	Stop    any
	Tokens  int
	Prompts int
}

// answerOf reads the first choice of a unary chat or completion answer.
func answerOf(t *testing.T, m map[string]any) choiceAnswer {
	t.Helper()
	c := m["choices"].([]any)[0].(map[string]any)
	var a choiceAnswer
	if msg, ok := c["message"].(map[string]any); ok {
		a.Text, _ = msg["content"].(string)
	} else {
		a.Text, _ = c["text"].(string)
	}
	a.Finish, _ = c["finish_reason"].(string)
	a.Stop = c["stop_reason"]
	u := m["usage"].(map[string]any)
	a.Tokens = int(u["completion_tokens"].(float64))
	a.Prompts = int(u["prompt_tokens"].(float64))
	return a
}

// streamAnswer joins a stream's text and reads its last finish and usage.
func streamAnswer(t *testing.T, ts *testSim, path, body string) choiceAnswer {
	t.Helper()
	resp := ts.stream(t, t.Context(), path, body)
	defer resp.Body.Close()
	events, err := readAllEvents(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var a choiceAnswer
	for _, ev := range events {
		if ev == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Text   string `json:"text"`
				Finish string `json:"finish_reason"`
				Stop   any    `json:"stop_reason"`
				Delta  struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("event %q: %v", ev, err)
		}
		for _, ch := range c.Choices {
			a.Text += ch.Text + ch.Delta.Content
			if ch.Finish != "" {
				a.Finish, a.Stop = ch.Finish, ch.Stop
			}
		}
		if c.Usage != nil {
			a.Tokens = c.Usage.CompletionTokens
		}
	}
	return a
}

// TestStopSequences: a stop string from the answer ends it there, unary and
// streamed, chat and completions: the text stops before the match,
// finish_reason "stop", stop_reason the matched string (the earliest of
// several), completion tokens up to the end of the match.
func TestStopSequences(t *testing.T) {
	ts := startSim(t, nil)
	for _, tc := range []struct {
		path string
		body func(extra map[string]any) string
	}{
		{"/v1/chat/completions", func(extra map[string]any) string { return chatBody(t, extra, "stop here please") }},
		{"/v1/completions", func(extra map[string]any) string { return complBody(t, extra, "stop here please") }},
	} {
		full := answerOf(t, ts.postJSON(t, tc.path, tc.body(map[string]any{"max_tokens": 40})))
		words := strings.Fields(full.Text)
		if full.Finish != "length" || full.Stop != nil || len(words) < 5 {
			t.Fatalf("%s without stop: %+v", tc.path, full)
		}
		// A word late in the answer and one earlier: the earlier one wins.
		late, early := " "+words[4]+" ", " "+words[2]
		at := strings.Index(full.Text, early)
		if i := strings.Index(full.Text, late); i >= 0 && i < at {
			late = "\u0000never"
		}
		stop := []any{late, early, "not in the answer"}
		got := answerOf(t, ts.postJSON(t, tc.path, tc.body(map[string]any{"max_tokens": 40, "stop": stop})))
		want := choiceAnswer{Text: full.Text[:at], Finish: "stop", Stop: early, Tokens: at + len(early), Prompts: full.Prompts}
		if got != want {
			t.Fatalf("%s stop %q:\ngot  %+v\nwant %+v", tc.path, stop, got, want)
		}
		st := streamAnswer(t, ts, tc.path, tc.body(map[string]any{"max_tokens": 40, "stop": stop, "stream": true, "stream_options": map[string]any{"include_usage": true}}))
		want.Prompts = 0
		if st != want {
			t.Fatalf("%s streamed stop:\ngot  %+v\nwant %+v", tc.path, st, want)
		}
		// A single string, and one that does not occur.
		if got := answerOf(t, ts.postJSON(t, tc.path, tc.body(map[string]any{"max_tokens": 40, "stop": early}))); got.Text != full.Text[:at] || got.Stop != early {
			t.Fatalf("%s stop string: %+v", tc.path, got)
		}
		if got := answerOf(t, ts.postJSON(t, tc.path, tc.body(map[string]any{"max_tokens": 40, "stop": "zzz"}))); got != full {
			t.Fatalf("%s unmatched stop: %+v, want %+v", tc.path, got, full)
		}
	}
	for _, body := range []string{`{"prompt":"x","stop":3}`, `{"prompt":"x","stop":[1]}`} {
		code, b := ts.post(t, "/v1/completions", body)
		if code != 400 {
			t.Fatalf("%s: %d %s", body, code, b)
		}
		checkEnvelope(t, b, 400, "BadRequestError")
	}
}
