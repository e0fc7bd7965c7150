package anthropic_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/infera/infera/anthropic"
	"github.com/infera/infera/jsonx"
)

// TestRequestMappings checks each mapping of AppendChatRequest on the
// decoded OpenAI body.
func TestRequestMappings(t *testing.T) {
	in := `{"model":"m","max_tokens":7,"temperature":0.5,"top_p":0.8,"top_k":3,"stream":true,
	"stop_sequences":["S"],"metadata":{"user_id":"u"},"system":[{"type":"text","text":"A"},{"type":"text","text":"B"}],
	"tools":[{"name":"t","description":"d","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"t","disable_parallel_tool_use":true},
	"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"tool_use","id":"i1","name":"t","input":{"a":1}}]},
	{"role":"user","content":[{"type":"tool_result","tool_use_id":"i1","content":"r"},{"type":"text","text":"next","cache_control":{"type":"ephemeral"}}]}]}`
	out, info, err := anthropic.AppendChatRequest(nil, []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if !info.Stream || info.CacheControl != 1 || info.CacheLong {
		t.Fatalf("info %+v", info)
	}
	var got struct {
		Model         string
		MaxTokens     int     `json:"max_tokens"`
		Temperature   float64 `json:"temperature"`
		TopP          float64 `json:"top_p"`
		TopK          int     `json:"top_k"`
		Stream        bool
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		Stop              []string
		User              string
		ParallelToolCalls *bool  `json:"parallel_tool_calls"`
		Retention         string `json:"prompt_cache_retention"`
		ToolChoice        struct {
			Type     string
			Function struct{ Name string }
		} `json:"tool_choice"`
		Tools []struct {
			Type     string
			Function struct {
				Name, Description string
				Parameters        map[string]any
			}
		}
		Messages []struct {
			Role       string
			Content    *string
			ToolCallID string `json:"tool_call_id"`
			ToolCalls  []struct {
				ID, Type string
				Function struct{ Name, Arguments string }
			} `json:"tool_calls"`
		}
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	m := got.Messages
	switch {
	case got.Model != "m", got.MaxTokens != 7, got.Temperature != 0.5, got.TopP != 0.8, got.TopK != 3:
		t.Errorf("sampling fields: %s", out)
	case !got.Stream || !got.StreamOptions.IncludeUsage:
		t.Errorf("stream must ask for usage: %s", out)
	case len(got.Stop) != 1 || got.Stop[0] != "S", got.User != "u":
		t.Errorf("stop/user: %s", out)
	case got.ParallelToolCalls == nil || *got.ParallelToolCalls:
		t.Errorf("disable_parallel_tool_use: %s", out)
	case got.ToolChoice.Type != "function" || got.ToolChoice.Function.Name != "t":
		t.Errorf("tool_choice: %s", out)
	case len(got.Tools) != 1 || got.Tools[0].Type != "function" || got.Tools[0].Function.Name != "t" || got.Tools[0].Function.Description != "d" || got.Tools[0].Function.Parameters["type"] != "object":
		t.Errorf("tools: %s", out)
	case got.Retention != "long":
		t.Errorf("cache_control: %s", out)
	case len(m) != 5 || m[0].Role != "system" || *m[0].Content != "A\nB" || m[1].Role != "user" || *m[1].Content != "q":
		t.Errorf("system/user: %s", out)
	case m[2].Role != "assistant" || m[2].Content != nil || len(m[2].ToolCalls) != 1 || m[2].ToolCalls[0].ID != "i1" || m[2].ToolCalls[0].Function.Name != "t" || m[2].ToolCalls[0].Function.Arguments != `{"a":1}`:
		t.Errorf("tool_use: %s", out)
	case m[3].Role != "tool" || m[3].ToolCallID != "i1" || *m[3].Content != "r" || m[4].Role != "user" || *m[4].Content != "next":
		t.Errorf("tool_result: %s", out)
	}
}

func TestRequestToolChoiceMappings(t *testing.T) {
	for choice, want := range map[string]string{`{"type":"auto"}`: `"tool_choice":"auto"`, `{"type":"any"}`: `"tool_choice":"required"`, `{"type":"none"}`: `"tool_choice":"none"`} {
		out, _, err := anthropic.AppendChatRequest(nil, []byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tool_choice":`+choice+`}`))
		if err != nil || !bytes.Contains(out, []byte(want)) || bytes.Contains(out, []byte("parallel_tool_calls")) {
			t.Errorf("%s: %s %v", choice, out, err)
		}
	}
	out, info, _ := anthropic.AppendChatRequest(nil, []byte(`{"model":"m","max_tokens":1,"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral","ttl":"1h"}}],"messages":[{"role":"user","content":"x"}]}`))
	if !info.CacheLong || !bytes.Contains(out, []byte(`"prompt_cache_retention":"1h"`)) {
		t.Errorf("one-hour cache_control: %s", out)
	}
}

func TestRequestErrors(t *testing.T) {
	for _, tc := range []struct {
		body string
		want error
		msg  string
	}{
		{`{`, jsonx.ErrSyntax, ""},
		{`[]`, anthropic.ErrInvalidRequest, "JSON object"},
		{`{"max_tokens":1,"messages":[]}`, anthropic.ErrInvalidRequest, "model"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}]}`, anthropic.ErrInvalidRequest, "max_tokens"},
		{`{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, anthropic.ErrInvalidRequest, "max_tokens"},
		{`{"model":"m","max_tokens":1,"messages":[]}`, anthropic.ErrInvalidRequest, "at least one"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"system","content":"x"}]}`, anthropic.ErrInvalidRequest, "role"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}]}`, anthropic.ErrUnsupported, "text-only"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`, anthropic.ErrUnsupported, "document"},
		{`{"model":"m","max_tokens":1,"tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"user","content":"x"}]}`, anthropic.ErrUnsupported, "server tools"},
		{`{"model":"m","max_tokens":1,"tools":[{"name":"f"}],"messages":[{"role":"user","content":"x"}]}`, anthropic.ErrInvalidRequest, "input_schema"},
		{`{"model":"m","max_tokens":1,"tool_choice":{"type":"sometimes"},"messages":[{"role":"user","content":"x"}]}`, anthropic.ErrInvalidRequest, "tool_choice"},
		{`{"model":"m","max_tokens":1,"stop_sequences":[1],"messages":[{"role":"user","content":"x"}]}`, anthropic.ErrInvalidRequest, "stop_sequences"},
		{`{"model":"m","max_tokens":1,"stream":"yes","messages":[{"role":"user","content":"x"}]}`, anthropic.ErrInvalidRequest, "stream"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result"}]}]}`, anthropic.ErrInvalidRequest, "tool_use_id"},
	} {
		_, _, err := anthropic.AppendChatRequest(nil, []byte(tc.body))
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %v containing %q", tc.body, err, tc.want, tc.msg)
		}
	}
}

func TestErrorEnvelope(t *testing.T) {
	for status, want := range map[int]string{400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
		404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 502: "api_error", 503: "overloaded_error", 529: "overloaded_error", 422: "invalid_request_error"} {
		if got := anthropic.ErrorType(status); got != want {
			t.Errorf("ErrorType(%d) = %s, want %s", status, got, want)
		}
	}
	if anthropic.Status(503) != 529 || anthropic.Status(404) != 404 {
		t.Error("Status: 503 must become 529, others stay")
	}
	got := string(anthropic.AppendError(nil, "not_found_error", `no "m"`))
	if got != `{"type":"error","error":{"type":"not_found_error","message":"no \"m\""}}` {
		t.Errorf("AppendError: %s", got)
	}
	got = string(anthropic.AppendEngineError(nil, []byte(`{"error":{"message":"bad \"x\"","type":"BadRequestError","code":400}}`), 400))
	if got != `{"type":"error","error":{"type":"invalid_request_error","message":"bad \"x\""}}` {
		t.Errorf("AppendEngineError: %s", got)
	}
	got = string(anthropic.AppendEngineError(nil, []byte(`{"detail":"Not Found"}`), 404))
	if got != `{"type":"error","error":{"type":"not_found_error","message":"Not Found"}}` {
		t.Errorf("AppendEngineError detail: %s", got)
	}
	got = string(anthropic.AppendEngineError(nil, []byte("plain text"), 500))
	if got != `{"type":"error","error":{"type":"api_error","message":"plain text"}}` {
		t.Errorf("AppendEngineError text: %s", got)
	}
}

// TestStreamLargeEvent: an event far larger than any buffer (a long tool
// argument) is translated whole.
func TestStreamLargeEvent(t *testing.T) {
	big := strings.Repeat("x", 100<<10)
	in := `data: {"id":"chatcmpl-1","model":"m","choices":[{"index":0,"delta":{"content":"` + big + `"},"finish_reason":null}]}` + "\n\n"
	var s anthropic.Stream
	out := string(s.Event(nil, []byte(in)))
	if !strings.Contains(out, `"text_delta","text":"`+big+`"}}`) {
		t.Fatalf("large event not translated whole (%d bytes out)", len(out))
	}
}

// streamEvents is a text stream for the allocation test and benchmark.
func textEvent() []byte {
	return []byte(`data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
}

// TestStreamTextEventAlloc: a text event costs no allocation.
func TestStreamTextEventAlloc(t *testing.T) {
	var s anthropic.Stream
	ev := textEvent()
	dst := make([]byte, 0, 4096)
	dst = s.Event(dst[:0], ev) // message_start
	n := testing.AllocsPerRun(1000, func() { dst = s.Event(dst[:0], ev) })
	if n != 0 {
		t.Fatalf("Stream.Event allocates %.2f times per text event, want 0", n)
	}
	tool := []byte(`data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\""}}]},"finish_reason":null}]}` + "\n\n")
	if n := testing.AllocsPerRun(1000, func() { dst = s.Event(dst[:0], tool) }); n != 0 {
		t.Fatalf("Stream.Event allocates %.2f times per tool-argument event, want 0", n)
	}
}

// BenchmarkStreamEvent: the translation of one text event.
func BenchmarkStreamEvent(b *testing.B) {
	var s anthropic.Stream
	ev := textEvent()
	dst := s.Event(make([]byte, 0, 4096), ev)
	b.SetBytes(int64(len(ev)))
	b.ReportAllocs()
	for b.Loop() {
		dst = s.Event(dst[:0], ev)
	}
}

// FuzzChatRequest: any body either fails with a sentinel or translates
// into valid JSON.
func FuzzChatRequest(f *testing.F) {
	files, _ := os.ReadDir("testdata/requests")
	for _, e := range files {
		if b, err := os.ReadFile("testdata/requests/" + e.Name()); err == nil && !strings.Contains(e.Name(), ".golden") {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image"}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		out, _, err := anthropic.AppendChatRequest(nil, body)
		if err != nil {
			if !errors.Is(err, anthropic.ErrInvalidRequest) && !errors.Is(err, anthropic.ErrUnsupported) && !errors.Is(err, jsonx.ErrSyntax) {
				t.Fatalf("error without a sentinel: %v", err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("invalid JSON out of %q: %s", body, out)
		}
	})
}

// FuzzStreamEvent: any event sequence translates into well-formed
// Anthropic SSE events with JSON data.
func FuzzStreamEvent(f *testing.F) {
	files, _ := os.ReadDir("testdata/streams")
	for _, e := range files {
		if b, err := os.ReadFile("testdata/streams/" + e.Name()); err == nil && !strings.Contains(e.Name(), ".golden") {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var s anthropic.Stream
		out := translateStream(&s, in)
		for ev := range strings.SplitSeq(strings.TrimSuffix(string(out), "\n\n"), "\n\n") {
			if ev == "" {
				continue
			}
			lines := strings.Split(ev, "\n")
			if len(lines) != 2 || !strings.HasPrefix(lines[0], "event: ") || !strings.HasPrefix(lines[1], "data: ") {
				t.Fatalf("bad event %q", ev)
			}
			if !json.Valid([]byte(lines[1][len("data: "):])) {
				t.Fatalf("invalid JSON in %q", ev)
			}
		}
		if _, err := anthropic.AppendMessage(nil, in); err == nil {
			// A unary answer read from the same bytes is valid JSON too.
			out, _ := anthropic.AppendMessage(nil, in)
			if !json.Valid(out) {
				t.Fatalf("AppendMessage: invalid JSON %s", out)
			}
		}
	})
}
